package commands

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// questionBackend is fakeBackend whose Info (the question endUnlock asks
// after an UNLOCK through another connection) waits until the test lets
// it answer that the key is free, and whose renewals find nothing once
// gone is set.
type questionBackend struct {
	fakeBackend
	gone      atomic.Bool
	emptyRuns atomic.Int32 // renewals that found nothing
	askedOnce sync.Once
	asked     chan struct{} // closed when Info is called
	answer    chan struct{} // Info answers once closed
}

func (b *questionBackend) Info(ctx context.Context, key string) (backends.LockInfo, bool, error) {
	b.askedOnce.Do(func() { close(b.asked) })
	select {
	case <-b.answer:
		return backends.LockInfo{}, false, nil
	case <-ctx.Done():
		return backends.LockInfo{}, false, ctx.Err()
	}
}

func (b *questionBackend) RenewHold(ctx context.Context, key, token string, mode backends.Mode, ttl time.Duration) (time.Duration, error) {
	if b.gone.Load() {
		b.emptyRuns.Add(1)
		return 0, nil
	}
	return b.fakeBackend.RenewHold(ctx, key, token, mode, ttl)
}

// TestPooledUnlockRenewalDuringQuestion: b holds k with token t and
// KEEPALIVE, and a, another connection of the client's pool, UNLOCKs it:
// the token's only hold is gone from the nodes, and the lock store is
// asked how many holds the token has left. The watchdog's renewals that
// find nothing meanwhile, until it gives the lease up, are the UNLOCK's
// doing (it is still in flight), not a loss: b is told nothing, no loss
// is counted, and nothing is released.
func TestPooledUnlockRenewalDuringQuestion(t *testing.T) {
	const ttl = 300 * time.Millisecond
	b := &questionBackend{asked: make(chan struct{}), answer: make(chan struct{})}
	k := newTestKeepalives(t, b, time.Minute)
	a, c := newTestConn(t, 3), newTestConn(t, 3)
	now := time.Now()
	if !k.startGrant(c.ctx, c.ka, "k", "t", ttl, 0, backends.Write, true,
		grantTiming{sent: now, validity: ttl, begun: now, holds: 1}) {
		t.Fatal("startGrant = false")
	}
	op := k.beginUnlock("k", "t")
	b.gone.Store(true) // a's UNLOCK released the token's hold
	done := make(chan struct{})
	go func() {
		defer close(done)
		k.endUnlock(op, true, a.ka)
	}()
	select {
	case <-b.asked:
	case <-time.After(5 * time.Second):
		t.Fatal("the lock store was not asked within 5 s")
	}
	// The watchdog tries again while the lease has time left, then gives
	// it up without a word.
	waitFor(t, func() bool { return b.emptyRuns.Load() >= 2 && k.count() == 0 }, "renewals that found nothing, then the watchdog's end")
	close(b.answer)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("endUnlock did not return within 5 s of the answer")
	}
	waitStopped(t, k)
	if why, lost := c.ka.takeLost([]byte("k")); lost {
		t.Errorf("b told %q; want nothing: its token released the lock", why)
	}
	if p := c.pushed(); len(p) != 0 {
		t.Errorf("b's pushes = %q; want none", p)
	}
	for r := lostReason(0); r < numLostReasons; r++ {
		if got := counterValue(t, k.lost[r]); got != 0 {
			t.Errorf("lockproxy_lock_lost_total{reason=%q} = %v; want 0", r.label(), got)
		}
	}
	if _, unlocks := b.counts(); unlocks != 0 {
		t.Errorf("%d releases; want none", unlocks)
	}
}

// TestLockDelayRaisesTheLease: a KEEPALIVE lock whose connection closes is
// kept for its key's lock-delay by a raise-only renewal of its kind to the
// delay (RenewHold), whatever the token and whatever validity was told:
// the lease the watchdog's last renewal asked for stands if longer.
func TestLockDelayRaisesTheLease(t *testing.T) {
	const delay = 100 * time.Millisecond
	for _, tc := range []struct {
		name     string
		shared   bool
		ttl      time.Duration
		validity time.Duration // told by the grant
		renewed  time.Duration // a RENEW's validity told, 0: none
		wait     time.Duration // before the connection closes
		kind     string        // of the lock-delay's renewal: "any" is Renew's
		min, max time.Duration // its TTL
	}{
		// Raise-only whatever the token: an exact set could cut the lease
		// of a grant of the token racing the watchdog's end
		// (TestLockDelayKeepsRacingReentrantGrant).
		{name: "lockproxy's token, validity over", ttl: 300 * time.Millisecond, validity: 20 * time.Millisecond,
			wait: 150 * time.Millisecond, kind: "write", min: delay, max: delay},
		{name: "lockproxy's token, validity longer than the delay", ttl: 2 * time.Second, validity: 2 * time.Second,
			kind: "write", min: delay, max: delay},
		{name: "lockproxy's token, a RENEW told a longer validity", ttl: 300 * time.Millisecond, validity: 20 * time.Millisecond,
			renewed: time.Second, wait: 150 * time.Millisecond, kind: "write", min: delay, max: delay},
		{name: "client's token", shared: true, ttl: 300 * time.Millisecond, validity: 20 * time.Millisecond,
			wait: 150 * time.Millisecond, kind: "write", min: delay, max: delay},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &fakeBackend{}
			k := newTestKeepalives(t, b, time.Minute)
			k.delayFor = (&Limits{LockDelays: []LockDelay{{Pattern: "k", Delay: delay}}}).lockDelay
			c := newTestConn(t, 3)
			now := time.Now()
			if !k.startGrant(c.ctx, c.ka, "k", "tok", tc.ttl, 0, backends.Write, tc.shared,
				grantTiming{sent: now, validity: tc.validity, begun: now, holds: 1}) {
				t.Fatal("startGrant = false")
			}
			if tc.renewed > 0 {
				k.toldRenewal("k", "tok", time.Now(), tc.renewed)
			}
			time.Sleep(tc.wait)
			before, _ := b.counts()
			c.cancel()
			waitEnded(t, c)
			waitStopped(t, k)
			renews, unlocks := b.counts()
			if unlocks != 0 {
				t.Errorf("%d releases; want none (the lock-delay)", unlocks)
			}
			// The lock-delay's renewal comes last, after any renewal in
			// flight when the connection closed.
			if len(renews) == len(before) {
				t.Fatalf("no renewal after the close; want the lock-delay's")
			}
			last := renews[len(renews)-1]
			if last.kind != tc.kind || last.ttl < tc.min || last.ttl > tc.max {
				t.Errorf("lock-delay renewal %s for %v; want %s for %v–%v", last.kind, last.ttl, tc.kind, tc.min, tc.max)
			}
			if got := counterValue(t, k.delayed); got != 1 {
				t.Errorf("lockproxy_lock_delays_total = %v; want 1", got)
			}
		})
	}
}
