package redis

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestFenceAboveRejoiningNodesCounter: a token's leftover hold on one node
// (an earlier attempt whose grant answer was lost, so no fence stored with
// it, and whose roll-back did not reach the node) makes that node answer a
// later attempt of the token as a reentrant grant with fence 0. When only a
// minority answers so, the grant is a new one and must get a fence above
// every earlier holder's, which that node's counter alone may carry: here
// the other node that granted never saw the earlier holder's grants.
func TestFenceAboveRejoiningNodesCounter(t *testing.T) {
	rs := harness.StartRedisN(t, 3, harness.RedisOptions{})
	var nodes []quorum.Node
	for _, r := range rs {
		nodes = append(nodes, newTestNode(t, r))
	}
	q, err := quorum.New(nodes, quorum.Config{DriftFactor: 0.01, DriftMin: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxTimeout(t, 30*time.Second)
	const key = "foo"

	// B is granted the key ten times while node 1 is out of quorums: the
	// counters of nodes 2 and 3 reach B's last fence, node 1's stays 0.
	n1 := nodes[0].(*Node)
	n1.health.setClockOut(true)
	var fenceB uint64
	for i := 0; i < 10; i++ {
		l, err := q.Acquire(ctx, quorum.Request{Key: key, Token: "B", TTL: 10 * time.Second})
		if err != nil {
			t.Fatalf("B's grant %d: %v", i, err)
		}
		fenceB = l.Fence
		if ok, err := q.Release(ctx, key, "B", 10*time.Second); !ok || err != nil {
			t.Fatalf("B's release %d = %v, %v", i, ok, err)
		}
	}
	n1.health.setClockOut(false)

	// A's leftover hold on node 3, without its fence; node 2 refuses A
	// (another token's leftover there). Node 2 must answer: were it down,
	// it could hold A's hold too, and the attempt would be undecided
	// (TestReentryOnMinorityWithFailedNodesKeepsHold).
	if err := rs[2].Client(t).Set(ctx, "lp:lock:"+key, "A", 20*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rs[1].Client(t).Set(ctx, "lp:lock:"+key, "C", 20*time.Second).Err(); err != nil {
		t.Fatal(err)
	}

	l, err := q.Acquire(ctx, quorum.Request{Key: key, Token: "A", TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("A's grant: %v", err)
	}
	if l.Fence <= fenceB {
		t.Errorf("A's fence %d after B's %d; want it higher", l.Fence, fenceB)
	}
	// Node 3 stores A's fence with the hold, as a majority must.
	v, err := rs[2].Client(t).Get(ctx, "lp:lockf:"+key).Result()
	if err != nil || v == "" {
		t.Errorf("node 3's lockf = %q, %v; want A's fence stored", v, err)
	}
}
