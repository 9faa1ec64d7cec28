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
		{"disagreeing", []uint64{4, 2, 2}, "2/3 nodes: n2 cannot raise a read grant's fence"},
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
