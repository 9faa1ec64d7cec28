package commands

import (
	"context"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/lockproxy/lockproxy/backends"
)

// countingBackend counts a token's write holds as the lock store does
// (reentrant holds), and can hold a renewal until told to go on, so that
// a test can order events against the watchdog's goroutine.
type countingBackend struct {
	fakeBackend
	cmu     sync.Mutex
	held    int           // the token's write holds
	gate    chan struct{} // while not nil, renewals wait for it to close
	inRenew chan struct{} // a renewal is waiting at the gate
}

func (b *countingBackend) release() (bool, error) {
	b.cmu.Lock()
	defer b.cmu.Unlock()
	if b.held == 0 {
		return false, nil
	}
	b.held--
	return true, nil
}

func (b *countingBackend) grant() {
	b.cmu.Lock()
	defer b.cmu.Unlock()
	b.held++
}

func (b *countingBackend) Unlock(ctx context.Context, key, token string) (bool, error) {
	return b.release()
}

func (b *countingBackend) UnlockHold(ctx context.Context, key, token string, mode backends.Mode) (bool, error) {
	return b.release()
}

func (b *countingBackend) RenewHold(ctx context.Context, key, token string, mode backends.Mode, ttl time.Duration) (time.Duration, error) {
	b.cmu.Lock()
	gate := b.gate
	b.cmu.Unlock()
	if gate != nil {
		select {
		case b.inRenew <- struct{}{}:
		default:
		}
		<-gate
	}
	return ttl, nil
}

func (b *countingBackend) open() {
	b.cmu.Lock()
	defer b.cmu.Unlock()
	if b.gate != nil {
		close(b.gate)
		b.gate = nil
	}
}

func (b *countingBackend) holds() int {
	b.cmu.Lock()
	defer b.cmu.Unlock()
	return b.held
}

// TestEndingWatchdogCountsUnlockInFlight: connection A holds a lock with
// KEEPALIVE and B (same token, no KEEPALIVE) a loose hold the watchdog
// counts; B UNLOCKs while A's connection closes, and C, alive, is then
// granted the lock with the same token and KEEPALIVE (a watchdog of its
// own). The token's holds are alike on the nodes, so the ending watchdog
// must release exactly the holds left of those it counted: a hold B's
// UNLOCK released (or is releasing) counted again would take C's hold,
// which C was just told it has and its watchdog keeps. Each order of the
// UNLOCK's begin and end against A's close, C's grant and the ending
// watchdog's count is a case.
func TestEndingWatchdogCountsUnlockInFlight(t *testing.T) {
	for _, tc := range []struct {
		name string
		// steps, in order: "begin" and "end" (B's UNLOCK: beginUnlock;
		// the release on the nodes and endUnlock), "close" (A's
		// connection), "grant" (C's LOCK … TOKEN t KEEPALIVE), "renewed"
		// (the renewal the ending watchdog is in answers, so that it goes
		// on to count its holds), "bound" (the release bound passes).
		steps []string
		// left: the token's holds on the nodes once A's watchdog ended
		// (C's, and any left to run out its lease).
		left int
	}{
		{"UNLOCK ends before the ending watchdog counts", []string{"begin", "close", "end", "grant", "renewed"}, 1},
		{"UNLOCK ends while the ending watchdog counts", []string{"begin", "close", "grant", "renewed", "end"}, 1},
		{"UNLOCK begins after the close", []string{"close", "begin", "end", "grant", "renewed"}, 1},
		// B's UNLOCK must not take off C's KEEPALIVE hold either: that
		// would stop C's watchdog, and its lease would run out.
		{"UNLOCK begins after C's grant", []string{"close", "grant", "begin", "end", "renewed"}, 1},
		// The ending watchdog waits for the UNLOCK within the release
		// bound only; past it, it leaves the UNLOCK's hold to it. It
		// cannot tell whether that UNLOCK releases B's loose hold or
		// one it counts, and it releases no loose hold (their holders
		// were told a lease of their own): it releases none, and A's
		// hold is left to run out its lease (before, it released the
		// loose hold with its own and left one).
		{"UNLOCK ends past the release bound", []string{"begin", "close", "grant", "renewed", "bound", "end"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &countingBackend{gate: make(chan struct{}), inRenew: make(chan struct{}, 1)}
			t.Cleanup(b.open)
			k := newTestKeepalives(t, b, time.Second)
			k.release = 200 * time.Millisecond
			a := newTestConn(t, 3)
			c := newTestConn(t, 3)

			// A: LOCK k TOKEN t KEEPALIVE; B: LOCK k TOKEN t (loose).
			b.grant()
			if !k.start(a.ctx, a.ka, "k", "t", 30*time.Millisecond, 0) {
				t.Fatal("start = false")
			}
			b.grant()
			if !k.granted(context.Background(), nil, "k", "t") {
				t.Fatal("granted = false")
			}
			// The watchdog's goroutine is in a renewal.
			select {
			case <-b.inRenew:
			case <-time.After(5 * time.Second):
				t.Fatal("no renewal")
			}
			var op *unlockOp
			for _, st := range tc.steps {
				switch st {
				case "begin":
					op = k.beginUnlock("k", "t")
				case "end":
					ok, _ := b.release()
					k.endUnlock(op, ok, nil)
				case "close":
					a.cancel()
					waitEnded(t, a)
				case "grant":
					b.grant()
					if k.grantedHold(c.ctx, c.ka, "k", "t", backends.Write, true) {
						t.Fatal("C's grant counted on the ending watchdog")
					}
					if !k.start(c.ctx, c.ka, "k", "t", time.Minute, 0) {
						t.Fatal("start for C = false")
					}
				case "renewed":
					b.open()
					// Time for the ending watchdog to count and release
					// what it would without waiting for the UNLOCK.
					time.Sleep(50 * time.Millisecond)
				case "bound":
					waitFor(t, func() bool { return gaugeValue(t, k) <= 1 }, "the first watchdog's end past the bound")
				}
			}
			// The first watchdog ends, releasing A's hold only.
			waitFor(t, func() bool { return gaugeValue(t, k) <= 1 }, "the first watchdog's end")
			if n := b.holds(); n != tc.left {
				t.Errorf("the token holds the key %d times after A's watchdog ended; want %d (C's hold, kept by its watchdog, and any left to run out)", n, tc.left)
			}
			if n := c.ka.live.Load(); n != 1 || k.count() != 1 {
				t.Errorf("C's watchdogs = %d, running = %d; want 1 and 1", n, k.count())
			}
		})
	}
}

