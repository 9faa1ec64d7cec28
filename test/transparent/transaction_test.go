package transparent

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestTransactionWithoutUpstreamRunsNothing: with no upstream Redis,
// lockproxy has nowhere to run a transaction, and answers as Redis does
// a transaction whose commands could not be queued: MULTI is +OK, each
// command in it is refused, EXEC answers EXECABORT, and nothing in it
// runs. MULTI used to be refused alone, and the SET NX PX after it (go-redis
// TxPipelined, a Spring template with transactions on) took the lock
// while its client was told the transaction failed. An empty
// transaction and DISCARD answer as Redis does, and the connection works
// as before once the transaction ended.
func TestTransactionWithoutUpstreamRunsNothing(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := e.client(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)

	_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.SetNX(ctx, "lock:tx", "t", 10*time.Second)
		return nil
	})
	if err == nil || !strings.HasPrefix(err.Error(), "EXECABORT") {
		t.Errorf("MULTI, SET NX PX on a lock key, EXEC: %v; want EXECABORT", err)
	}
	if n := e.present(t, "lock:tx"); n > 0 {
		t.Errorf("the refused transaction's SET NX PX left lock:tx on %d node(s); want none", n)
	}

	conn := c.Conn()
	defer conn.Close()
	steps := []struct {
		args []any
		want string // the reply's text, or the error's start
	}{
		{[]any{"MULTI"}, "OK"},
		{[]any{"EXEC"}, "[]"},
		{[]any{"MULTI"}, "OK"},
		{[]any{"MULTI"}, "ERR MULTI calls can not be nested"},
		{[]any{"SET", "lock:tx2", "v", "NX", "PX", "10000"}, "ERR 'set' is not queued"},
		{[]any{"DISCARD"}, "OK"},
		{[]any{"EXEC"}, "ERR EXEC without MULTI"},
		{[]any{"DISCARD"}, "ERR DISCARD without MULTI"},
		{[]any{"SET", "lock:tx2", "v", "NX", "PX", "10000"}, "OK"},
		{[]any{"MULTI"}, "OK"},
		{[]any{"PING"}, "ERR 'ping' is not queued"},
		{[]any{"EXEC"}, "EXECABORT"},
		{[]any{"PING"}, "PONG"},
		// Redis 7 refuses an EXEC with arguments and ends the
		// transaction: what follows runs.
		{[]any{"MULTI"}, "OK"},
		{[]any{"EXEC", "x"}, "EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' command"},
		{[]any{"PING"}, "PONG"},
		{[]any{"EXEC"}, "ERR EXEC without MULTI"},
	}
	for _, st := range steps {
		v, err := conn.Do(ctx, st.args...).Result()
		got := ""
		switch {
		case err != nil && !errors.Is(err, redis.Nil):
			got = err.Error()
		default:
			got = fmtReply(v)
		}
		if !strings.HasPrefix(got, st.want) {
			t.Errorf("%v: %q; want %q…", st.args, got, st.want)
		}
	}
	if n := e.holding(t, "lock:tx2", "v"); n != 3 {
		t.Errorf("SET NX PX after the transactions holds lock:tx2 on %d nodes; want 3", n)
	}
}

// fmtReply writes a reply the way the table above spells it.
func fmtReply(v any) string {
	if a, ok := v.([]any); ok {
		parts := make([]string, len(a))
		for i, x := range a {
			parts[i] = fmtReply(x)
		}
		return "[" + strings.Join(parts, " ") + "]"
	}
	return fmt.Sprint(v)
}
