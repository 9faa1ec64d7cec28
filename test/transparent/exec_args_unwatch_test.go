package transparent

import (
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestExecWithArgumentsWithoutMultiUnwatches: redis-server 7.0.15 answers
// an EXEC with arguments outside MULTI as an aborted transaction,
// "-EXECABORT Transaction discarded because of: wrong number of arguments
// for 'exec' command", and drops the connection's WATCH (execCommandAbort
// discards the transaction state). So does lockproxy, for a WATCH of lock
// keys and, with an upstream, for one of the upstream's keys: after it
// the connection may watch the other kind. Before, the reply was the
// plain arity error and the watch stayed: a WATCH of the other kind was
// refused ("already watches"), and a lock-key EXEC still compared.
func TestExecWithArgumentsWithoutMultiUnwatches(t *testing.T) {
	t.Parallel()
	const abort = "-EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' command\r\n"
	withAndWithoutUpstream(t, func(t *testing.T, e *env, withUp bool) {
		c := e.client(t)
		ctx := lockclient.CtxFor(t, 30*time.Second)
		const key = "lock:xa"
		if ok, err := c.SetNX(ctx, key, "tok", 20*time.Second).Result(); err != nil || !ok {
			t.Fatalf("SET NX PX: %v %v", ok, err)
		}
		type step struct{ args, want string }
		seq := []step{
			{"EXEC x", abort},
			{"WATCH " + key, "+OK\r\n"},
			{"EXEC x", abort},
			{"MULTI", "+OK\r\n"},
			// Nothing watched: a lock-key command is not queued.
			{"GET " + key, "-ERR"},
			{"EXEC", "-EXECABORT Transaction discarded because of previous errors.\r\n"},
		}
		if withUp {
			seq = append(seq,
				step{"WATCH " + key, "+OK\r\n"},
				step{"EXEC x", abort},
				step{"WATCH plain", "+OK\r\n"},
				step{"EXEC x", abort},
				step{"WATCH " + key, "+OK\r\n"},
				step{"MULTI", "+OK\r\n"},
				step{"GET " + key, "+QUEUED\r\n"},
				step{"EXEC", "*1\r\n$3\r\ntok\r\n"},
			)
		}
		r := dialRaw(t, e.addr)
		for _, st := range seq {
			if got := r.do(strings.Fields(st.args)...); !strings.HasPrefix(got, st.want) {
				t.Fatalf("%s = %q; want %q…", st.args, got, st.want)
			}
		}
		e.requireHeld(t, "after the transactions", key, "tok")
	})
}
