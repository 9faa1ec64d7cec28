package redis

import (
	"errors"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// TestReentryOnMinorityWithFailedNodesKeepsHold: R holds the key on nodes
// 2 and 3 (node 1 was out of the vote), and its second LOCK/RLOCK … TOKEN R
// comes while node 3 is out: it joins R's hold on node 2 alone and is
// granted afresh on node 1. Granted so, the nodes' hold counts were
// 1, 2, 1, and the UNLOCK of one of R's two holds took the key on nodes 1
// and 3: W was granted the key while R still held it, with nearly 10 s
// of validity. Node 3 did not answer, so whether R's earlier hold is on a
// majority cannot be told: the attempt must not be granted (NOQUORUM, as
// UNLOCK answers when failed nodes leave it undecided), and R's holds
// left after its UNLOCKs (one fewer than its grants) keep W out.
func TestReentryOnMinorityWithFailedNodesKeepsHold(t *testing.T) {
	for _, mode := range []backends.Mode{backends.Write, backends.Read} {
		t.Run(mode.String(), func(t *testing.T) {
			b, _ := newRealBackend(t, 3)
			ctx := ctxTimeout(t, 30*time.Second)
			const key = "split"
			req := backends.LockRequest{Key: key, Token: "R", TTL: 10 * time.Second, Mode: mode}
			b.nodes[0].health.setClockOut(true)
			if _, err := b.Lock(ctx, req); err != nil {
				t.Fatalf("R's first grant, on nodes 2 and 3: %v", err)
			}
			b.nodes[0].health.setClockOut(false)
			b.nodes[2].health.setClockOut(true)
			grants := 1
			_, second := b.Lock(ctx, req)
			var nq *quorum.NoQuorumError
			switch {
			case second == nil:
				grants++
			case !errors.As(second, &nq):
				t.Fatalf("R's second attempt = %v; want a grant or NOQUORUM", second)
			}
			b.nodes[2].health.setClockOut(false)
			t.Logf("R's second attempt: %v", second)
			for i := 1; i < grants; i++ {
				if ok, err := b.Unlock(ctx, key, "R"); !ok || err != nil {
					t.Fatalf("UNLOCK %d of R = %v, %v", i, ok, err)
				}
			}
			if w, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "W", TTL: 10 * time.Second}); err == nil {
				t.Errorf("W granted (%+v) while R holds 1 of its %d holds (R's second attempt: %v)", w, grants, second)
			}
		})
	}
}