// gaugeValue is how many watchdog goroutines of k run.
func gaugeValue(t *testing.T, k *keepalives) int {
	t.Helper()
	var m dto.Metric
	if err := k.active.Write(&m); err != nil {
		t.Fatalf("reading a gauge: %v", err)
	}
	return int(m.GetGauge().GetValue())
}

// kindBackend models one token's holds of each kind: a renewal of a kind
// the token no longer holds answers 0, as extendWriteScript and
// extendReadScript do. A renewal can be held at a gate.
type kindBackend struct {
	fakeBackend
	kmu     sync.Mutex
	n       [2]int
	gate    chan struct{}
	inRenew chan backends.Mode
	renews  int // renewals answered
}

func (b *kindBackend) UnlockHold(ctx context.Context, key, token string, mode backends.Mode) (bool, error) {
	b.kmu.Lock()
	defer b.kmu.Unlock()
	if b.n[mode] == 0 {
		return false, nil
	}
	b.n[mode]--
	return true, nil
}

// unlock is UNLOCK's release: write holds first.
func (b *kindBackend) unlock() bool {
	b.kmu.Lock()
	defer b.kmu.Unlock()
	for _, m := range []backends.Mode{backends.Write, backends.Read} {
		if b.n[m] > 0 {
			b.n[m]--
			return true
		}
	}
	return false
}

func (b *kindBackend) RenewHold(ctx context.Context, key, token string, mode backends.Mode, ttl time.Duration) (time.Duration, error) {
	b.kmu.Lock()
	gate := b.gate
	b.kmu.Unlock()
	if gate != nil {
		select {
		case b.inRenew <- mode:
		default:
		}
		<-gate
	}
	b.kmu.Lock()
	defer b.kmu.Unlock()
	b.renews++
	if b.n[mode] == 0 {
		return 0, nil
	}
	return ttl, nil
}

func (b *kindBackend) renewals() int {
	b.kmu.Lock()
	defer b.kmu.Unlock()
	return b.renews
}

func (b *kindBackend) open() {
	b.kmu.Lock()
	defer b.kmu.Unlock()
	if b.gate != nil {
		close(b.gate)
		b.gate = nil
	}
}

