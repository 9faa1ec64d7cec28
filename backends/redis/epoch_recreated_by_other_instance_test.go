package redis

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// TestEpochRecreatedByOtherInstanceIsCaught: node 2 is flushed and a second
// lockproxy instance (its own Node on the same server) connects at once,
// writing a new epoch with its SET NX before this instance sends anything.
// This instance's next batch (kept connections), its next connection
// (connections killed), or its next check must still see another epoch, and
// quarantine node 2 once: B is not granted k while A holds it. The second
// instance itself keeps voting on its fresh connection's data: the flush
// happened before it saw the node.
func TestEpochRecreatedByOtherInstanceIsCaught(t *testing.T) {
	tests := []struct {
		name  string
		kill  bool
		check bool
	}{
		{name: "next batch on a kept connection"},
		{name: "next connection", kill: true},
		{name: "next check", check: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, rs := newRealBackend(t, 3, func(cfg *Config) {
				cfg.Quarantine, cfg.MaxTTL, cfg.CheckInterval = true, time.Minute, 0
			})
			ctx := ctxTimeout(t, 20*time.Second)
			checkAll := holdOnNodes02(t, ctx, b, rs)
			direct := rs[2].Client(t)
			before, err := direct.Get(ctx, "lp:epoch").Result()
			if err != nil {
				t.Fatal(err)
			}
			if err := direct.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if tt.kill {
				if err := direct.Do(ctx, "CLIENT", "KILL", "TYPE", "normal").Err(); err != nil {
					t.Fatal(err)
				}
			}
			other := newTestNode(t, rs[2])
			if g, err := other.Acquire(ctx, quorum.Request{Key: "x", Token: "O", TTL: time.Second}); err != nil || !g.Acquired {
				t.Fatalf("second instance's acquire: %+v, %v", g, err)
			}
			after, err := direct.Get(ctx, "lp:epoch").Result()
			if err != nil || after == before {
				t.Fatalf("epoch after the second instance connected: %q, %v (was %q)", after, err, before)
			}
			if tt.check {
				checkAll()
			}
			if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "B", TTL: 30 * time.Second}); err == nil {
				t.Errorf("B was granted k while A holds it: node 2's new epoch, written by another instance, was taken on")
			}
			if st, _, _ := b.nodes[2].State(); st != stateQuarantined {
				t.Errorf("node 2 is %s; want %s", st, stateQuarantined)
			}
			if st, _, _ := other.State(); st != stateOK {
				t.Errorf("second instance's node is %s; want %s", st, stateOK)
			}
		})
	}
}
