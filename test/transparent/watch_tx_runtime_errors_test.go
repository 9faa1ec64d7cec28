package transparent

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestWatchTransactionExpireErrorsAnsweredByExec: a PEXPIRE or EXPIRE of
// a watched lock key whose TTL or options Redis refuses (not an integer,
// an unknown or contradictory option, an invalid expire time) is queued,
// as Redis 7.0 queues it, and its error is its reply inside EXEC's array;
// the rest of the transaction runs. redis-server 7.0.15 answers the same
// sequence with these bytes. Before, each was refused when queued and
// EXEC answered EXECABORT, leaving the lock held. A TTL above
// locks.max_ttl, lockproxy's own limit, where Redis would have run the
// PEXPIRE, is still refused when queued, and EXEC aborts: a client that
// looks only at whether EXEC ran (StackExchange.Redis's LockExtend) must
// not take the lock for extended.
func TestWatchTransactionExpireErrorsAnsweredByExec(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := e.client(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)
	const key, tok = "lock:rterr", "tok-1"
	if ok, err := c.SetNX(ctx, key, tok, 20*time.Second).Result(); err != nil || !ok {
		t.Fatalf("SET NX PX: %v %v", ok, err)
	}
	e.requireOnEveryNode(t, "the lock", key)
	r := dialRaw(t, e.addr)
	for _, step := range []struct {
		args []string
		want string
	}{
		{[]string{"WATCH", key}, "+OK\r\n"},
		{[]string{"GET", key}, "$5\r\n" + tok + "\r\n"},
		{[]string{"MULTI"}, "+OK\r\n"},
		{[]string{"PEXPIRE", key, "abc"}, "+QUEUED\r\n"},
		{[]string{"PEXPIRE", key, "100", "FOO"}, "+QUEUED\r\n"},
		{[]string{"EXPIRE", key, "100", "NX", "XX"}, "+QUEUED\r\n"},
		{[]string{"PEXPIRE", key, "9223372036854775807"}, "+QUEUED\r\n"},
		{[]string{"DEL", key}, "+QUEUED\r\n"},
		// Below what Redis turns from s into ms: it was sent to the
		// nodes, where it failed the script after the DEL had run.
		{[]string{"EXPIRE", key, "-9223372036854775808"}, "+QUEUED\r\n"},
		{[]string{"EXEC"}, "*6\r\n" +
			"-ERR value is not an integer or out of range\r\n" +
			"-ERR Unsupported option FOO\r\n" +
			"-ERR NX and XX, GT or LT options at the same time are not compatible\r\n" +
			"-ERR invalid expire time in 'pexpire' command\r\n" +
			":1\r\n" +
			"-ERR invalid expire time in 'expire' command\r\n"},
	} {
		if got := r.do(step.args...); got != step.want {
			t.Fatalf("%q = %q; want %q", step.args, got, step.want)
		}
	}
	e.requireGone(t, "after EXEC's DEL", key)
	// Refused when queued, and EXEC aborts: a PEXPIRE without its TTL,
	// as in Redis, and one above locks.max_ttl.
	if ok, err := c.SetNX(ctx, key, tok, 20*time.Second).Result(); err != nil || !ok {
		t.Fatalf("SET NX PX again: %v %v", ok, err)
	}
	for _, q := range []struct {
		args []string
		want string
	}{
		{[]string{"PEXPIRE", key}, "-ERR wrong number of arguments for 'pexpire' command\r\n"},
		{[]string{"PEXPIRE", key, "3600000"}, "-ERR TTL 3600000 ms is above the maximum of 600000 ms (locks.max_ttl)\r\n"},
		// Far above, but within what Redis takes (its invalid expire
		// time is a TTL that overflows once added to the time).
		{[]string{"PEXPIRE", key, "9223372036854775"}, "-ERR TTL 9223372036854775 ms is above the maximum of 600000 ms (locks.max_ttl)\r\n"},
		{[]string{"EXPIRE", key, "4611686019"}, "-ERR TTL 4611686019000 ms is above the maximum of 600000 ms (locks.max_ttl)\r\n"},
	} {
		r.do("WATCH", key)
		r.do("MULTI")
		if got := r.do("DEL", key); got != "+QUEUED\r\n" {
			t.Fatalf("DEL in MULTI = %q", got)
		}
		if got := r.do(q.args...); got != q.want {
			t.Fatalf("%q in MULTI = %q; want %q", q.args, got, q.want)
		}
		if got := r.do("EXEC"); got != "-EXECABORT Transaction discarded because of previous errors.\r\n" {
			t.Fatalf("EXEC after %q = %q", q.args, got)
		}
	}
	e.requireHeld(t, "after the aborted transactions", key, tok)
}
