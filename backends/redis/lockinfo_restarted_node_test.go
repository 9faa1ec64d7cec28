package redis

import (
	"errors"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// TestLockInfoIgnoresNodeRestartedDuringRead: LOCKINFO must not count the
// answer of a node that restarted empty (README, Safety: it "answers
// -NOQUORUM rather than 'free' when failed nodes leave it undecided"). A
// restart not yet seen by a check is revealed by LockState's own new
// connection (onConnect quarantines the node), but the info script then
// ran on the new, empty server and its "free" was counted: with A's hold
// on nodes 0 and 2 of three and node 2 restarted, LOCKINFO said the key
// was free, though node 2 is out and node 1 alone cannot tell.
func TestLockInfoIgnoresNodeRestartedDuringRead(t *testing.T) {
	b, rs := newRealBackend(t, 3, func(cfg *Config) {
		cfg.Quarantine, cfg.MaxTTL, cfg.CheckInterval = true, time.Minute, 0
	})
	ctx := ctxTimeout(t, 20*time.Second)
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "A", TTL: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	// A holds exactly a majority: nodes 0 and 2.
	if err := rs[1].Client(t).Del(ctx, "lp:lock:k", "lp:lockf:k", "lp:lockm:k").Err(); err != nil {
		t.Fatal(err)
	}
	if info, held, err := b.Info(ctx, "k"); err != nil || !held || info.Holders[0].Token != "A" {
		t.Fatalf("LOCKINFO before the restart = %+v, %v, %v; want held by A", info, held, err)
	}
	rs[2].Restart()

	info, held, err := b.Info(ctx, "k")
	t.Logf("LOCKINFO after node 2 restarted: %+v, held %v, %v; node 2 quarantined: %v",
		info, held, err, b.nodes[2].health.restarting())
	if !b.nodes[2].health.restarting() {
		t.Fatal("node 2's restart not seen")
	}
	if err == nil && !held {
		t.Errorf("LOCKINFO = free while A holds the key on node 0 and node 2 restarted; want -NOQUORUM")
	}
	if err != nil && !errors.Is(err, quorum.ErrNoQuorum) {
		t.Errorf("LOCKINFO = %v; want a no-quorum error", err)
	}
}
