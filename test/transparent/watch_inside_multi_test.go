package transparent

import (
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestWatchAndMultiInsideATransaction: in a transaction, a WATCH with
// keys and a MULTI without arguments are refused and leave it as it was,
// and a WATCH without keys or a MULTI with arguments is refused for its
// arity and aborts it, as redis-server 7.0.15 answers (the bytes below are
// its own), in a lock-key transaction, in a relayed MULTI on the upstream
// (a WATCH of lock keys there) and in a MULTI without an upstream. Before,
// a WATCH of lock keys in a relayed MULTI was refused as a lock-key
// command and aborted it; without an upstream any WATCH in a MULTI did;
// and the arity errors did not abort the transaction.
func TestWatchAndMultiInsideATransaction(t *testing.T) {
	t.Parallel()
	withAndWithoutUpstream(t, func(t *testing.T, e *env, withUp bool) {
		c := e.client(t)
		ctx := lockclient.CtxFor(t, 30*time.Second)
		const key = "lock:wim"
		if ok, err := c.SetNX(ctx, key, "tok", 20*time.Second).Result(); err != nil || !ok {
			t.Fatalf("SET NX PX: %v %v", ok, err)
		}
		e.requireOnEveryNode(t, "the lock", key)
		const (
			ok      = "+OK\r\n"
			queued  = "+QUEUED\r\n"
			nested  = "-ERR MULTI calls can not be nested\r\n"
			inside  = "-ERR WATCH inside MULTI is not allowed\r\n"
			aborted = "-EXECABORT Transaction discarded because of previous errors.\r\n"
		)
		arity := func(name string) string { return "-ERR wrong number of arguments for '" + name + "' command\r\n" }
		type step struct{ args, want string }
		seqs := map[string][]step{
			"lock-key transaction, refusals that leave it": {
				{"WATCH " + key, ok}, {"MULTI", ok}, {"GET " + key, queued},
				{"MULTI", nested}, {"WATCH " + key, inside},
				{"EXEC", "*1\r\n$3\r\ntok\r\n"},
			},
			"lock-key transaction, WATCH without keys": {
				{"WATCH " + key, ok}, {"MULTI", ok}, {"GET " + key, queued}, {"WATCH", arity("watch")}, {"EXEC", aborted},
			},
			"lock-key transaction, MULTI with an argument": {
				{"WATCH " + key, ok}, {"MULTI", ok}, {"GET " + key, queued}, {"MULTI x", arity("multi")}, {"EXEC", aborted},
			},
			"plain MULTI, WATCH of a lock key": {
				{"MULTI", ok}, {"WATCH " + key, inside}, {"MULTI", nested}, {"EXEC", "*0\r\n"},
			},
			"plain MULTI, WATCH without keys": {
				{"MULTI", ok}, {"WATCH", arity("watch")}, {"EXEC", aborted},
			},
			"plain MULTI, MULTI with an argument": {
				{"MULTI", ok}, {"MULTI x", arity("multi")}, {"EXEC", aborted},
			},
		}
		for name, seq := range seqs {
			r := dialRaw(t, e.addr)
			for _, st := range seq {
				if got := r.do(strings.Fields(st.args)...); got != st.want {
					t.Errorf("%s: %s = %q; want %q", name, st.args, got, st.want)
					break
				}
			}
		}
		e.requireHeld(t, "after the transactions", key, "tok")
	})
}
