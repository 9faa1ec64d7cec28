package redis

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestInfoWithNodeDownSeesMajorityHold: a holder that holds the key on a
// majority (nodes 2 and 3; node 1 missed the grant) must not be reported
// free when node 3 then stops answering: the two nodes that answer cannot
// tell, so LOCKINFO must say NOQUORUM (as UNLOCK does when undecided) or
// report the holder, never nil while a rival LOCK is refused.
func TestInfoWithNodeDownSeesMajorityHold(t *testing.T) {
	for _, mode := range []backends.Mode{backends.Write, backends.Read} {
		t.Run(mode.String(), func(t *testing.T) {
			b, rs := newRealBackend(t, 3)
			ctx := ctxTimeout(t, 30*time.Second)
			const key = "k"
			b.nodes[0].health.setClockOut(true) // node 1 misses the grant
			if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "T", TTL: 20 * time.Second, Mode: mode}); err != nil {
				t.Fatalf("grant on nodes 2 and 3: %v", err)
			}
			b.nodes[0].health.setClockOut(false)
			rs[2].Kill()

			info, held, err := b.Info(ctx, key)
			var nq *quorum.NoQuorumError
			if err == nil && !held {
				_, lerr := b.Lock(ctx, backends.LockRequest{Key: key, Token: "U", TTL: 20 * time.Second})
				t.Errorf("LOCKINFO = free (nil) while T holds the key on a majority (nodes 2, 3); a rival LOCK got %v", lerr)
			} else if err != nil && !errors.As(err, &nq) {
				t.Errorf("LOCKINFO err = %v; want NOQUORUM or T's hold", err)
			} else if held && (len(info.Holders) != 1 || info.Holders[0].Token != "T") {
				t.Errorf("LOCKINFO = %+v; want T", info)
			}
		})
	}
}

// TestInfoTTLNotAboveHonoured: LOCKINFO's ttl_ms is what a majority
// would still honour less the drift allowance, as a grant's validity is:
// counted from the grant's (or renewal's) answer, it ends no later than
// the lease less the drift for what is left of it. The raw node PTTL,
// reported before, was up to the whole drift allowance longer than the
// validity the holder had been told. (From the answer, not the send:
// LOCKINFO cannot know how long the grant took to reach the nodes.)
func TestInfoTTLNotAboveHonoured(t *testing.T) {
	b, _ := newRealBackend(t, 3)
	ctx := ctxTimeout(t, 30*time.Second)
	const ttl = 10 * time.Second
	for _, tc := range []struct {
		name  string
		mode  backends.Mode
		renew bool
	}{
		{"write grant", backends.Write, false},
		{"read grant", backends.Read, false},
		{"write renew", backends.Write, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "ttl-" + tc.name
			l, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "T", TTL: ttl, Mode: tc.mode})
			if err != nil {
				t.Fatal(err)
			}
			t0, valid := time.Now(), l.Validity
			if tc.renew {
				if valid, err = b.Renew(ctx, key, "T", ttl); err != nil || valid <= 0 {
					t.Fatalf("renew = %v, %v", valid, err)
				}
				t0 = time.Now()
			}
			info, held, err := b.Info(ctx, key)
			if err != nil || !held {
				t.Fatalf("LOCKINFO = %v, %v", held, err)
			}
			left := ttl - time.Since(t0)
			// A node's PTTL is whole milliseconds, rounded either way.
			limit := left - b.q.Drift(left) + time.Millisecond
			for _, got := range []time.Duration{info.TTL, info.Holders[0].TTL} {
				if got > limit {
					t.Errorf("LOCKINFO ttl_ms %d > %d, the lease left less its drift allowance (validity told: %d ms)",
						got.Milliseconds(), limit.Milliseconds(), valid.Milliseconds())
				}
			}
			if info.TTL < limit-time.Second {
				t.Errorf("LOCKINFO ttl_ms %d; want about %d", info.TTL.Milliseconds(), limit.Milliseconds())
			}
		})
	}
}

