package quorum_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
)

// TestAcquireReadFence: a read grant's fence is the highest counter among
// its granting nodes, and before the grant stands a majority must store a
// counter at least that high, so that any later write majority shares a
// node with it and gets a higher fence. The granting nodes below it are
// raised with RaiseReadFence (never RaiseFence, which would store the
// read fence as a write hold's); where they agree, nothing is raised (the
// common case stays one round trip). A raise that fails on too many nodes
// is NOQUORUM naming them, and the grant is rolled back (read holds only).
func TestAcquireReadFence(t *testing.T) {
	late := func() chan struct{} { return make(chan struct{}) }
	type node struct {
		fence  uint64
		refuse bool
		late   bool
		raise  raiseBehaviour
		holds  int64
		fail   bool
		delay  time.Duration
	}
	for _, tc := range []struct {
		name      string
		nodes     []node
		wantFence uint64
		wantErr   string         // a NoQuorumError text; "" for a lease
		wantRaise map[int]uint64 // node index → the fence RaiseReadFence was called with
	}{
		{
			name:      "N=3/20,0 (n3 late): lagging node raised",
			nodes:     []node{{fence: 20}, {fence: 0}, {fence: 0, late: true}},
			wantFence: 20,
			wantRaise: map[int]uint64{1: 20},
		},
		{
			name:      "N=3/7,7: agreeing majority, nothing raised",
			nodes:     []node{{fence: 7}, {fence: 7}, {fence: 3, late: true}},
			wantFence: 7,
		},
		{
			name:      "N=3/reentrant read grants are settled alike",
			nodes:     []node{{fence: 9, holds: 2}, {fence: 4, holds: 3}, {refuse: true}},
			wantFence: 9,
			wantRaise: map[int]uint64{1: 9},
		},
		{
			name:      "N=5/1,2,3: each lower node raised to the max",
			nodes:     []node{{fence: 1}, {fence: 2}, {fence: 3}, {refuse: true}, {refuse: true}},
			wantFence: 3,
			wantRaise: map[int]uint64{0: 3, 1: 3},
		},
		{
			name:      "N=3/raise refused: read hold gone",
			nodes:     []node{{fence: 7}, {fence: 5, raise: raiseRefuse}, {fence: 7, late: true}},
			wantErr:   "1/3 nodes: n2 hold lost before its fence was stored",
			wantRaise: map[int]uint64{1: 7},
		},
		{
			name:      "N=3/raise fails",
			nodes:     []node{{fence: 7}, {fence: 5, raise: raiseFail}, {refuse: true}},
			wantErr:   "1/3 nodes: n2 connection refused",
			wantRaise: map[int]uint64{1: 7},
		},
		{
			name:      "N=3/raise times out",
			nodes:     []node{{fence: 7}, {fence: 5, raise: raiseSlow}, {refuse: true}},
			wantErr:   "1/3 nodes: n2 timeout",
			wantRaise: map[int]uint64{1: 7},
		},
		{
			name: "N=3/raise fails, the other node failed to grant: both named",
			nodes: []node{{fence: 7, delay: 20 * time.Millisecond}, {fence: 5, raise: raiseFail, delay: 20 * time.Millisecond},
				{fail: true}},
			wantErr:   "1/3 nodes: n2 connection refused, n3 connection refused",
			wantRaise: map[int]uint64{1: 7},
		},
		{
			name:      "N=5/one of two lagging raises fails",
			nodes:     []node{{fence: 9}, {fence: 5}, {fence: 2, raise: raiseFail}, {refuse: true}, {refuse: true}},
			wantErr:   "2/5 nodes: n3 connection refused",
			wantRaise: map[int]uint64{1: 9, 2: 9},
		},
		{
			name:      "N=5/two lagging raises fail",
			nodes:     []node{{fence: 9}, {fence: 5, raise: raiseSlow}, {fence: 2, raise: raiseFail}, {refuse: true}, {refuse: true}},
			wantErr:   "1/5 nodes: n2 timeout, n3 connection refused",
			wantRaise: map[int]uint64{1: 9, 2: 9},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkGoroutines(t)
			nodes := makeNodes(t, len(tc.nodes), func(i int, nd *fakeNode) {
				c := tc.nodes[i]
				nd.fence, nd.refuse, nd.raise = c.fence, c.refuse, c.raise
				nd.holds, nd.delay = max(c.holds, 1), c.delay
				if c.fail {
					nd.err = errRefused
				}
				if c.late {
					nd.gate = late()
				}
			})
			q := newQuorum(t, defaultConfig(), nodes)
			r := req
			r.Mode = quorum.Shared
			start := time.Now()
			lease, err := q.Acquire(context.Background(), r)
			if limit := 10 * q.NodeTimeout(r.TTL); time.Since(start) > limit {
				t.Errorf("Acquire took %v; want at most %v", time.Since(start), limit)
			}
			if tc.wantErr != "" {
				checkNoQuorum(t, err, tc.wantErr)
				checkReleasedEverywhere(t, nodes, r.Key, r.Token)
				for _, nd := range nodes {
					for _, rel := range nd.ops("release") {
						if rel.hold != quorum.ReadHold {
							t.Errorf("%s: roll-back releases hold kind %d; want read holds only", nd.name, rel.hold)
						}
					}
				}
			} else {
				if err != nil {
					t.Fatalf("Acquire = %v; want a read lease with fence %d", err, tc.wantFence)
				}
				if lease.Fence != tc.wantFence {
					t.Errorf("Fence = %d; want %d", lease.Fence, tc.wantFence)
				}
				checkNotReleased(t, nodes)
			}
			for i, nd := range nodes {
				if w := nd.ops("raise"); len(w) != 0 {
					t.Errorf("%s: RaiseFence called %d times for a read grant; want never (RaiseReadFence)", nd.name, len(w))
				}
				raises := nd.ops("raise-read")
				want, ok := tc.wantRaise[i]
				switch {
				case !ok && len(raises) > 0:
					t.Errorf("%s: RaiseReadFence called %d times (fence %d); want never", nd.name, len(raises), raises[0].fence)
				case ok && len(raises) != 1:
					t.Errorf("%s: RaiseReadFence called %d times; want once", nd.name, len(raises))
				case ok && raises[0].fence != want:
					t.Errorf("%s: RaiseReadFence(fence %d); want %d", nd.name, raises[0].fence, want)
				case ok && (raises[0].key != r.Key || raises[0].token != r.Token):
					t.Errorf("%s: RaiseReadFence(%q, %q); want (%q, %q)", nd.name, raises[0].key, raises[0].token, r.Key, r.Token)
				}
			}
		})
	}
}

