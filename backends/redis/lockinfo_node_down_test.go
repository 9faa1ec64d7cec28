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
	b, rs := newRealBackend(t, 3)
	ctx := ctxTimeout(t, 60*time.Second)
	const key = "fd"

	b.nodes[1].health.setClockOut(true)
	b.nodes[2].health.setClockOut(true)
	for i := 0; i < 10; i++ {
		if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "Y", TTL: 20 * time.Second}); err == nil {
			t.Fatalf("Y's attempt %d granted on one node", i)
		}
	}
	b.nodes[1].health.setClockOut(false)
	b.nodes[2].health.setClockOut(false)

	rs[0].Pause()
	l, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "T", TTL: 20 * time.Second})
	rs[0].Resume()
	if err != nil {
		t.Fatal(err)
	}
	// Wait for node 1's late grant to land.
	c1 := rs[0].Client(t)
	for c1.Get(ctx, "lp:lock:"+key).Val() != "T" {
		if ctx.Err() != nil {
			t.Fatal("node 1 never granted T")
		}
		time.Sleep(5 * time.Millisecond)
	}

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

	if ok, err := b.Unlock(ctx, key, "T"); !ok || err != nil {
		t.Fatalf("T's release = %v, %v", ok, err)
	}
	b.nodes[0].health.setClockOut(true)
	next, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "U", TTL: 20 * time.Second})
	b.nodes[0].health.setClockOut(false)
	if err != nil {
		t.Fatal(err)
	}
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