// TestInfoFenceIsGrantsFence: node 1's counter for the key's slot is ahead
// of the others' (attempts while nodes 2 and 3 were unreachable),
// and node 1 is slow when T is granted: the grant is decided on nodes 2
// and 3 with their (lower) fence, and node 1 stores its own higher one
// when it catches up. LOCKINFO must report the fence T was granted (the
// one a majority stored), since transparent-mode holders learn their fence
// only from LOCKINFO; reporting node 1's lets the next holder, granted
// without node 1, get a smaller fence than the one T was shown.
func TestInfoFenceIsGrantsFence(t *testing.T) {
	const key = "f"
	b, rs, ctx, l := grantBesideLateHigherFence(t, key)
	info, held, err := b.Info(ctx, key)
	if err != nil || !held {
		t.Fatalf("LOCKINFO = %v, %v", held, err)
	}
	t.Logf("LOCK fence %d, LOCKINFO fence %d", l.Fence, info.Fence)
	for i, r := range rs {
		c := r.Client(t)
		f, _ := c.Get(ctx, "lp:lockf:"+key).Result()
		n, _ := c.HGet(ctx, "lp:fence", fmt.Sprint(slot(key))).Result()
		t.Logf("node %d: lockf %q, counter %s", i+1, f, n)
	}
	next := nextHolderWithoutNode1(ctx, t, b, key)
	if info.Fence != l.Fence {
		t.Errorf("LOCKINFO fence %d; T was granted fence %d", info.Fence, l.Fence)
	}
	if next.Fence <= info.Fence {
		t.Errorf("next holder U's fence %d <= the fence %d LOCKINFO showed for T: the fence went backwards", next.Fence, info.Fence)
	}
}

// TestInfoPausedNodeBounded: a paused node delays LOCKINFO by at most the
// per-node timeout.
func TestInfoPausedNodeBounded(t *testing.T) {
	b, rs := newRealBackend(t, 3)
	ctx := ctxTimeout(t, 30*time.Second)
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "p", Token: "T", TTL: 20 * time.Second}); err != nil {
		t.Fatal(err)
	}
	rs[1].Pause()
	defer rs[1].Resume()
	for i := 0; i < 3; i++ {
		start := time.Now()
		info, held, err := b.Info(ctx, "p")
		t.Logf("Info with node 2 paused: %v held=%v err=%v fence=%d", time.Since(start), held, err, info.Fence)
		if time.Since(start) > 600*time.Millisecond {
			t.Errorf("LOCKINFO took %v", time.Since(start))
		}
	}
}

// TestInfoFenceWithLostFenceWrite: node 1's fence write for T's grant was
// lost (its connection dropped: "a write that fails leaves ... LOCKINFO
// the slot counter"), and every rival attempt's HINCRBY raises that
// counter: LOCKINFO's fence for the same hold then grows with each
// refused rival, above the fence T was granted.
func TestInfoFenceWithLostFenceWrite(t *testing.T) {
	b, rs := newRealBackend(t, 3)
	ctx := ctxTimeout(t, 30*time.Second)
	const key = "lf"
	l, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "T", TTL: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := rs[0].Client(t).Del(ctx, "lp:lockf:"+key).Err(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "U", TTL: 20 * time.Second}); !errors.Is(err, backends.ErrNotAcquired) {
			t.Fatalf("rival %d = %v", i, err)
		}
	}
	info, held, err := b.Info(ctx, key)
	if err != nil || !held {
		t.Fatalf("LOCKINFO = %v, %v", held, err)
	}
	if info.Fence != l.Fence {
		t.Errorf("LOCKINFO fence %d; T was granted fence %d (and nodes 2 and 3 store it)", info.Fence, l.Fence)
	}
}

// TestInfoReadFenceWithNodeDown: node 3's counter for the key's slot lags
// (writes granted while it was out of quorums), so reader R is granted on
// all three nodes with the fence of nodes 1 and 2, which a majority
// already has: node 3 is not raised. With node 2 down, LOCKINFO hears
// nodes 1 and 3, both holding R, and must still report a fence at least
// R's (as documented for a read lock): node 2, which did not answer, may
// be one of the majority at R's fence. The majority-th largest counter of
// the nodes that answered, reported before, was node 3's lagging one.
func TestInfoReadFenceWithNodeDown(t *testing.T) {
	b, rs := newRealBackend(t, 3)
	ctx := ctxTimeout(t, 30*time.Second)
	const key = "rf"
	b.nodes[2].health.setClockOut(true)
	for i := 0; i < 5; i++ {
		l, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: fmt.Sprint("W", i), TTL: 20 * time.Second})
		if err != nil {
			t.Fatalf("write %d on nodes 1 and 2: %v", i, err)
		}
		if ok, err := b.Unlock(ctx, key, l.Token); !ok || err != nil {
			t.Fatalf("release of write %d = %v, %v", i, ok, err)
		}
	}
	b.nodes[2].health.setClockOut(false)

	r, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "R", TTL: 20 * time.Second, Mode: backends.Read})
	if err != nil {
		t.Fatal(err)
	}
	// The grant was decided on two nodes; wait for node 3's to land.
	c3 := rs[2].Client(t)
	for c3.ZScore(ctx, "lp:lockr:"+key, "R").Err() != nil {
		if ctx.Err() != nil {
			t.Fatal("node 3 never granted R")
		}
		time.Sleep(5 * time.Millisecond)
	}
	rs[1].Kill()

	info, held, err := b.Info(ctx, key)
	if err != nil || !held || len(info.Holders) != 1 {
		t.Fatalf("LOCKINFO = %+v, %v, %v; want R's read hold", info, held, err)
	}
	if info.Fence < r.Fence {
		t.Errorf("LOCKINFO fence %d with node 2 down; reader R was granted fence %d", info.Fence, r.Fence)
	}
}