// plainNode is a Node that cannot raise a read grant's fence (no
// ReadFenceRaiser): its answers are fakeNode's.
type plainNode struct{ f *fakeNode }

func (n plainNode) Name() string { return n.f.Name() }
func (n plainNode) Acquire(ctx context.Context, r quorum.Request) (quorum.NodeGrant, error) {
	return n.f.Acquire(ctx, r)
}
func (n plainNode) RaiseFence(ctx context.Context, key, token string, fence uint64) (bool, error) {
	return n.f.RaiseFence(ctx, key, token, fence)
}
func (n plainNode) Release(ctx context.Context, key, token string, hold quorum.Hold) (bool, error) {
	return n.f.Release(ctx, key, token, hold)
}
func (n plainNode) Extend(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	return n.f.Extend(ctx, key, token, ttl)
}

// TestAcquireReadFenceNodeWithoutRaise: a node that cannot raise a read
// grant's fence counts as failing to (its RaiseFence, for write holds, is
// never used for a read grant), and a read grant whose nodes agree needs
// no raise at all.
func TestAcquireReadFenceNodeWithoutRaise(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fences  []uint64
		wantErr string
	}{
		{"agreeing", []uint64{4, 4, 4}, ""},
		{"disagreeing", []uint64{4, 2, 2}, "1/3 nodes: n2 cannot raise a read grant's fence"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkGoroutines(t)
			fakes := makeNodes(t, 3, func(i int, nd *fakeNode) {
				nd.fence, nd.holds = tc.fences[i], 1
				// n1 and n2 decide: n3 answers after the decision.
				if i == 2 {
					nd.delay = 50 * time.Millisecond
				}
			})
			nodes := make([]quorum.Node, len(fakes))
			for i, f := range fakes {
				nodes[i] = plainNode{f}
			}
			q, err := quorum.New(nodes, defaultConfig())
			if err != nil {
				t.Fatal(err)
			}
			r := req
			r.Mode = quorum.Shared
			lease, err := q.Acquire(context.Background(), r)
			if tc.wantErr == "" {
				if err != nil || lease.Fence != tc.fences[0] {
					t.Fatalf("Acquire = %+v, %v; want a read lease with fence %d", lease, err, tc.fences[0])
				}
			} else {
				checkNoQuorum(t, err, tc.wantErr)
			}
			awaitOps(fakes, "acquire", 1)
			for _, f := range fakes {
				if n := len(f.ops("raise")); n != 0 {
					t.Errorf("%s: RaiseFence called %d times for a read grant; want never", f.name, n)
				}
			}
			if tc.wantErr != "" {
				awaitOps(fakes, "release", 1)
			}
		})
	}
}

