package commands

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/backends/redis"
)

// closeRaceBackend is a real RedLock backend whose next renewal, and next
// release of one hold (UnlockHold: only watchdogs release that way here),
// run hooks set for one call each: they hold a watchdog's goroutine where
// the handler allows it to be when a holder's connection closes and an
// UNLOCK of the token runs on another.
type closeRaceBackend struct {
	*redis.Backend
	mu sync.Mutex
	// renew runs before the next renewal goes to the nodes.
	renew func(ctx context.Context)
	// beforeRelease runs before the next release goes to the nodes,
	// afterRelease once it landed, before its reply is returned.
	beforeRelease, afterRelease func()
	// infoErr, when set, is Info's answer: the lock store cannot tell
	// how many holds a token has.
	infoErr error
}

func (b *closeRaceBackend) Info(ctx context.Context, key string) (backends.LockInfo, bool, error) {
	b.mu.Lock()
	err := b.infoErr
	b.mu.Unlock()
	if err != nil {
		return backends.LockInfo{}, false, err
	}
	return b.Backend.Info(ctx, key)
}

func (b *closeRaceBackend) RenewHold(ctx context.Context, key, token string, mode backends.Mode, ttl time.Duration) (time.Duration, error) {
	b.beforeRenew(ctx)
	return b.Backend.RenewHold(ctx, key, token, mode, ttl)
}

// RenewHoldFrom is what the watchdog calls (backends.HoldRenewerFrom):
// without it, the embedded Backend's would be called, past the hook.
func (b *closeRaceBackend) RenewHoldFrom(ctx context.Context, key, token string, mode backends.Mode, ttl time.Duration) (time.Duration, time.Time, error) {
	b.beforeRenew(ctx)
	return b.Backend.RenewHoldFrom(ctx, key, token, mode, ttl)
}

func (b *closeRaceBackend) beforeRenew(ctx context.Context) {
	b.mu.Lock()
	f := b.renew
	b.renew = nil
	b.mu.Unlock()
	if f != nil {
		f(ctx)
	}
}

func (b *closeRaceBackend) UnlockHold(ctx context.Context, key, token string, mode backends.Mode) (bool, error) {
	b.mu.Lock()
	before, after := b.beforeRelease, b.afterRelease
	b.beforeRelease, b.afterRelease = nil, nil
	b.mu.Unlock()
	if before != nil {
		before()
	}
	ok, err := b.Backend.UnlockHold(ctx, key, token, mode)
	if after != nil {
		after()
	}
	return ok, err
}

// keepOnce takes key for tok on be with KEEPALIVE through c, as LOCK …
// TOKEN tok KEEPALIVE does.
func keepOnce(ctx context.Context, t *testing.T, k *keepalives, be backends.Backend, c *testConn, key, tok string, ttl time.Duration) {
	t.Helper()
	start := time.Now()
	l, err := be.Lock(ctx, backends.LockRequest{Key: key, Token: tok, TTL: ttl})
	if err != nil {
		t.Fatalf("LOCK: %v", err)
	}
	g := grantTiming{sent: start, validity: l.Validity, begun: start, holds: l.Holds}
	if !k.grantedGrant(c.ctx, c.ka, key, tok, backends.Write, true, ttl, 0, g) &&
		!k.startGrant(c.ctx, c.ka, key, tok, ttl, 0, backends.Write, true, g) {
		t.Fatal("LOCK not kept")
	}
}