// TestInfoCountsDowngradedNodesForTheirReadHold: writer B missed node 1
// (out of the vote), downgraded on all three nodes (node 1 a read hold
// afresh, nodes 2 and 3 a read hold beside the write hold), and renewed
// while node 3 was out, whose lease then ran out. B holds the key for
// reading on nodes 1 and 2, a majority (node 2 for writing too), and a
// rival LOCK is refused; LOCKINFO, which counted a reader only on the
// nodes held by readers alone, answered the key free.
func TestInfoCountsDowngradedNodesForTheirReadHold(t *testing.T) {
	const key = "dg"
	lease := time.Second
	// Undecided (NOQUORUM: the write hold is renewed on node 2 alone,
	// see TestRenewOfDowngradeCountsWriteHolds), but run on nodes 1 and 2.
	b, ctx, renewed, err := downgradeRenewedOnNodes12(t, key, lease)
	if nq := (*quorum.NoQuorumError)(nil); err != nil && !errors.As(err, &nq) || err == nil && renewed <= 0 {
		t.Fatalf("B's renewal on nodes 1 and 2 = %v, %v", renewed, err)
	}
	time.Sleep(lease + 100*time.Millisecond) // node 3's lease ends

	if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "W", TTL: time.Second}); !errors.Is(err, backends.ErrNotAcquired) {
		t.Fatalf("W's LOCK = %v; want it refused (B holds the key on nodes 1 and 2)", err)
	}
	info, held, err := b.Info(ctx, key)
	if err != nil || !held {
		t.Fatalf("LOCKINFO = %+v, %v, %v; want B's hold", info, held, err)
	}
	if len(info.Holders) != 1 || info.Holders[0].Token != "B" {
		t.Errorf("LOCKINFO = %+v; want B the one holder", info)
	}
}

// grantBesideLateHigherFence grants token T key on three real nodes with
// node 1's fence counter ahead: attempts made while nodes 2 and 3 are out
// of quorums (each a SET NX and HINCRBY on node 1 alone, rolled back)
// raise node 1's counter only; T is then granted while node 1 is paused,
// on nodes 2 and 3 with their lower fence, and node 1, resumed, grants T
// its own higher one, which this waits for. It returns the backend, its
// nodes, the test's context and T's lease.
func grantBesideLateHigherFence(t *testing.T, key string) (*Backend, []*harness.Redis, context.Context, backends.Lease) {
	t.Helper()
	b, rs := newRealBackend(t, 3)
	ctx := ctxTimeout(t, 60*time.Second)
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
	c1 := rs[0].Client(t)
	for c1.Get(ctx, "lp:lock:"+key).Val() != "T" {
		if ctx.Err() != nil {
			t.Fatal("node 1 never granted T")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return b, rs, ctx, l
}

// nextHolderWithoutNode1 releases T's hold on key (set up by
// grantBesideLateHigherFence) and grants the key to U while node 1, the
// one whose fence counter is ahead, is out of the vote: U's fence comes
// from nodes 2 and 3 alone.
func nextHolderWithoutNode1(ctx context.Context, t *testing.T, b *Backend, key string) backends.Lease {
	t.Helper()
	if ok, err := b.Unlock(ctx, key, "T"); !ok || err != nil {
		t.Fatalf("T's release = %v, %v", ok, err)
	}
	b.nodes[0].health.setClockOut(true)
	next, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "U", TTL: 20 * time.Second})
	b.nodes[0].health.setClockOut(false)
	if err != nil {
		t.Fatal(err)
	}
	return next
}