// counterNode keeps a fence counter, a write holder and readers for one
// key, as the Redis node's scripts do: a write attempt increments the
// counter even where it is refused (SET NX then HINCRBY), a read grant
// answers the counter, RaiseFence raises it while the token holds the key
// for writing, RaiseReadFence while it holds it for reading (unless
// lie: it then says yes and leaves the counter, the negative control).
type counterNode struct {
	name string
	lie  bool

	mu      sync.Mutex
	up      bool // answers at all; otherwise every call fails
	counter uint64
	writer  string
	readers map[string]bool
}

func (n *counterNode) Name() string { return n.name }

func (n *counterNode) Acquire(ctx context.Context, r quorum.Request) (quorum.NodeGrant, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.up {
		return quorum.NodeGrant{}, errRefused
	}
	if r.Mode == quorum.Shared {
		if n.writer != "" {
			return quorum.NodeGrant{}, nil
		}
		n.readers[r.Token] = true
		return quorum.NodeGrant{Acquired: true, Fence: n.counter, Holds: 1}, nil
	}
	free := n.writer == "" && len(n.readers) == 0
	if free {
		n.writer = r.Token
	}
	n.counter++
	return quorum.NodeGrant{Acquired: free, Fence: n.counter, Holds: 1}, nil
}

func (n *counterNode) raise(held bool, fence uint64) (bool, error) {
	if !n.up {
		return false, errRefused
	}
	if !held {
		return false, nil
	}
	if !n.lie {
		n.counter = max(n.counter, fence)
	}
	return true, nil
}

func (n *counterNode) RaiseFence(ctx context.Context, key, token string, fence uint64) (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.raise(n.writer == token, fence)
}

func (n *counterNode) RaiseReadFence(ctx context.Context, key, token string, fence uint64) (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.raise(n.readers[token], fence)
}

func (n *counterNode) Release(ctx context.Context, key, token string, hold quorum.Hold) (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.up {
		return false, errRefused
	}
	if n.writer == token && hold != quorum.ReadHold {
		n.writer = ""
		return true, nil
	}
	if n.readers[token] && hold != quorum.WriteHold {
		delete(n.readers, token)
		return true, nil
	}
	return false, nil
}

func (n *counterNode) Extend(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	return false, nil
}

// TestFenceOfWriteAfterReadGrant is the property the read raise is for,
// over three counting nodes, with the nodes each instance reaches set per
// step (the others refuse connections): writes attempted through n1 alone
// (a cut-off instance retrying) move n1's counter to 20; a read granted
// by n1 and n2 gets fence 20; a write granted after it by n2 and n3 must
// get a higher one. The negative control's nodes say they raised a read
// fence and do not: the write then gets 1.
func TestFenceOfWriteAfterReadGrant(t *testing.T) {
	for _, lie := range []bool{false, true} {
		t.Run(fmt.Sprintf("lie=%v", lie), func(t *testing.T) {
			checkGoroutines(t)
			cn := make([]*counterNode, 3)
			nodes := make([]quorum.Node, 3)
			for i := range cn {
				cn[i] = &counterNode{name: fmt.Sprintf("n%d", i+1), lie: lie, readers: map[string]bool{}}
				nodes[i] = cn[i]
			}
			q, err := quorum.New(nodes, defaultConfig())
			if err != nil {
				t.Fatal(err)
			}
			reach := func(up ...int) {
				for i, n := range cn {
					n.mu.Lock()
					n.up = slices.Contains(up, i)
					n.mu.Unlock()
				}
			}
			ctx := context.Background()
			reach(0)
			for i := 0; i < 20; i++ {
				if _, err := q.Acquire(ctx, quorum.Request{Key: "k", Token: "cut-off", TTL: time.Second}); err == nil {
					t.Fatalf("attempt %d through n1 alone granted", i)
				}
			}
			reach(0, 1)
			r, err := q.Acquire(ctx, quorum.Request{Key: "k", Token: "reader", TTL: time.Second, Mode: quorum.Shared})
			if err != nil || r.Fence != 20 {
				t.Fatalf("RLOCK through n1, n2 = %+v, %v; want fence 20", r, err)
			}
			if ok, err := q.Release(ctx, "k", "reader", time.Second); !ok || err != nil {
				t.Fatalf("release of the read grant = %v, %v", ok, err)
			}
			reach(1, 2)
			w, err := q.Acquire(ctx, quorum.Request{Key: "k", Token: "writer", TTL: time.Second})
			if err != nil {
				t.Fatalf("LOCK through n2, n3: %v", err)
			}
			switch {
			case !lie && w.Fence <= r.Fence:
				t.Errorf("write grant after the read grant got fence %d; the read had %d", w.Fence, r.Fence)
			case lie && w.Fence > r.Fence:
				t.Errorf("without the read raise the write still got fence %d above the read's %d: the test has no teeth", w.Fence, r.Fence)
			}
		})
	}
}
