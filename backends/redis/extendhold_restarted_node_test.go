package redis

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestExtendHoldIgnoresNodeRestartedDuringCall: the watchdog's renewal of
// a KEEPALIVE hold (holdNode.Extend) must not count the answer of a node
// that restarted, as a RENEW's (on the writers) and LOCKINFO's do not: its
// data may be a stale snapshot with the holder's key in it (here written
// by hand right after the restart), and a renewal it grants is not a
// vote. The restart is not seen by a check (none run) but by the call's
// own new connection (onConnect quarantines the node), after the call's
// check that the node may vote; before, the extend script then ran on the
// new server and its 1 was counted.
func TestExtendHoldIgnoresNodeRestartedDuringCall(t *testing.T) {
	b, rs := newRealBackend(t, 3, func(cfg *Config) {
		cfg.Quarantine, cfg.MaxTTL, cfg.CheckInterval = true, time.Minute, 0
	})
	ctx := ctxTimeout(t, 20*time.Second)
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "A", TTL: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	h := holdNode{n: b.nodes[2], mode: backends.Write}
	if ok, err := h.Extend(ctx, "k", "A", 30*time.Second); !ok || err != nil {
		t.Fatalf("extend before the restart = %v, %v; want true", ok, err)
	}
	rs[2].Restart()
	// The restarted server has the hold, as from a stale snapshot.
	if err := rs[2].Client(t).Set(context.Background(), "lp:lock:k", "A", 30*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	ok, err := h.Extend(ctx, "k", "A", 30*time.Second)
	t.Logf("extend after node 2 restarted: %v, %v; quarantined: %v", ok, err, b.nodes[2].health.restarting())
	if !b.nodes[2].health.restarting() {
		t.Fatal("node 2's restart not seen")
	}
	if ok {
		t.Errorf("extend on node 2 right after its restart = true, %v; want its answer not counted", err)
	}
}
