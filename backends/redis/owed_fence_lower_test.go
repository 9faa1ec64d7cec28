package redis

import (
	"strconv"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
)

// TestOwedFenceWriteKeepsRaisedFence: a writer's fence write (the node's
// own fence, 12) and, behind it on the same connection, the quorum's raise
// of the same grant to a higher fence (14) both run on the node, but their
// answers are lost (a slow node): the writer kills the connection and owes
// the fence write. Written again after the kill, the owed fence write must
// not lower the hold's stored fence below the raise's: a reentrant grant
// answers the stored fence, and a majority-less HoldFence takes the
// highest stored one, so the lower value changes what reentrant LOCK
// answers (12 with a node whose own fence write failed, 14 before).
func TestOwedFenceWriteKeepsRaisedFence(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 10*time.Second)
	const key, token = "k", "T"
	req := quorum.Request{Key: key, Token: token, TTL: 10 * time.Second}
	g, err := n.Acquire(ctx, req)
	if err != nil || !g.Acquired {
		t.Fatalf("Acquire = %+v, %v", g, err)
	}
	own := int64(g.Fence)
	raised := own + 2
	if ok, err := n.RaiseFence(ctx, key, token, uint64(raised)); !ok || err != nil {
		t.Fatalf("RaiseFence = %v, %v", ok, err)
	}
	for i := 0; direct.Get(ctx, "lp:lockf:"+key).Val() != formatFence(raised, token); i++ {
		if i == 200 {
			t.Fatalf("lockf %q; want the raise's", direct.Get(ctx, "lp:lockf:"+key).Val())
		}
		time.Sleep(10 * time.Millisecond)
	}

	// The connection that carried both was dropped and is owed a kill
	// (of a connection of another run here: only the fence write goes out).
	o := &owed{}
	now := time.Now()
	fences := unansweredFences{{base: key, token: token, fence: own, slot: slot(key), start: now, ms: req.TTL.Milliseconds()}}
	o.lost(nil, fences, 99999, "gone-run", now)
	payDebtsDirect(t, n, r.Addr, o, now)

	if v := direct.Get(ctx, "lp:lockf:"+key).Val(); v != formatFence(raised, token) {
		t.Errorf("lockf after the owed fence write %q; want %q (the raise's, not lowered)", v, formatFence(raised, token))
	}
	g, err = n.Acquire(ctx, req) // reentrant
	if err != nil || !g.Acquired || g.Holds != 2 {
		t.Fatalf("reentrant Acquire = %+v, %v", g, err)
	}
	if int64(g.Fence) != raised {
		t.Errorf("reentrant grant answers fence %d; want %d (the hold's raised fence)", g.Fence, raised)
	}
	// With the other granting node's stored fence missing (0): the grant.
	if f := quorum.HoldFence([]uint64{g.Fence, 0}, g.Counter, 2); int64(f) != raised {
		t.Errorf("HoldFence over this node and one with no lockf = %d; want %d", f, raised)
	}
}

func formatFence(f int64, token string) string {
	return strconv.FormatInt(f, 10) + "," + token
}
