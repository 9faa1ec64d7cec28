package redis

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// TestEpochRestartRecreatedByOtherInstanceQuarantinedOnce: node 2 restarts
// empty and a second instance connects first, writing the new server's
// epoch. This instance sees the restart once (one restart counted, one
// quarantine, not a second for the epoch it then reads), and after the
// quarantine and re-seed node 2 votes again: with node 1's lock keys taken
// by someone else, only a voting node 2 makes B's majority.
func TestEpochRestartRecreatedByOtherInstanceQuarantinedOnce(t *testing.T) {
	b, rs := newRealBackend(t, 3, func(cfg *Config) {
		cfg.Quarantine, cfg.MaxTTL, cfg.CheckInterval = true, 200*time.Millisecond, 0
	})
	ctx := ctxTimeout(t, 20*time.Second)
	checkAll := func() {
		for i, n := range b.nodes {
			cctx, cancel := context.WithTimeout(ctx, checkTimeout)
			n.check(cctx)
			if n.health.seedDue() {
				_ = b.reseed(cctx, i)
			}
			cancel()
		}
	}
	checkAll()
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "w", Token: "A", TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	rs[2].Restart()
	other := newTestNode(t, rs[2])
	if g, err := other.Acquire(ctx, quorum.Request{Key: "x", Token: "O", TTL: time.Second}); err != nil || !g.Acquired {
		t.Fatalf("second instance's acquire: %+v, %v", g, err)
	}
	// This instance's writers meet the restart (closed connections), then
	// its checks; bounded.
	for i := 0; i < 3; i++ {
		_, _ = b.Lock(ctx, backends.LockRequest{Key: "w", Token: "A", TTL: time.Second})
	}
	checkAll()
	if st, _, restarts := b.nodes[2].State(); st != stateQuarantined || restarts != 1 {
		t.Fatalf("node 2 is %s with %d restarts; want %s, 1", st, restarts, stateQuarantined)
	}
	gen := b.nodes[2].health.gen.Load()
	deadline := time.Now().Add(10 * time.Second)
	for {
		checkAll()
		if st, _, _ := b.nodes[2].State(); st == stateOK {
			break
		}
		if time.Now().After(deadline) {
			st, left, _ := b.nodes[2].State()
			t.Fatalf("node 2 never re-admitted: %s, %v left", st, left)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if g := b.nodes[2].health.gen.Load(); g != gen {
		t.Errorf("node 2 was quarantined again (generation %d -> %d) after its restart's quarantine", gen, g)
	}
	for i := 0; i < 5; i++ {
		key := "k" + string(rune('a'+i))
		if err := rs[1].Client(t).Set(ctx, "lp:lock:"+key, "Z", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "B", TTL: time.Second}); err != nil {
			t.Fatalf("lock %d after node 2's re-admission: %v", i, err)
		}
	}
	if st, _, restarts := b.nodes[2].State(); st != stateOK || restarts != 1 {
		t.Errorf("node 2 is %s with %d restarts after voting again; want %s, 1", st, restarts, stateOK)
	}
}
