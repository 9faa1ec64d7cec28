package quorum_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
)

// TestOwnTokenRefusalNotHeldBySilentNode: an attempt whose token is its
// caller's own (Request.OwnToken, a LOCK … WAIT without TOKEN) and that
// a majority refused answers ErrNotAcquired within about TimeoutMin, not
// once a node that does not answer was heard out (the node timeout and
// more) and its roll-back answered (as long again): a waiter can try again
// as soon as the key is released. The roll-back still goes to that node,
// and to no node that refused. A last node that answers within TimeoutMin
// is heard, as before, and gets no roll-back; so does one of an attempt
// whose answer could still change (NOQUORUM naming the nodes), or that
// is NoReentry without OwnToken (transparent mode's SET NX). An attempt
// that may join its token's hold (not NoReentry: a LOCK with TOKEN) is
// answered as promptly, also a refused upgrade (ErrUpgrade), but the
// roll-back a node not heard gets is scoped to the attempt
// (RollbackScoped), as is that of a node heard granting afresh, while a
// node heard joining the token's hold gets the plain one.
// WaitRollbacks waits for the roll-backs not waited for.
func TestOwnTokenRefusalNotHeldBySilentNode(t *testing.T) {
	const (
		nodeTimeout = 200 * time.Millisecond // 5 % of req's 10 s, capped
		minTimeout  = 20 * time.Millisecond
		// fast is the most a prompt answer may take: TimeoutMin and
		// slack for a loaded host, well under one node timeout.
		fast = minTimeout + 80*time.Millisecond
	)
	for _, tc := range []struct {
		name      string
		n         int
		set       func(i int, nd *fakeNode)
		own, nore bool
		plain     bool // nodes without Start methods (no AsyncNode)
		want      error
		prompt    bool  // answered within fast
		released  []int // nodes that get a roll-back
		scoped    []int // of those, the nodes whose roll-back is scoped
	}{
		{"silent third node", 3, silentLast(3, 0), true, true, false, quorum.ErrNotAcquired, true, []int{2}, nil},
		{"third node answers within TimeoutMin", 3, silentLast(3, time.Millisecond), true, true, false, quorum.ErrNotAcquired, true, nil, nil},
		{"not OwnToken: heard out", 3, silentLast(3, 0), false, true, false, quorum.ErrNotAcquired, false, []int{2}, nil},
		{"not NoReentry: scoped roll-back", 3, silentLast(3, 0), false, false, false, quorum.ErrNotAcquired, true, []int{2}, []int{2}},
		{"not NoReentry, answered within TimeoutMin", 3, silentLast(3, time.Millisecond), false, false, false, quorum.ErrNotAcquired, true, nil, nil},
		{"not NoReentry, upgrade refused", 3, func(i int, nd *fakeNode) {
			silentLast(3, 0)(i, nd)
			nd.upgrad = i == 0
		}, false, false, false, quorum.ErrUpgrade, true, []int{2}, []int{2}},
		// A node heard granting (here one that joined the token's hold)
		// gets the plain roll-back, which undoes that join.
		{"not NoReentry, N=5, one grants", 5, func(i int, nd *fakeNode) {
			switch i {
			case 0:
				nd.holds = 2
			case 4:
				nd.delay = time.Hour
			default:
				nd.refuse = true
			}
		}, false, false, false, quorum.ErrNotAcquired, true, []int{0, 4}, []int{4}},
		// One heard granting afresh gets the scoped one: its roll-back
		// is not waited for, and a renewal of the token through another
		// instance may count the hold before it comes.
		{"not NoReentry, N=5, one grants afresh", 5, func(i int, nd *fakeNode) {
			switch i {
			case 0:
				nd.holds = 1
			case 4:
				nd.delay = time.Hour
			default:
				nd.refuse = true
			}
		}, false, false, false, quorum.ErrNotAcquired, true, []int{0, 4}, []int{0, 4}},
		// A plain node's roll-back runs on a goroutine of its own, in no
		// order with the token's next attempt: it is waited for.
		{"nodes not AsyncNode: heard out", 3, silentLast(3, 0), true, true, true, quorum.ErrNotAcquired, false, []int{2}, nil},
		// Heard out, an attempt that may join gets the scoped roll-back
		// where it was heard granting afresh (a renewal of the token on
		// another connection may count that hold while the roll-back is
		// on its way), the plain one where it was heard joining and where
		// it was not heard (queued behind the attempt, it undoes a late
		// join too; the node scopes it where the answer was lost).
		{"not NoReentry, nodes not AsyncNode: heard out", 3, silentLast(3, 0), false, false, true, quorum.ErrNotAcquired, false, []int{2}, nil},
		{"not NoReentry, N=5, heard out, one grants afresh, one joins", 5, func(i int, nd *fakeNode) {
			switch i {
			case 0:
				nd.holds = 1
			case 1:
				nd.holds = 2
			case 4:
				nd.delay = time.Hour
			default:
				nd.refuse = true
			}
		}, false, false, true, quorum.ErrNotAcquired, false, []int{0, 1, 4}, []int{0}},
		{"the answer could still change: heard out", 5, func(i int, nd *fakeNode) {
			switch i {
			case 0, 1:
				nd.refuse = true
			case 2:
				nd.err = errRefused
			default:
				nd.delay = time.Hour
			}
		}, true, true, false, quorum.ErrNoQuorum, false, []int{2, 3, 4}, nil},
		{"not NoReentry, the answer could still change: heard out", 5, func(i int, nd *fakeNode) {
			switch i {
			case 0, 1:
				nd.refuse = true
			case 2:
				nd.err = errRefused
			default:
				nd.delay = time.Hour
			}
		}, false, false, false, quorum.ErrNoQuorum, false, []int{2, 3, 4}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkGoroutines(t)
			nodes := makeNodes(t, tc.n, tc.set)
			cfg := defaultConfig()
			cfg.TimeoutMin, cfg.TimeoutMax = minTimeout, nodeTimeout
			q := newQuorum(t, cfg, nodes)
			if !tc.plain {
				q = newAsyncQuorum(t, cfg, nodes)
			}
			r := req
			r.OwnToken, r.NoReentry = tc.own, tc.nore
			start := time.Now()
			_, err := q.Acquire(context.Background(), r)
			took := time.Since(start)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Acquire = %v; want %v", err, tc.want)
			}
			if tc.prompt && took > fast {
				t.Errorf("Acquire answered after %v; want within %v", took, fast)
			}
			if !tc.prompt && took < nodeTimeout {
				t.Errorf("Acquire answered after %v; want the silent nodes heard out (%v at least)", took, nodeTimeout)
			}
			// The roll-backs not waited for end within the node timeout
			// (the silent node's Release runs until its deadline).
			wctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if err := q.WaitRollbacks(wctx); err != nil {
				t.Fatalf("WaitRollbacks = %v; want the roll-backs answered", err)
			}
			want, scoped := map[int]bool{}, map[int]bool{}
			for _, i := range tc.released {
				want[i] = true
			}
			for _, i := range tc.scoped {
				scoped[i] = true
			}
			for i, nd := range nodes {
				rel := nd.ops("release")
				if got := len(rel) > 0; got != want[i] {
					t.Errorf("%s got %d roll-backs; want them: %v", nd.name, len(rel), want[i])
				}
				for _, c := range rel {
					if c.token != r.Token || c.hold != quorum.WriteHold {
						t.Errorf("%s rolled back %+v; want %q's write hold", nd.name, c, r.Token)
					}
					if c.scoped != scoped[i] {
						t.Errorf("%s got a roll-back scoped %v; want scoped %v", nd.name, c.scoped, scoped[i])
					}
					if c.scoped && c.attempt == "" {
						t.Errorf("%s got a scoped roll-back of no attempt", nd.name)
					}
				}
			}
		})
	}
}

