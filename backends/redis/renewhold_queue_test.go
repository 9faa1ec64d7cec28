package redis

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestRenewHoldWaitsInTheQueueUpToItsDeadline: a KEEPALIVE watchdog's
// renewal (RenewHold) is not an acquisition: the validity it answers
// counts from when the nodes were asked, so it may wait for them as long
// as its caller's deadline (the end of the validity last answered)
// allows, not just the node timeout. Here 20,000 renewals are asked at
// once of nodes with a 20 ms node timeout, each with 20 s to answer: those
// at the back of the writers' queues wait past the node timeout, and must
// still be answered (here "not held": the keys are free). Before, they
// failed at the node timeout ("0/3 nodes: … timeout"), and on a host too
// busy to answer within it most KEEPALIVE locks were lost at once
// (commands TestKeepaliveRenewalsSurviveOverload). RenewHoldFrom's
// validity counts from when it was measured, within the lease.
func TestRenewHoldWaitsInTheQueueUpToItsDeadline(t *testing.T) {
	const (
		timeout = 20 * time.Millisecond
		n       = 20000
		ttl     = 10 * time.Second
	)
	b, rs := newRealBackend(t, 3, nodeTimeouts(timeout), func(c *Config) {
		c.Quorum.TimeoutMin = timeout
		for i := range c.Nodes {
			c.Nodes[i].Workers = 1
		}
	})
	ctx := ctxTimeout(t, 60*time.Second)
	WarmUp(ctx, t, b, rs, "rhq-warm", 10*time.Second)
	const key = "renew-hold-queue"
	lockOrFatal(t, b, backends.LockRequest{Key: key, Token: "t", TTL: ttl})

	var failed atomic.Int64
	var first atomic.Value
	var wg sync.WaitGroup
	asked := time.Now()
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for i := range n {
		wg.Go(func() {
			_, err := b.RenewHold(rctx, "rhq-free-"+itoa(int64(i)), "t", backends.Write, ttl)
			if err != nil && failed.Add(1) == 1 {
				first.Store(err)
			}
		})
	}
	// The held lock's renewal, asked now: the lease it sets begins
	// after this.
	renewed := time.Now()
	validity, from, err := b.RenewHoldFrom(rctx, key, "t", backends.Write, ttl)
	wg.Wait()
	took := time.Since(asked)
	if f := failed.Load(); f > 0 {
		t.Fatalf("%d of %d renewals asked at once failed within %v (node timeout %v, 20 s to answer); first: %v",
			f, n, took.Round(time.Millisecond), timeout, first.Load())
	}
	if err != nil || validity <= 0 {
		t.Fatalf("RenewHoldFrom of a held lock among them = %v, %v; want a validity", validity, err)
	}
	if from.Before(renewed) || from.After(time.Now()) {
		t.Errorf("validity counted from %v after asking; want between asking and the answer", from.Sub(renewed))
	}
	if end := from.Add(validity); end.After(renewed.Add(ttl)) {
		t.Errorf("validity ends %v after asking; want within the lease of %v", end.Sub(renewed), ttl)
	}
	t.Logf("%d renewals answered in %v", n+1, took.Round(time.Millisecond))
}
