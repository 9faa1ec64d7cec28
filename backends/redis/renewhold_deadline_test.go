package redis

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestRenewHoldAnsweredByItsDeadline: a KEEPALIVE watchdog renews with a
// deadline at the end of the validity it last answered, so that a lock
// found gone is told before the lease may have ended and a rival been
// granted the key (commands keepalives.renew). Here the lock is gone (the
// token holds nothing): two nodes answer so at once, and the third node's
// writer is busy with a background release (UnlockHold: a closed
// connection's KEEPALIVE hold, up to 2 s) on a node gone silent, behind
// which the renewal waits. The answer of two nodes of three is the
// renewal's answer; the third, not in by the deadline, is a node that
// timed out. Before, the quorum waited for every node's answer past the
// caller's deadline (the writer answers a queued operation only when it
// gets to it, and a batch with a release in it may run to the release's
// deadline while the node answers on): the renewal answered "gone" about
// a node timeout late (up to the release's bound with a node slow but
// answering), and the watchdog told the loss that much after the
// validity it had last answered ended.
func TestRenewHoldAnsweredByItsDeadline(t *testing.T) {
	const timeout = 250 * time.Millisecond // node_timeout_max's default
	b, rs := newRealBackend(t, 3, nodeTimeouts(timeout))
	ctx := ctxTimeout(t, 30*time.Second)
	WarmUp(ctx, t, b, rs, "rhd-warm", 10*time.Second)
	const key = "renew-hold-deadline"

	rs[2].Pause()
	t.Cleanup(rs[2].Resume)
	released := make(chan struct{})
	go func() {
		defer close(released)
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, _ = b.UnlockHold(rctx, key, "closed", backends.Write)
	}()
	defer func() { <-released }()
	time.Sleep(50 * time.Millisecond) // the release is in flight on the silent node

	const left = 50 * time.Millisecond
	rctx, cancel := context.WithTimeout(ctx, left)
	defer cancel()
	start := time.Now()
	validity, err := b.RenewHold(rctx, key, "gone", backends.Write, 10*time.Second)
	took := time.Since(start)
	if validity != 0 {
		t.Fatalf("RenewHold of a token that holds nothing = %v, %v; want 0", validity, err)
	}
	if limit := left + 60*time.Millisecond; took > limit {
		t.Errorf("RenewHold with %v left answered %v, %v after %v; want by its deadline (within %v)",
			left, validity, err, took.Round(time.Millisecond), limit)
	}
}
