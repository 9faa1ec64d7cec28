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
// comes while node 3 is out: it joins R's hold (or, for a downgrade, meets
// R's write hold) on node 2 alone and is granted afresh on node 1.
// Granted so, the nodes disagreed: a reentry left hold counts 1, 2, 1, and
// a downgrade a read hold on node 1 without the write hold, which UNLOCK,
// releasing write holds first, took there. The UNLOCK of one of R's two
// holds then took the key off nodes 1 and 3, and W was granted the key
// while R still held it, with nearly 10 s of validity. Node 3 did not
// answer, so whether R's earlier hold is on a majority cannot be told:
// the attempt must not be granted (NOQUORUM, as UNLOCK answers when failed
// nodes leave it undecided), and R's holds left after its UNLOCKs (one
// fewer than its grants) keep W out.
func TestReentryOnMinorityWithFailedNodesKeepsHold(t *testing.T) {
	for _, tc := range []struct {
		name          string
		first, second backends.Mode
	}{
		{"write reentry", backends.Write, backends.Write},
		{"read reentry", backends.Read, backends.Read},
		{"downgrade", backends.Write, backends.Read},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := newRealBackend(t, 3)
			ctx := ctxTimeout(t, 30*time.Second)
			const key = "split"
			req := backends.LockRequest{Key: key, Token: "R", TTL: 10 * time.Second, Mode: tc.first}
			b.nodes[0].health.setClockOut(true)
			if _, err := b.Lock(ctx, req); err != nil {
				t.Fatalf("R's first grant, on nodes 2 and 3: %v", err)
			}
			b.nodes[0].health.setClockOut(false)
			b.nodes[2].health.setClockOut(true)
			grants := 1
			req.Mode = tc.second
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
