package quorum_test

import (
	"context"
	"testing"
	"time"
)

// TestExtendWithinCallersDeadline: Extend gives the nodes no longer than
// its caller's deadline, when that comes before the node timeout. A
// KEEPALIVE watchdog renews with a deadline at the end of the validity it
// last answered (commands keepalives.renew): an answer after it comes too
// late to tell the holder of a loss before the lease may have ended, and
// a renewal that has not reached a majority by then must fail then, so
// that the loss is told. Before, the nodes got the whole node timeout
// (WithoutCancel dropped the caller's deadline), and a renewal 50 ms
// before that end, on nodes answering in 300 ms, answered a validity 250
// ms after it.
func TestExtendWithinCallersDeadline(t *testing.T) {
	checkGoroutines(t)
	const (
		ttl   = 10 * time.Second
		delay = 300 * time.Millisecond
		left  = 50 * time.Millisecond
	)
	nodes := makeNodes(t, 3, func(_ int, nd *fakeNode) { nd.delay = delay })
	cfg := defaultConfig()
	cfg.TimeoutMin, cfg.TimeoutMax = time.Second, time.Second
	q := newQuorum(t, cfg, nodes)
	ctx, cancel := context.WithTimeout(context.Background(), left)
	defer cancel()
	start := time.Now()
	got, err := q.Extend(ctx, req.Key, req.Token, ttl)
	took := time.Since(start)
	if err == nil || got != 0 {
		t.Errorf("Extend with %v left, nodes answering in %v = %v, %v after %v; want 0 and an error", left, delay, got, err, took)
	}
	if took > left+100*time.Millisecond {
		t.Errorf("Extend with %v left answered after %v; want by the caller's deadline", left, took.Round(time.Millisecond))
	}
}
