package redis

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// TestRenewOfDowngradeCountsWriteHolds: writer B missed node 1 (out of the
// vote), downgraded on all three nodes (node 1 a read hold afresh, nodes 2
// and 3 a read hold beside the write hold), and RENEWs while node 3 is
// out. Node 1 renews B's read hold, node 2 its write hold: counted alike,
// RENEW told B 9.9 s for its write hold, and once node 3's lease ended a
// reader was granted the key on nodes 1 and 3. The write hold was renewed
// on node 2 alone, and node 3 may hold it: the renewal is undecided
// (NOQUORUM), and whatever it answered, no reader is let in while a
// validity B was told for its write hold lasts.
func TestRenewOfDowngradeCountsWriteHolds(t *testing.T) {
	const key = "renew-dg"
	lease := time.Second
	b, ctx, renewed, err := downgradeRenewedOnNodes12(t, key, lease)
	var nq *quorum.NoQuorumError
	if err != nil && !errors.As(err, &nq) {
		t.Fatalf("B's renewal = %v; want a validity or NOQUORUM", err)
	}
	told := time.Now().Add(renewed)
	time.Sleep(lease + 100*time.Millisecond) // node 3's lease ends

	if r, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "R", TTL: time.Second, Mode: backends.Read}); err == nil && time.Now().Before(told) {
		t.Errorf("reader R granted (%+v) while B's RENEW told its write hold %v of validity (%v left)", r, renewed, time.Until(told))
	}
}

// downgradeRenewedOnNodes12 sets up B's downgrade with a hole in it on
// three real nodes: B's write grant (lease) misses node 1 (out for its
// clock), its RLOCK then takes a read hold on all three (node 1 afresh,
// nodes 2 and 3 beside the write hold), and its RENEW to 10 s runs while
// node 3 is out: node 1 renews B's read hold, node 2 its write hold, and
// node 3 keeps lease. It returns the backend, the test's context and
// what the RENEW answered.
func downgradeRenewedOnNodes12(t *testing.T, key string, lease time.Duration) (*Backend, context.Context, time.Duration, error) {
	t.Helper()
	// The first grant dials the nodes: a short lease's node timeout (5 %)
	// is too short for that on a loaded host.
	b, _ := newRealBackend(t, 3, func(c *Config) { c.Quorum.TimeoutMin = 200 * time.Millisecond })
	ctx := ctxTimeout(t, 30*time.Second)
	b.nodes[0].health.setClockOut(true)
	if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "B", TTL: lease}); err != nil {
		t.Fatalf("B's write grant on nodes 2 and 3: %v", err)
	}
	b.nodes[0].health.setClockOut(false)
	if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "B", TTL: lease, Mode: backends.Read}); err != nil {
		t.Fatalf("B's downgrade: %v", err)
	}
	b.nodes[2].health.setClockOut(true)
	renewed, err := b.Renew(ctx, key, "B", 10*time.Second)
	b.nodes[2].health.setClockOut(false)
	return b, ctx, renewed, err
}
