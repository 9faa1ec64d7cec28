package commands

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// blockingRenewBackend is fakeBackend whose renewals wait until the test
// lets them go (a renewal on its way to slow nodes: Quorum.Extend waits for
// the nodes even when the watchdog's context is canceled).
type blockingRenewBackend struct {
	fakeBackend
	renewing chan struct{} // gets one value as a renewal starts
	proceed  chan struct{} // closed to let renewals answer
}

func (b *blockingRenewBackend) Renew(ctx context.Context, key, token string, ttl time.Duration) (time.Duration, error) {
	b.block()
	return b.fakeBackend.Renew(ctx, key, token, ttl)
}

func (b *blockingRenewBackend) RenewHold(ctx context.Context, key, token string, mode backends.Mode, ttl time.Duration) (time.Duration, error) {
	b.block()
	return b.fakeBackend.RenewHold(ctx, key, token, mode, ttl)
}

func (b *blockingRenewBackend) block() {
	select {
	case b.renewing <- struct{}{}:
	default:
	}
	<-b.proceed
}

// TestWatchdogJoinWhileEnding: connection A, the only KEEPALIVE holder of
// a lock, closes while its watchdog is in a renewal; connection B, alive,
// is granted a hold of the same lock with the same token (LOCK … TOKEN t
// KEEPALIVE, reentrant, or a first grant racing start) before the
// watchdog's goroutine has seen the close. B was just told it holds the
// lock, so B's hold must be kept (renewed by a watchdog, not released with
// A's): a watchdog that is ending may not take new holders.
func TestWatchdogJoinWhileEnding(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start bool // B goes through start (a first grant) rather than granted
	}{
		{"B granted a reentrant KEEPALIVE hold", false},
		{"B's first KEEPALIVE grant starts a watchdog", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &blockingRenewBackend{renewing: make(chan struct{}, 1), proceed: make(chan struct{})}
			k := newTestKeepalives(t, b, time.Second)
			a, c := newTestConn(t, 3), newTestConn(t, 3)
			const ttl = 90 * time.Millisecond
			if !k.start(a.ctx, a.ka, "k", "tok", ttl, 0) {
				t.Fatal("start = false")
			}
			select {
			case <-b.renewing:
			case <-time.After(5 * time.Second):
				t.Fatal("no renewal within 5 s")
			}
			a.cancel() // A's connection closes during the renewal
			waitEnded(t, a)
			// B's LOCK was granted by the nodes meanwhile.
			if tc.start || !k.granted(c.ctx, c.ka, "k", "tok") {
				if !k.start(c.ctx, c.ka, "k", "tok", ttl, 0) {
					t.Fatal("start for B = false")
				}
			}
			close(b.proceed)
			// A's watchdog ends (its goroutine returns, its release
			// done) however late it runs; then B's keeps the lock.
			waitFor(t, func() bool { return gaugeValue(t, k) <= 1 }, "A's watchdog's end")
			time.Sleep(3 * ttl)
			_, unlocks := b.counts()
			if unlocks != 1 {
				t.Errorf("%d releases; want 1 (A's hold only, B is alive)", unlocks)
			}
			if n := c.ka.live.Load(); n != 1 {
				t.Errorf("B's running watchdogs = %d; want 1", n)
			}
			if n := k.count(); n != 1 {
				t.Errorf("watchdogs = %d; want 1 (B's lock kept alive)", n)
			}
			if _, lost := c.ka.takeLost([]byte("k")); !lost && k.count() == 0 {
				t.Errorf("B's hold ended without a lost-lock notice or push (pushes %q)", c.pushed())
			}
		})
	}
}

// infoBackend is fakeBackend whose Info answers as told, counting calls.
type infoBackend struct {
	fakeBackend
	info    backends.LockInfo
	held    bool
	infoErr error
	asked   atomic.Int32
}

func (b *infoBackend) Info(ctx context.Context, key string) (backends.LockInfo, bool, error) {
	b.asked.Add(1)
	return b.info, b.held, b.infoErr
}