// TestPooledUnlockRacingHoldersClose: connections A and B hold k with one
// token, each with KEEPALIVE (a client's pool). B closes, and before the
// watchdog's release of B's hold is done the client's pool UNLOCKs k with
// the token through connection C. The client took two holds; B's close
// released one and C's UNLOCK the other: it holds nothing, as when the
// close's release lands before the UNLOCK, where the watchdog takes A's
// hold off quietly (TestPooledUnlockOfKeepaliveLockIsNoLoss in
// test/e2e). Here too the watchdog must stop, the key end free, and A be
// told nothing. The UNLOCK asked the nodes how many holds were left while
// B's was still there, took the answer (1, as many as the watchdog's
// live holders count) for a release of a hold it does not count, and
// kept A's hold counted: B's release then freed the key, and A's next
// renewal found nothing and told A its lock lost (a lock-lost push, and
// -LOCKLOST for its next LOCK … TOKEN of the key).
//
// Also, as a guard: the token held k without KEEPALIVE before A took it
// (a hold the watchdog does not count), B's release landed but its reply
// is slow, and the UNLOCK (of that plain hold) asks meanwhile: the
// answer (1: A's) is not to be read against the holds counted before B's
// release landed, which would take A's hold, still on the nodes, for
// released, and stop renewing it without a word.
func TestPooledUnlockRacingHoldersClose(t *testing.T) {
	const ttl = 900 * time.Millisecond
	for _, tc := range []struct {
		name string
		// plain: the token held k without KEEPALIVE before A took it,
		// and C's UNLOCK releases that hold.
		plain bool
		// stage: where B's release is when C's UNLOCK asks: "drop"
		// (not taken: the watchdog's goroutine is in a renewal),
		// "sent" (on its way, not landed), "landed" (landed, reply
		// not back).
		stage string
	}{
		{"close during a renewal", false, "drop"},
		{"release of the closed hold not landed", false, "sent"},
		{"plain hold, release of the closed hold landed, reply slow", true, "landed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be := &closeRaceBackend{Backend: newRealRedLock(t, 3)}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			k := newTestKeepalives(t, be, time.Minute)
			a, b, c := newTestConn(t, 3), newTestConn(t, 3), newTestConn(t, 3)
			const key, tok = "unlock-racing-close", "t-racing-close"
			if tc.plain {
				if _, err := be.Lock(ctx, backends.LockRequest{Key: key, Token: tok, TTL: 10 * time.Second}); err != nil {
					t.Fatalf("plain LOCK: %v", err)
				}
			}
			keepOnce(ctx, t, k, be, a, key, tok, ttl)
			keepOnce(ctx, t, k, be, b, key, tok, ttl)

			gate := make(chan struct{}) // lets the held renewal or release go on
			var once sync.Once
			open := func() { once.Do(func() { close(gate) }) }
			defer open()
			reached := make(chan struct{}, 1)
			be.mu.Lock()
			switch tc.stage {
			case "drop":
				be.renew = func(ctx context.Context) {
					reached <- struct{}{}
					select {
					case <-gate:
					case <-ctx.Done():
					}
				}
			case "sent":
				be.beforeRelease = func() {
					reached <- struct{}{}
					<-gate
				}
			case "landed":
				be.afterRelease = func() {
					reached <- struct{}{}
					<-gate
				}
			}
			be.mu.Unlock()
			if tc.stage == "drop" {
				select { // the watchdog's goroutine is in its renewal
				case <-reached:
				case <-time.After(5 * time.Second):
					t.Fatal("no renewal")
				}
			}
			b.cancel()
			waitEnded(t, b) // B's hold is for the watchdog to release
			if tc.stage != "drop" {
				select {
				case <-reached:
				case <-time.After(5 * time.Second):
					t.Fatal("B's hold not released")
				}
			}

			// C's UNLOCK, as Handler.unlock runs it.
			op := k.beginUnlock(key, tok)
			k.whichHold(ctx, op)
			if ok, err := be.Backend.Unlock(ctx, key, tok); err != nil || !ok {
				t.Fatalf("C's UNLOCK = %v, %v", ok, err)
			}
			// The held renewal or release goes on a little later,
			// while endUnlock may wait for it.
			go func() {
				time.Sleep(100 * time.Millisecond)
				open()
			}()
			unlocked := time.Now()
			k.endUnlock(op, true, c.ka)
			running := k.count()
			open()

			if tc.plain {
				// A's hold is all the token has left, and A relies on
				// it: kept, renewed past its TTL, A told nothing.
				time.Sleep(2 * ttl)
				if _, held, err := be.Info(ctx, key); err != nil || !held {
					t.Errorf("A's hold gone %v after the UNLOCK of the plain hold (err %v); want it kept (watchdogs running after endUnlock: %d)",
						time.Since(unlocked).Round(time.Millisecond), err, running)
				}
				if why, lost := a.ka.takeLost([]byte(key)); lost || len(a.pushed()) != 0 {
					t.Errorf("A told %q, pushes %q; want nothing", why, a.pushed())
				}
				if n := k.count(); n != 1 {
					t.Errorf("watchdogs running = %d; want 1 (A's)", n)
				}
				return
			}

			// Both holds were released: the key ends free, and A was
			// told nothing.
			var free time.Duration
			waitFor(t, func() bool {
				_, held, err := be.Info(ctx, key)
				free = time.Since(unlocked)
				return err == nil && !held
			}, "the key free")
			if running != 0 {
				// The watchdog still counts A's hold though the key is
				// free: see when A is told.
				var told time.Duration
				for end := time.Now().Add(2 * ttl); time.Now().Before(end) && told == 0; time.Sleep(5 * time.Millisecond) {
					if len(a.pushed()) != 0 {
						told = time.Since(unlocked)
					}
				}
				t.Errorf("after the UNLOCK the watchdog still counted A's hold (%d running); the key was free %v after the UNLOCK, and A got a lock-lost push %v after it (0: none within %v)",
					running, free.Round(time.Millisecond), told.Round(time.Millisecond), 2*ttl)
			}
			waitStopped(t, k)
			if why, lost := a.ka.takeLost([]byte(key)); lost {
				t.Errorf("A told %q; want nothing: the client released both holds it took", why)
			}
			if p := a.pushed(); len(p) != 0 {
				t.Errorf("A's pushes = %q; want none", p)
			}
			for r := lostReason(0); r < numLostReasons; r++ {
				if got := counterValue(t, k.lost[r]); got != 0 {
					t.Errorf("lockproxy_lock_lost_total{reason=%q} = %v; want 0", r.label(), got)
				}
			}
		})
	}
}

