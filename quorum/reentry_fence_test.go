package quorum_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
)

// Found by a review of the quorum; each test failed before its fix.

// TestReentryFenceNotBelowInterveningGrant: a reentrant grant keeps
// the hold's fence only when no other holder can have been granted the key
// since. HoldFence's fallback (no majority stored one fence) took the
// highest *stored* fence and ignored the counter of a joined node that
// stored none, although that node's hold may be a re-grant made after the
// token's hold lapsed there and another holder was granted the key.
//
// History (N=3, need 2), consistent with the fake answers below:
//  1. T granted with fence 5 on n1, n2 (stored 5 on both).
//  2. T's hold lapses on n2 (a RENEW reached only n1); n1 keeps it.
//  3. X is granted on {n2, n3} with fence 6 (n2, n3 counters 6). X releases.
//  4. An attempt of T (another instance's LOCK … TOKEN T, or a failed one
//     whose roll-back is still owed) grants afresh on n2: counter 7; its
//     fence store is lost / not yet written, so n2 stores none (0).
//  5. Reentrant attempt of T: n1 joins (stored 5), n2 joins (stored 0,
//     counter 7), n3 grants afresh (counter 7).
//
// The grant in 5 is answered after X's grant (6) and must have a fence
// above 6 (DESIGN safety contract 2); HoldFence's own doc promises "at
// least that of any grant the token's nodes have seen" — n2 saw 6.
func TestReentryFenceNotBelowInterveningGrant(t *testing.T) {
	for _, tc := range []struct {
		name     string
		nodes    []fakeNode
		interven uint64 // fence of the grant made in between (X)
	}{
		{
			name: "N=3/joined 5 and 0(counter 7), fresh 7",
			nodes: []fakeNode{
				{holds: 2, fence: 5, counter: 5},
				{holds: 2, fence: 0, counter: 7},
				{holds: 1, fence: 7},
			},
			interven: 6,
		},
		{
			name: "N=3/joined 5 and 0(counter 7), third refuses",
			nodes: []fakeNode{
				{holds: 2, fence: 5, counter: 5},
				{holds: 2, fence: 0, counter: 7},
				{refuse: true},
			},
			interven: 6,
		},
		{
			name: "N=5/joined 5,5,0(counter 9), two fresh 9",
			nodes: []fakeNode{
				{holds: 2, fence: 5, counter: 5},
				{holds: 2, fence: 5, counter: 5},
				{holds: 2, fence: 0, counter: 9},
				{holds: 1, fence: 9},
				{holds: 1, fence: 9},
			},
			// n1, n2 alone are not a majority of 5: X held {n3,n4,n5}
			// with fence 8.
			interven: 8,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkGoroutines(t)
			nodes := makeNodes(t, len(tc.nodes), func(i int, nd *fakeNode) {
				w := &tc.nodes[i]
				nd.holds, nd.fence, nd.counter, nd.refuse = w.holds, w.fence, w.counter, w.refuse
			})
			q := newQuorum(t, defaultConfig(), nodes)
			lease, err := q.Acquire(context.Background(), quorum.Request{Key: "k", Token: "T", TTL: time.Second})
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			if lease.Fence <= tc.interven {
				t.Errorf("reentrant grant's fence %d; want > %d (the grant made on a joined node's counter "+
					"since the hold's fence was stored): fences went backwards", lease.Fence, tc.interven)
			}
		})
	}
}

// TestHoldFenceCoversUnstoredCounter is the same at the
// HoldFence level (also used by LOCKINFO, backends/redis/info.go:210).
func TestHoldFenceCoversUnstoredCounter(t *testing.T) {
	if f := quorum.HoldFence([]uint64{5, 0}, 7, 2); f < 7 {
		t.Errorf("HoldFence([5 0], counter 7, need 2) = %d; want >= 7 (the joined node that stored no fence "+
			"has seen grants up to its counter)", f)
	}
}

// TestExpiredBeforeSettlingIsExpired: the acquires alone used up the
// TTL (validity already gone), and a lagging node's raise finds the hold
// gone there (its lease ended): the answer should be ErrExpired (nil to
// the client, like any grant that ran out of time), not a NOQUORUM naming
// "hold lost", and no raise should be sent for a grant already dead.
func TestExpiredBeforeSettlingIsExpired(t *testing.T) {
	checkGoroutines(t)
	clk := newFakeClock()
	nodes := makeNodes(t, 3, func(i int, nd *fakeNode) {
		nd.clock, nd.advance = clk, 600*time.Millisecond
		nd.fence = 7
		if i == 1 {
			nd.fence, nd.raise = 5, raiseRefuse
		}
		if i == 2 {
			nd.refuse = true
		}
	})
	cfg := defaultConfig()
	cfg.Clock = clk
	q := newQuorum(t, cfg, nodes)
	_, err := q.Acquire(context.Background(), quorum.Request{Key: "k", Token: "T", TTL: time.Second, NoReentry: true})
	if !errors.Is(err, quorum.ErrExpired) {
		t.Errorf("Acquire = %v; want ErrExpired (validity was gone before the fence was settled)", err)
	}
	if r := nodes[1].ops("raise"); len(r) != 0 {
		t.Errorf("n2 got %d raises after the grant's validity had already ended; want 0", len(r))
	}
}