// silentLast sets the first n-1 nodes to refuse, and the last to answer
// after delay, or never (0: it waits until its context ends).
func silentLast(n int, delay time.Duration) func(int, *fakeNode) {
	return func(i int, nd *fakeNode) {
		nd.refuse = true
		if i == n-1 {
			nd.delay = delay
			if delay == 0 {
				nd.delay = time.Hour
			}
		}
	}
}

// asyncFake is a fakeNode with the Start methods of an AsyncNode, each
// running the plain method on a goroutine of its own: what
// Request.OwnToken needs to be seen (the order it relies on is
// rollback_order_test's).
type asyncFake struct{ *fakeNode }

func (n asyncFake) StartAcquire(ctx context.Context, req quorum.Request, done func(quorum.NodeGrant, error)) {
	go func() {
		ctx, cancel := withTimer(ctx)
		defer cancel()
		done(n.Acquire(ctx, req))
	}()
}

func (n asyncFake) StartRaiseFence(ctx context.Context, key, token string, fence uint64, done func(bool, error)) {
	go func() {
		ctx, cancel := withTimer(ctx)
		defer cancel()
		done(n.RaiseFence(ctx, key, token, fence))
	}()
}

func (n asyncFake) StartRelease(ctx context.Context, key, token string, hold quorum.Hold, done func(bool, error)) {
	go func() {
		ctx, cancel := withTimer(ctx)
		defer cancel()
		done(n.Release(ctx, key, token, hold))
	}()
}

func (n asyncFake) StartExtend(ctx context.Context, key, token string, ttl time.Duration, done func(bool, error)) {
	go func() {
		ctx, cancel := withTimer(ctx)
		defer cancel()
		done(n.Extend(ctx, key, token, ttl))
	}()
}

// withTimer gives ctx's deadline a timer: the quorum hands an AsyncNode
// a context whose deadline has none (a real node keeps the deadline
// itself), and the fake waits on Done.
func withTimer(ctx context.Context) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); ok {
		return context.WithDeadline(ctx, d)
	}
	return ctx, func() {}
}

func newAsyncQuorum(t *testing.T, cfg quorum.Config, nodes []*fakeNode) *quorum.Quorum {
	t.Helper()
	qn := make([]quorum.Node, len(nodes))
	for i, nd := range nodes {
		qn[i] = asyncFake{nd}
	}
	q, err := quorum.New(qn, cfg)
	if err != nil {
		t.Fatalf("quorum.New: %v", err)
	}
	return q
}