// TestReentrantGrantAfterEndedWatchdogsRelease: connection A held k with
// KEEPALIVE and closed; its watchdog counted the hold it releases and
// its release is on its way to the nodes when connection B takes k with
// the same token and KEEPALIVE. B's grant is reentrant on the nodes (its
// reply counts 2 holds, A's among them), and B's watchdog starts with
// nobody else's hold to count: A's release then lands, and B's is the
// token's only hold. The client's pool UNLOCKs k with the token through
// connection C, releasing B's hold, while the lock store cannot say how
// many holds the token has left. B's watchdog must not take A's vanished
// hold for one it does not count (uncounted), and the UNLOCK for its
// release: B's lock is gone, and B is told at once (reason unlocked), as
// when nothing else held k, not at its next renewal, up to a third of the
// TTL later, while the key is free for a rival.
func TestReentrantGrantAfterEndedWatchdogsRelease(t *testing.T) {
	const ttl = 900 * time.Millisecond
	be := &closeRaceBackend{Backend: newRealRedLock(t, 3)}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	k := newTestKeepalives(t, be, time.Minute)
	a, b, c := newTestConn(t, 3), newTestConn(t, 3), newTestConn(t, 3)
	const key, tok = "grant-after-release", "t-grant-after"
	keepOnce(ctx, t, k, be, a, key, tok, ttl)
	gate, reached := make(chan struct{}), make(chan struct{}, 1)
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	defer open()
	be.mu.Lock()
	be.beforeRelease = func() {
		reached <- struct{}{}
		<-gate
	}
	be.mu.Unlock()
	a.cancel()
	select { // A's watchdog counted A's hold and is releasing it
	case <-reached:
	case <-time.After(5 * time.Second):
		t.Fatal("A's hold not released")
	}
	keepOnce(ctx, t, k, be, b, key, tok, ttl)
	open()
	waitFor(t, func() bool {
		info, held, err := be.Backend.Info(ctx, key)
		return err == nil && held && len(info.Holders) == 1 && info.Holders[0].Holds == 1
	}, "A's release landed, B's hold left")

	be.mu.Lock()
	be.infoErr = errors.New("no quorum")
	be.mu.Unlock()
	op := k.beginUnlock(key, tok)
	k.whichHold(ctx, op)
	if ok, err := be.Backend.Unlock(ctx, key, tok); err != nil || !ok {
		t.Fatalf("C's UNLOCK = %v, %v", ok, err)
	}
	unlocked := time.Now()
	k.endUnlock(op, true, c.ka)
	if _, held, err := be.Backend.Info(ctx, key); err != nil || held {
		t.Fatalf("Info after C's UNLOCK = held %v, %v; want the key free (the premise)", held, err)
	}
	why, lost := b.ka.takeLost([]byte(key))
	if !lost {
		var told time.Duration
		for end := time.Now().Add(2 * ttl); time.Now().Before(end) && told == 0; time.Sleep(5 * time.Millisecond) {
			if len(b.pushed()) != 0 {
				told = time.Since(unlocked)
			}
		}
		why, _ = b.ka.takeLost([]byte(key))
		t.Fatalf("B not told at the UNLOCK that released its only hold (watchdogs running: %d); told %q %v after it (0: not within %v)",
			k.count(), why, told.Round(time.Millisecond), 2*ttl)
	}
	if got := counterValue(t, k.lost[lostUnlocked]); got != 1 {
		t.Errorf("B told %q; lockproxy_lock_lost_total{reason=\"unlocked\"} = %v, want 1", why, got)
	}
	if n := k.count(); n != 0 {
		t.Errorf("watchdogs running = %d; want 0", n)
	}
}
