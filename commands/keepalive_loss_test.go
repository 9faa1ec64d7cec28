package commands

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// TestLossNoticeWithOthersUnlockInFlight: a KEEPALIVE lock is lost
// (renewals fail past the lease, or the backend reports it lost) while an
// UNLOCK of the same key and token is in flight that does not release the
// KEEPALIVE holder's hold: another connection's loose hold (same TOKEN),
// or one of the holder's own two reentrant holds. That UNLOCK answers only
// its own caller for one hold; the KEEPALIVE holder still counts on its
// hold and must be told it was lost.
func TestLossNoticeWithOthersUnlockInFlight(t *testing.T) {
	for _, tc := range []struct {
		name string
		// loose: the UNLOCK in flight is a loose hold's of another
		// connection; else the holder's own, with two KEEPALIVE holds.
		loose   bool
		backend bool // the loss is the backend's report; else failed renewals
	}{
		{"renewals fail, another connection's UNLOCK in flight", true, false},
		{"backend reports loss, another connection's UNLOCK in flight", true, true},
		{"renewals fail, own UNLOCK of one of two holds in flight", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &fakeBackend{renewErr: quorum.ErrNoQuorum}
			if tc.backend {
				b.renewErr = nil
			}
			k := newTestKeepalives(t, b, time.Minute)
			a := newTestConn(t, 3)
			ttl := 60 * time.Millisecond
			if tc.backend {
				ttl = time.Minute
			}
			if !k.startHold(a.ctx, a.ka, "k", "tok", ttl, 0, backends.Write, true) {
				t.Fatal("startHold = false")
			}
			var unlockKa *connKeepalive
			if tc.loose {
				k.grantedHold(context.Background(), nil, "k", "tok", backends.Write, true) // B, no KEEPALIVE
			} else {
				k.grantedHold(a.ctx, a.ka, "k", "tok", backends.Write, true) // A again
				unlockKa = a.ka
			}
			op := k.beginUnlock("k", "tok") // the UNLOCK is in flight
			if tc.backend {
				k.lostByBackend("k", "tok")
			}
			waitEnded(t, a)
			k.endUnlock(op, true, unlockKa)
			waitStopped(t, k) // the notice comes after the watchdog stops counting on a
			_, lost := a.ka.takeLost([]byte("k"))
			if !lost || len(a.pushed()) != 1 {
				t.Errorf("KEEPALIVE holder: lost notice %v, pushes %d; want a notice and one push: its hold was lost and the UNLOCK in flight released another", lost, len(a.pushed()))
			}
		})
	}
}

// TestClosedHoldersReleasedAfterLastUnlock: connections A and C
// hold a lock with one token, each with KEEPALIVE. A closes while the
// watchdog's goroutine is busy in a renewal, so A's hold waits in drop;
// C then UNLOCKs its own hold, the last KEEPALIVE hold. A's hold must
// still be released (its connection closed, no lock-delay): else the key
// stays held by nobody until the lease runs out.
func TestClosedHoldersReleasedAfterLastUnlock(t *testing.T) {
	b := &countingBackend{gate: make(chan struct{}), inRenew: make(chan struct{}, 1)}
	t.Cleanup(b.open)
	k := newTestKeepalives(t, b, time.Minute)
	a, c := newTestConn(t, 3), newTestConn(t, 3)
	b.grant()
	if !k.startHold(a.ctx, a.ka, "k", "tok", 60*time.Millisecond, 0, backends.Write, true) {
		t.Fatal("startHold = false")
	}
	b.grant()
	if !k.grantedHold(c.ctx, c.ka, "k", "tok", backends.Write, true) {
		t.Fatal("grantedHold = false")
	}
	select {
	case <-b.inRenew:
	case <-time.After(5 * time.Second):
		t.Fatal("no renewal")
	}
	a.cancel()
	waitEnded(t, a) // holderGone moved A's hold to drop
	op := k.beginUnlock("k", "tok")
	ok, _ := b.release()
	k.endUnlock(op, ok, c.ka)
	b.open()
	waitStopped(t, k)
	// The dropped hold is released on a goroutine of its own, which the
	// watchdog gauge does not count: wait (boundedly) for the release.
	for end := time.Now().Add(5 * time.Second); b.holds() != 0 && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	if n := b.holds(); n != 0 {
		t.Errorf("%d holds left on the nodes after A closed and C UNLOCKed; want 0 (A's hold released)", n)
	}
}

// TestGrantDuringCloseKeepsItsLease: the handler is closing (shutdown) and
// has canceled a watchdog whose goroutine is still busy in a renewal. A
// plain LOCK of the same token granted meanwhile must not join that
// watchdog, which releases every hold it counts when it ends: its client
// was told it holds the lock for its TTL, and nothing ties that hold to
// the closing server.
func TestGrantDuringCloseKeepsItsLease(t *testing.T) {
	b := &countingBackend{gate: make(chan struct{}), inRenew: make(chan struct{}, 1)}
	t.Cleanup(b.open)
	k := newTestKeepalives(t, b, time.Minute)
	a := newTestConn(t, 3)
	b.grant()
	if !k.startHold(a.ctx, a.ka, "k", "tok", 60*time.Millisecond, 0, backends.Write, true) {
		t.Fatal("startHold = false")
	}
	select {
	case <-b.inRenew:
	case <-time.After(5 * time.Second):
		t.Fatal("no renewal")
	}
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		k.close()
	}()
	waitFor(t, func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		return k.closed
	}, "the close begun")
	b.grant()
	if k.grantedHold(context.Background(), nil, "k", "tok", backends.Write, true) {
		t.Error("a plain grant joined a watchdog the closing handler had canceled")
	}
	b.open()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("close did not return")
	}
	if n := b.holds(); n != 1 {
		t.Errorf("%d holds left after the close; want 1, the plain grant's", n)
	}
}
