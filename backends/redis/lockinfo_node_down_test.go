package redis

import (
	"errors"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// TestInfoFenceNodeDownUndecided: as in TestInfoFenceIsGrantsFence, T is
// granted on nodes 2 and 3 with their fence and node 1, late, stores its
// own higher one. With node 2 out, the nodes that answer (1 and 3) store
// different fences, either of which node 2 could make the majority's:
// LOCKINFO must answer NOQUORUM (or T's granted fence), not node 1's,
// above the fence the next holder, granted without node 1, gets.
func TestInfoFenceNodeDownUndecided(t *testing.T) {
	const key = "fd"
	b, _, ctx, l := grantBesideLateHigherFence(t, key)

	b.nodes[1].health.setClockOut(true) // node 2 does not answer
	info, held, infoErr := b.Info(ctx, key)
	b.nodes[1].health.setClockOut(false)
	var nq *quorum.NoQuorumError
	if infoErr != nil && !errors.As(infoErr, &nq) {
		t.Fatalf("LOCKINFO err = %v; want NOQUORUM or T's hold", infoErr)
	}
	if infoErr == nil && !held {
		t.Fatalf("LOCKINFO = free while T holds the key")
	}

	next := nextHolderWithoutNode1(ctx, t, b, key)
	if infoErr != nil {
		return // NOQUORUM: nothing shown to go back from
	}
	t.Logf("T granted fence %d; LOCKINFO with node 2 out: fence %d; U granted fence %d", l.Fence, info.Fence, next.Fence)
	if info.Fence != l.Fence {
		t.Errorf("LOCKINFO fence %d with node 2 out; T was granted fence %d", info.Fence, l.Fence)
	}
	if next.Fence <= info.Fence {
		t.Errorf("next holder U's fence %d <= the fence %d LOCKINFO showed for T: the fence went backwards", next.Fence, info.Fence)
	}
}

// TestInfoHoldsNodeDownUndecided: T holds the key on all three nodes and
// takes a second hold while node 3 is out, so the nodes count 2, 2 and 1
// holds: a majority holds two. With node 1 out, the answers (2 and 1)
// have the majority-th largest 1, an undercount, which the keepalive
// watchdogs rely on (holdsLeft): fewer holds left than a watchdog counts
// takes one of its KEEPALIVE holds off, and with its last stops renewing
// a hold still on the nodes. LOCKINFO must answer NOQUORUM or 2.
func TestInfoHoldsNodeDownUndecided(t *testing.T) {
	for _, mode := range []backends.Mode{backends.Write, backends.Read} {
		t.Run(mode.String(), func(t *testing.T) {
			b, _ := newRealBackend(t, 3)
			ctx := ctxTimeout(t, 30*time.Second)
			const key = "hd"
			req := backends.LockRequest{Key: key, Token: "T", TTL: 20 * time.Second, Mode: mode}
			if _, err := b.Lock(ctx, req); err != nil {
				t.Fatal(err)
			}
			// Let the grant land on all three nodes.
			for {
				info, held, err := b.Info(ctx, key)
				if err != nil || !held {
					t.Fatalf("LOCKINFO = %v, %v", held, err)
				}
				n := 0
				for _, nd := range b.nodes {
					if st, err := nd.LockState(ctx, key); err == nil && st.held {
						n++
					}
				}
				if n == 3 {
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("T not granted on all nodes: %+v", info)
				}
				time.Sleep(5 * time.Millisecond)
			}
			b.nodes[2].health.setClockOut(true)
			if _, err := b.Lock(ctx, req); err != nil {
				t.Fatalf("T's second hold, on nodes 1 and 2: %v", err)
			}
			b.nodes[2].health.setClockOut(false)

			b.nodes[0].health.setClockOut(true) // node 1 does not answer
			info, held, err := b.Info(ctx, key)
			b.nodes[0].health.setClockOut(false)
			var nq *quorum.NoQuorumError
			switch {
			case err != nil && !errors.As(err, &nq):
				t.Fatalf("LOCKINFO err = %v; want NOQUORUM or T's two holds", err)
			case err != nil:
				t.Logf("LOCKINFO with node 1 out: %v", err)
			case !held || len(info.Holders) != 1 || info.Holders[0].Token != "T":
				t.Fatalf("LOCKINFO = %+v, %v; want T", info, held)
			case info.Holders[0].Holds != 2:
				t.Errorf("LOCKINFO holds %d with node 1 out; T holds the key twice on nodes 1 and 2", info.Holders[0].Holds)
			}
			all, _, err := b.Info(ctx, key)
			if err != nil || len(all.Holders) != 1 || all.Holders[0].Holds != 2 {
				t.Fatalf("LOCKINFO with every node = %+v, %v; want T's two holds", all, err)
			}
		})
	}
}
