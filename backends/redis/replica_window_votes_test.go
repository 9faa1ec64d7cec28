package redis

import (
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestReplicaSyncedBetweenChecksDoesNotVote: REPLICAOF does not close the
// node's client connections, so unlike a restart nothing on the batching
// writers' connections reveals it; the role is read only by the health
// checks. A node whose data a full sync replaced (A's lock on it gone)
// must not grant that lock to B before a check has seen it. Rows: the node
// is made a replica of an empty server and, once synced, a master again,
// all between two checks (read-only replicas, the default); and a
// writable replica (replica-read-only no), synced and still a replica.
// Either way B's LOCK used to be granted by nodes 1 and 2 while A held
// nodes 0 and 2 (node 2's copy of A's hold wiped by the sync).
func TestReplicaSyncedBetweenChecksDoesNotVote(t *testing.T) {
	tests := []struct {
		name     string
		writable bool // replica-read-only no; stays a replica
	}{
		{name: "replica and back between checks"},
		{name: "writable replica synced between checks", writable: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, rs := newRealBackend(t, 3, func(cfg *Config) {
				// Checks by hand: the window is the time between two.
				cfg.Quarantine, cfg.MaxTTL, cfg.CheckInterval = true, time.Minute, 0
			})
			other := harness.StartRedis(t, harness.RedisOptions{}) // empty
			ctx := ctxTimeout(t, 20*time.Second)
			// The full sync at once, not after diskless sync's 5 s delay.
			if err := other.Client(t).ConfigSet(ctx, "repl-diskless-sync-delay", "0").Err(); err != nil {
				t.Fatal(err)
			}
			checkAll := holdOnNodes02(t, ctx, b, rs)

			direct := rs[2].Client(t)
			if tt.writable {
				if err := direct.ConfigSet(ctx, "replica-read-only", "no").Err(); err != nil {
					t.Fatal(err)
				}
			}
			replicaOf(t, rs[2], other)
			waitFor(t, "node 2's full sync", func() bool {
				info := direct.Info(ctx, "replication").Val()
				return strings.Contains(info, "master_link_status:up")
			})
			if !tt.writable {
				replicaOf(t, rs[2], nil)
			}
			if v := direct.Exists(ctx, "lp:lock:k").Val(); v != 0 {
				t.Fatalf("node 2 still has A's lock key after the sync")
			}

			_, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "B", TTL: 30 * time.Second})
			if err == nil {
				t.Errorf("B was granted k while A holds it: node 2, whose data a sync replaced, voted before a check saw it")
			}
			checkAll()
			t.Logf("node states after the next check: %v", b.NodeStates())
		})
	}
}