// TestUnlockTakesOffTheKindReleased: the backend's UNLOCK releases a
// token's write hold before its read holds. A watchdog must take off the
// kind of hold the UNLOCK released: after a downgrade (LOCK … TOKEN t,
// then RLOCK … TOKEN t KEEPALIVE), the UNLOCK that releases the write
// hold must leave the KEEPALIVE read hold's watchdog running, or the read
// hold expires while its client believes it holds it. Where the
// watchdog's counts cannot tell (read holds only, the client's own token)
// the backend is asked; a token lockproxy made cannot hold a write hold
// unseen, so nothing is asked for it.
func TestUnlockTakesOffTheKindReleased(t *testing.T) {
	writeHeldBy := func(tok string) backends.LockInfo {
		return backends.LockInfo{Mode: backends.Write, Holders: []backends.Holder{{Token: tok, Holds: 1}}}
	}
	type step struct {
		mode      backends.Mode // the hold granted with KEEPALIVE
		unlock    bool          // or an UNLOCK
		wantAlive bool          // the watchdog runs after this step
	}
	for _, tc := range []struct {
		name      string
		shared    bool // the client's own token
		info      backends.LockInfo
		held      bool
		infoErr   error
		steps     []step
		wantAsked int32
	}{
		{name: "downgrade: UNLOCK releases the write hold the watchdog does not count", shared: true,
			info: writeHeldBy("tok"), held: true,
			steps:     []step{{mode: backends.Read, wantAlive: true}, {unlock: true, wantAlive: true}},
			wantAsked: 1},
		{name: "read hold only: UNLOCK releases it", shared: true,
			info: backends.LockInfo{Mode: backends.Read, Holders: []backends.Holder{{Token: "tok", Holds: 1}}}, held: true,
			steps:     []step{{mode: backends.Read, wantAlive: true}, {unlock: true, wantAlive: false}},
			wantAsked: 1},
		{name: "another token writes: UNLOCK releases the read hold", shared: true,
			info: writeHeldBy("other"), held: true,
			steps:     []step{{mode: backends.Read, wantAlive: true}, {unlock: true, wantAlive: false}},
			wantAsked: 1},
		{name: "the backend cannot tell: the watchdog goes on", shared: true,
			infoErr:   quorum.ErrNoQuorum,
			steps:     []step{{mode: backends.Read, wantAlive: true}, {unlock: true, wantAlive: true}},
			wantAsked: 1},
		{name: "token lockproxy made: nothing asked", shared: false,
			info: writeHeldBy("tok"), held: true,
			steps:     []step{{mode: backends.Read, wantAlive: true}, {unlock: true, wantAlive: false}},
			wantAsked: 0},
		// The first UNLOCK is settled by the counts; by the second the
		// backend has the read hold only.
		{name: "KEEPALIVE write and read: the first UNLOCK ends the write hold", shared: true,
			info: backends.LockInfo{Mode: backends.Read, Holders: []backends.Holder{{Token: "tok", Holds: 1}}}, held: true,
			steps: []step{{mode: backends.Write, wantAlive: true}, {mode: backends.Read, wantAlive: true},
				{unlock: true, wantAlive: true}, {unlock: true, wantAlive: false}},
			wantAsked: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &infoBackend{info: tc.info, held: tc.held, infoErr: tc.infoErr}
			k := newTestKeepalives(t, b, time.Minute)
			c := newTestConn(t, 3)
			for i, st := range tc.steps {
				if st.unlock {
					op := k.beginUnlock("k", "tok")
					k.whichHold(context.Background(), op)
					k.endUnlock(op, true, c.ka)
				} else if !k.grantedHold(c.ctx, c.ka, "k", "tok", st.mode, tc.shared) &&
					!k.startHold(c.ctx, c.ka, "k", "tok", time.Minute, 0, st.mode, tc.shared) {
					t.Fatalf("step %d: startHold = false", i)
				}
				if alive := k.count() == 1; alive != st.wantAlive {
					t.Fatalf("step %d (%+v): watchdog running = %v; want %v", i, st, alive, st.wantAlive)
				}
			}
			if n := b.asked.Load(); n != tc.wantAsked {
				t.Errorf("Info asked %d times; want %d", n, tc.wantAsked)
			}
		})
	}
}

// TestShutdownReleasesInsteadOfDelay: once the server is shutting down, a
// KEEPALIVE lock whose connection it closes is released, not kept for its
// key's lock-delay: its holder did not lose it ("On shutdown lockproxy
// releases every keepalive lock").
func TestShutdownReleasesInsteadOfDelay(t *testing.T) {
	for _, tc := range []struct {
		name        string
		shutdown    bool
		wantUnlocks int
	}{
		{"connection closed: delayed", false, 0},
		{"server shutting down: released", true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &fakeBackend{}
			k := newTestKeepalives(t, b, time.Second)
			k.delayFor = (&Limits{LockDelays: []LockDelay{{Pattern: "order:*", Delay: 5 * time.Second}}}).lockDelay
			c := newTestConn(t, 3)
			if !k.start(c.ctx, c.ka, "order:1", "tok", time.Minute, 0) {
				t.Fatal("start = false")
			}
			if tc.shutdown {
				k.shuttingDown()
			}
			c.cancel()
			waitEnded(t, c)
			k.close() // waits for the watchdog's goroutine
			if _, unlocks := b.counts(); unlocks != tc.wantUnlocks {
				t.Errorf("%d releases; want %d", unlocks, tc.wantUnlocks)
			}
		})
	}
}
