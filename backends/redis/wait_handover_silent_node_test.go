package redis

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// TestWaitHandOverWithSilentNode: a LOCK … WAIT is granted soon after the
// holder's UNLOCK is answered, also while one node of three is silent
// (paused: its connections stay open and nothing comes back, as behind a
// blackholed link), whether the waiter is on the holder's instance or on
// another one, and whether the UNLOCK comes while the waiter's refused
// attempt still waits for the silent node or while it sleeps. The two
// healthy nodes are a majority: enough to release and to grant.
//
// Without TOKEN (a token lockproxy made, OwnToken), a refused attempt's
// roll-back goes to the silent node in order ahead of the next attempt,
// unwaited. With TOKEN (LOCK k PX 10000 WAIT 5000 TOKEN B), it goes
// unwaited too, scoped to the attempt: also when B holds the key on the
// silent node from before (its hold lapsed on the other two, which A then
// took), where each refused attempt joins that hold once the node runs
// again, and the scoped roll-back takes no hold of B's there, neither that
// old one nor the grant's.
//
// Before, a refused attempt heard out the silent node (up to two node
// timeouts) and then waited for its roll-back there before its waiter
// could try again: the grant came ~0.9 s (without TOKEN up to about three
// node timeouts) after the UNLOCK, at 500 ms node timeouts.
func TestWaitHandOverWithSilentNode(t *testing.T) {
	const (
		ttl     = 10 * time.Second
		timeout = 500 * time.Millisecond // the node timeout at this TTL
		// bound is how long after the UNLOCK's answer the grant may come:
		// well under one node timeout, on a shared, loaded host.
		bound = 250 * time.Millisecond
	)
	for _, tc := range []struct {
		silent bool
		other  bool // the waiter is on another instance than the holder
		token  bool // the waiter names its TOKEN
		// leftover: B holds the key on the silent node from before.
		leftover bool
		// unlockAfter is when the holder unlocks, after the waiter's
		// LOCK was sent: 100 ms, while the waiter's first attempt waits
		// for the silent node (if any); 1.6 s, while it sleeps on.
		unlockAfter time.Duration
	}{
		{false, false, false, false, 100 * time.Millisecond},
		{false, true, false, false, 100 * time.Millisecond},
		{true, false, false, false, 100 * time.Millisecond},
		{true, true, false, false, 100 * time.Millisecond},
		{true, false, false, false, 1600 * time.Millisecond},
		{true, true, false, false, 1600 * time.Millisecond},
		{true, false, true, false, 100 * time.Millisecond},
		{true, true, true, false, 100 * time.Millisecond},
		{true, false, true, false, 1600 * time.Millisecond},
		{true, true, true, false, 1600 * time.Millisecond},
		{true, false, true, true, 100 * time.Millisecond},
		{true, true, true, true, 1600 * time.Millisecond},
	} {
		name := fmt.Sprintf("silent=%v other=%v token=%v leftover=%v unlock after %v", tc.silent, tc.other, tc.token, tc.leftover, tc.unlockAfter)
		t.Run(name, func(t *testing.T) {
			b, rs := newRealBackend(t, 3, nodeTimeouts(timeout))
			ctx := ctxTimeout(t, 30*time.Second)
			const key = "handover"
			WarmUp(ctx, t, b, rs, "ho-warm", ttl)
			wb := b
			if tc.other {
				wb = newBackendOn(t, rs, nodeTimeouts(timeout))
				WarmUp(ctx, t, wb, rs, "ho-warm2", ttl)
			}
			held := lockOrFatal(t, b, backends.LockRequest{Key: key, Token: "A", TTL: ttl})
			c2 := rs[2].Client(t)
			if tc.silent {
				waitFor(t, "the hold on the third node", func() bool { return c2.Get(ctx, "lp:lock:"+key).Val() == "A" })
				if tc.leftover {
					// B's hold of before, on the third node alone, with
					// its fence (a plain hold: no lockm).
					if err := c2.Set(ctx, "lp:lock:"+key, "B", 20*time.Second).Err(); err != nil {
						t.Fatal(err)
					}
					if err := c2.Set(ctx, "lp:lockf:"+key, "1,B", 20*time.Second).Err(); err != nil {
						t.Fatal(err)
					}
					if err := c2.Del(ctx, "lp:lockm:"+key).Err(); err != nil {
						t.Fatal(err)
					}
				}
				rs[2].Pause()
				t.Cleanup(rs[2].Resume)
			}
			type result struct {
				l   backends.Lease
				err error
				at  time.Time
			}
			got := make(chan result, 1)
			req := backends.LockRequest{Key: key, Token: "B", TTL: ttl, Wait: 5 * time.Second, NoReentry: true, OwnToken: true}
			if tc.token {
				req = backends.LockRequest{Key: key, Token: "B", TTL: ttl, Wait: 5 * time.Second}
			}
			go func() {
				l, err := wb.Lock(ctx, req)
				got <- result{l, err, time.Now()}
			}()
			time.Sleep(tc.unlockAfter)
			if ok, err := b.Unlock(ctx, key, held.Token); !ok || err != nil {
				t.Fatalf("UNLOCK = %v, %v; want released", ok, err)
			}
			unlocked := time.Now()
			r := <-got
			if r.err != nil {
				t.Fatalf("LOCK … WAIT = %v; want a grant", r.err)
			}
			lag := r.at.Sub(unlocked)
			t.Logf("granted %v after the UNLOCK's answer (validity %v, fence %d, holds %d)", lag.Round(100*time.Microsecond), r.l.Validity, r.l.Fence, r.l.Holds)
			if lag > bound {
				t.Errorf("LOCK … WAIT granted %v after the UNLOCK's answer; want within %v", lag.Round(time.Millisecond), bound)
			}
			if r.l.Fence <= held.Fence {
				t.Errorf("fence %d after the holder's %d; want higher", r.l.Fence, held.Fence)
			}
			if max := ttl - quorum.DefaultDriftMin - ttl/100; r.l.Validity > max {
				t.Errorf("validity %v; want at most %v", r.l.Validity, max)
			}
			if tc.leftover {
				// The third node runs what was queued: B's refused
				// attempts join its old hold there (each roll-back, scoped
				// to its attempt, leaves the join), and so does the
				// grant. B's hold stays there.
				rs[2].Resume()
				waitFor(t, "the third node answering", func() bool { return c2.Ping(ctx).Err() == nil })
				for end := time.Now().Add(2 * timeout); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
					if v := c2.Get(ctx, "lp:lock:"+key).Val(); v != "B" {
						t.Fatalf("the third node holds %q for the key; want B's hold kept", v)
					}
				}
				return
			}
			// Nothing is left behind once the silent node answers again:
			// the roll-backs of the waiter's refused attempts reached it in
			// order, and so did the UNLOCKs.
			if ok, err := wb.Unlock(ctx, key, "B"); !ok || err != nil {
				t.Fatalf("UNLOCK B = %v, %v; want released", ok, err)
			}
			rs[2].Resume()
			staysGone(t, fmt.Sprintf("%q held on no node after both UNLOCKs", key), 2*timeout, func() string {
				var held []string
				for i, n := range rs {
					if v := n.Client(t).Get(ctx, "lp:lock:"+key).Val(); v != "" {
						held = append(held, fmt.Sprintf("node %d: %s", i, v))
					}
				}
				if len(held) > 0 {
					return fmt.Sprint(held)
				}
				return ""
			})
		})
	}
}