// TestWatchdogWriteRenewalRacingUnlock: a connection holds a key with
// KEEPALIVE for writing and for reading (LOCK … TOKEN t KEEPALIVE, then
// RLOCK … TOKEN t KEEPALIVE: a downgrade), then UNLOCKs, which releases
// the write hold. A renewal of the write hold under way meanwhile finds
// no write hold: that is the UNLOCK's doing, and the read hold, still
// held, must go on being kept, not dropped (silently, or with a lock-lost
// notice). Renewals are per kind, so the one the watchdog chose before
// the UNLOCK can find nothing though the watchdog still keeps a hold.
func TestWatchdogWriteRenewalRacingUnlock(t *testing.T) {
	for _, tc := range []struct {
		name string
		// renewalEndsFirst: the renewal answers before the UNLOCK's
		// endUnlock; else after it.
		renewalEndsFirst bool
	}{
		{"renewal answers while the UNLOCK is in flight", true},
		{"renewal answers after the UNLOCK", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &kindBackend{gate: make(chan struct{}), inRenew: make(chan backends.Mode, 1)}
			t.Cleanup(b.open)
			b.n = [2]int{backends.Write: 1, backends.Read: 1}
			k := newTestKeepalives(t, b, time.Second)
			c := newTestConn(t, 3)
			if !k.startHold(c.ctx, c.ka, "k", "t", 60*time.Millisecond, 0, backends.Write, true) {
				t.Fatal("startHold = false")
			}
			k.grantedHold(c.ctx, c.ka, "k", "t", backends.Read, true)
			var mode backends.Mode
			select {
			case mode = <-b.inRenew:
			case <-time.After(5 * time.Second):
				t.Fatal("no renewal")
			}
			if mode != backends.Write {
				t.Fatalf("renewal of a %v hold; want write", mode)
			}
			op := k.beginUnlock("k", "t")
			k.whichHold(context.Background(), op)
			ok := b.unlock()
			if tc.renewalEndsFirst {
				b.open()
				time.Sleep(50 * time.Millisecond)
				k.endUnlock(op, ok, c.ka)
			} else {
				k.endUnlock(op, ok, c.ka)
				b.open()
				time.Sleep(50 * time.Millisecond)
			}
			// Renewals of the read hold go on after the UNLOCK.
			time.Sleep(100 * time.Millisecond)
			if n := k.count(); n != 1 {
				t.Errorf("%d watchdogs after UNLOCK released the write hold; want 1, keeping the read hold", n)
			}
			if _, lost := c.ka.takeLost([]byte("k")); lost || len(c.pushed()) != 0 {
				t.Errorf("lost notice %v, pushes %d; want none: the read hold is still held", lost, len(c.pushed()))
			}
		})
	}
}

// TestWatchdogRenewalFindingNothingDuringUnlock: a renewal that finds
// nothing while an UNLOCK is in flight is tried again (with the read hold
// the watchdog keeps, then at the retry interval while the lease lasts),
// but boundedly: not in a loop against the nodes. When nothing is held at
// all, the watchdog ends, and the UNLOCK's end finds it stopped. The
// UNLOCK answers for the one hold it releases, not for the other the
// connection kept: that one was lost, and the holder is told
// (TestLossNoticeWithOthersUnlockInFlight).
func TestWatchdogRenewalFindingNothingDuringUnlock(t *testing.T) {
	const ttl = 60 * time.Millisecond
	b := &kindBackend{} // the token holds nothing any more
	k := newTestKeepalives(t, b, time.Second)
	c := newTestConn(t, 3)
	if !k.startHold(c.ctx, c.ka, "k", "t", ttl, 0, backends.Write, true) {
		t.Fatal("startHold = false")
	}
	k.grantedHold(c.ctx, c.ka, "k", "t", backends.Read, true)
	op := k.beginUnlock("k", "t")
	waitEnded(t, c)
	k.endUnlock(op, true, c.ka)
	waitStopped(t, k) // the notice comes after the watchdog stops counting on c
	// Each try: a write renewal and one read renewal, every 10 ms retry
	// at most while the 60 ms lease lasts.
	if n := b.renewals(); n > 10 {
		t.Errorf("%d renewals; want a few", n)
	}
	if _, lost := c.ka.takeLost([]byte("k")); !lost || len(c.pushed()) != 1 {
		t.Errorf("lost notice %v, pushes %d; want one of each: the UNLOCK answers for one of the two holds", lost, len(c.pushed()))
	}
	if n := k.count(); n != 0 {
		t.Errorf("%d watchdogs; want 0", n)
	}
}
