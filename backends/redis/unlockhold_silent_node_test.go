package redis

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestUnlockHoldKeepsOtherOpsWithinNodeTimeout: a background release
// (UnlockHold: a KEEPALIVE lock whose connection closed, a grant whose
// client left, a late WAIT grant given back) may wait its whole bound for
// its turn on a node's writer, and its batch may take that long while the
// node answers on, but a node that says nothing for node_timeout_max is
// given up, as for any other batch: the operations queued behind it on a
// node that has gone silent (paused here, as behind a blackholed link)
// are answered within about two node timeouts, which the quorum's
// hear-out counts on. Before, the writer's batch waited for the release's
// whole 2 s bound, and a reentrant LOCK (which hears out every node), or
// any attempt that needed that node's answer, on any key (one writer per
// node by default), took about 2 s with one node of three silent.
func TestUnlockHoldKeepsOtherOpsWithinNodeTimeout(t *testing.T) {
	const timeout = 250 * time.Millisecond // node_timeout_max's default
	b, rs := newRealBackend(t, 3, nodeTimeouts(timeout))
	ctx := ctxTimeout(t, 30*time.Second)
	const key = "unlock-hold-silent"
	WarmUp(ctx, t, b, rs, "uhs-warm", 10*time.Second)
	lockOrFatal(t, b, backends.LockRequest{Key: key, Token: "t", TTL: 10 * time.Second})
	c2 := rs[2].Client(t)
	waitFor(t, "the hold on the third node", func() bool { return c2.Get(ctx, "lp:lock:"+key).Val() == "t" })

	rs[2].Pause()
	t.Cleanup(rs[2].Resume)
	released := make(chan struct{})
	go func() {
		defer close(released)
		// A token that holds nothing: the release finds nothing on the
		// two live nodes and waits for the silent one.
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, _ = b.UnlockHold(rctx, key, "gone", backends.Write)
	}()
	defer func() { <-released }()
	time.Sleep(50 * time.Millisecond) // the release is in flight on the silent node

	start := time.Now()
	l, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "t", TTL: 10 * time.Second})
	took := time.Since(start)
	if err != nil || l.Holds != 2 {
		t.Fatalf("reentrant LOCK with one node silent = %+v, %v after %v; want a second hold", l, err, took)
	}
	if limit := 2*timeout + 250*time.Millisecond; took > limit {
		t.Fatalf("reentrant LOCK with one node silent behind a background release answered after %v; want within %v (two node timeouts and slack)",
			took.Round(time.Millisecond), limit)
	}
}

// nodeTimeouts configures a newRealBackend's quorum and every node for a
// node timeout of timeout, as node_timeout_max does in production.
func nodeTimeouts(timeout time.Duration) func(*Config) {
	return func(c *Config) {
		c.Quorum.TimeoutMax = timeout
		for i := range c.Nodes {
			c.Nodes[i].Timeout = timeout
		}
	}
}