// TestWaitRefusedRollsBackSilentNode: the refused attempts of a LOCK …
// WAIT (without TOKEN) roll back a node that did not answer them without
// hearing it out (see quorum.Request.OwnToken), and the roll-back still
// reaches it: a node paused with the key free there grants the attempt
// when it runs again, and that hold is removed, within the node timeouts,
// not left until its TTL.
func TestWaitRefusedRollsBackSilentNode(t *testing.T) {
	const (
		ttl     = 10 * time.Second
		timeout = 500 * time.Millisecond
	)
	b, rs := newRealBackend(t, 3, nodeTimeouts(timeout))
	ctx := ctxTimeout(t, 30*time.Second)
	const key = "refused-silent"
	WarmUp(ctx, t, b, rs, "rs-warm", ttl)
	lockOrFatal(t, b, backends.LockRequest{Key: key, Token: "A", TTL: ttl})
	c2 := rs[2].Client(t)
	waitFor(t, "the hold on the third node", func() bool { return c2.Get(ctx, "lp:lock:"+key).Val() == "A" })
	// Free on the third node only: B's attempt is refused by the other
	// two, and granted there once it runs again.
	if err := c2.Del(ctx, "lp:lock:"+key).Err(); err != nil {
		t.Fatal(err)
	}
	rs[2].Pause()
	t.Cleanup(rs[2].Resume)
	start := time.Now()
	_, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "B", TTL: ttl, Wait: 300 * time.Millisecond, NoReentry: true, OwnToken: true})
	if !errors.Is(err, backends.ErrNotAcquired) {
		t.Fatalf("LOCK … WAIT = %v after %v; want not acquired", err, time.Since(start))
	}
	rs[2].Resume()
	// The node runs what was queued for it as it resumes, the attempt
	// first (B may hold the key there for a moment): B's hold must then
	// be gone for good, well before its 10 s TTL.
	staysGone(t, fmt.Sprintf("B's hold of %q gone from the third node", key), 2*timeout, func() string {
		if v := c2.Get(ctx, "lp:lock:"+key).Val(); v == "B" {
			return "held by B"
		}
		return ""
	})
}

// staysGone polls held (which describes what is left, or is "") every
// 10 ms until it has been "" for window, and fails the test if that does
// not happen within 5 s: what a node resuming runs may show for a moment
// before it is undone.
func staysGone(t *testing.T, what string, window time.Duration, held func() string) {
	t.Helper()
	var clear time.Time
	var last string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		now := time.Now()
		switch h := held(); {
		case h != "":
			clear, last = time.Time{}, h
		case clear.IsZero():
			clear = now
		case now.Sub(clear) >= window:
			return
		}
		if now.After(deadline) {
			t.Fatalf("%s: not for %v within 5 s (last seen: %s)", what, window, last)
		}
	}
}
