package transparent

import (
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestWatchTransactionLongCommandDoesNotHalfRun: a lock-key transaction
// is one script on each node, which calls each queued command with Lua's
// unpack; a command naming a watched key thousands of times (EXISTS k k
// …, DEL k k …) or repeating PEXPIRE's option that often went past what
// unpack takes ("too many results to unpack") after the commands before
// it had run: EXEC answered the script's error while a DEL queued before
// had released the lock on every node. Such a command is refused when
// queued now, and EXEC aborts with the lock still held.
func TestWatchTransactionLongCommandDoesNotHalfRun(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := e.client(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)
	const key, tok = "lock:long", "tok-1"
	if ok, err := c.SetNX(ctx, key, tok, 20*time.Second).Result(); err != nil || !ok {
		t.Fatalf("SET NX PX: %v %v", ok, err)
	}
	e.requireOnEveryNode(t, "the lock", key)
	exists := []string{"EXISTS"}
	pexpire := []string{"PEXPIRE", key, "10000"}
	for range 9000 {
		exists = append(exists, key)
		pexpire = append(pexpire, "XX")
	}
	r := dialRaw(t, e.addr)
	for _, long := range [][]string{exists, pexpire} {
		for _, st := range []struct {
			args []string
			want string
		}{
			{[]string{"WATCH", key}, "+OK\r\n"},
			{[]string{"MULTI"}, "+OK\r\n"},
			{[]string{"DEL", key}, "+QUEUED\r\n"},
			{long, "-ERR transparent mode: a command queued in a transaction on lock keys takes at most 1024 arguments\r\n"},
			{[]string{"EXEC"}, "-EXECABORT Transaction discarded because of previous errors.\r\n"},
		} {
			if got := r.do(st.args...); got != st.want {
				t.Fatalf("%s … (%d arguments) = %q; want %q", strings.Join(st.args[:min(3, len(st.args))], " "), len(st.args), got, st.want)
			}
		}
		if n := e.holding(t, key, tok); n != 3 {
			t.Fatalf("after the aborted transaction with a %s of %d arguments, the lock is on %d of 3 nodes; want 3", long[0], len(long), n)
		}
	}
	// Up to the bound, the command runs as in Redis: EXISTS counts a key
	// each time it is named, DEL deletes it once.
	exists = exists[:1024]
	del := append([]string{"DEL"}, exists[1:]...)
	r.do("WATCH", key)
	r.do("MULTI")
	r.do(exists...)
	r.do(del...)
	if got := r.do("EXEC"); got != "*2\r\n:1023\r\n:1\r\n" {
		t.Fatalf("EXEC of EXISTS and DEL naming the key 1023 times = %q; want %q", got, "*2\r\n:1023\r\n:1\r\n")
	}
	e.requireGone(t, "after EXEC's DEL", key)
}
