package commands

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// fakeBackend records renewals and releases and answers as told. It is a
// backends.HoldKeeper: what UnlockHold and RenewHold do is counted as
// Unlock's and Renew's, with the kind they were for.
type fakeBackend struct {
	renewErr    error // Renew's error
	failFirst   int   // the first failFirst renewals fail with renewErr; 0: all do
	renewZero   bool  // Renew answers 0: not held
	unlockBlock bool  // Unlock waits for its context
	// renewGate, when set, holds each renewal until it is closed (or the
	// renewal's context ends), so that a test can do something while the
	// renewal is in flight whatever the scheduling.
	renewGate chan struct{}
	// leaseAge, when set, is how long before Lock returns its lease's
	// validity was measured (Lease.At): time the lease ran meanwhile.
	leaseAge time.Duration

	mu          sync.Mutex
	renews      []renewCall
	unlocks     int
	unlockKinds []string // each release's kind: "any" (Unlock), "write" or "read"
}

type renewCall struct {
	at   time.Time
	ttl  time.Duration
	kind string // "any" (Renew), "write" or "read"
}

func (f *fakeBackend) Lock(ctx context.Context, req backends.LockRequest) (backends.Lease, error) {
	l := backends.Lease{Token: req.Token, Validity: req.TTL, Fence: 1}
	if f.leaseAge > 0 {
		l.At = time.Now().Add(-f.leaseAge)
	}
	return l, nil
}

func (f *fakeBackend) Info(ctx context.Context, key string) (backends.LockInfo, bool, error) {
	return backends.LockInfo{}, false, nil
}

func (f *fakeBackend) Unlock(ctx context.Context, key, token string) (bool, error) {
	return f.unlock(ctx, "any")
}

func (f *fakeBackend) UnlockHold(ctx context.Context, key, token string, mode backends.Mode) (bool, error) {
	return f.unlock(ctx, mode.String())
}

func (f *fakeBackend) unlock(ctx context.Context, kind string) (bool, error) {
	f.mu.Lock()
	f.unlocks++
	f.unlockKinds = append(f.unlockKinds, kind)
	f.mu.Unlock()
	if f.unlockBlock {
		<-ctx.Done()
		return false, ctx.Err()
	}
	return true, nil
}

func (f *fakeBackend) Renew(ctx context.Context, key, token string, ttl time.Duration) (time.Duration, error) {
	return f.renew(ctx, ttl, "any")
}

func (f *fakeBackend) RenewHold(ctx context.Context, key, token string, mode backends.Mode, ttl time.Duration) (time.Duration, error) {
	return f.renew(ctx, ttl, mode.String())
}

func (f *fakeBackend) renew(ctx context.Context, ttl time.Duration, kind string) (time.Duration, error) {
	if f.renewGate != nil {
		select {
		case <-f.renewGate:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	f.mu.Lock()
	f.renews = append(f.renews, renewCall{time.Now(), ttl, kind})
	n := len(f.renews)
	f.mu.Unlock()
	switch {
	case f.renewErr != nil && (f.failFirst == 0 || n <= f.failFirst):
		return 0, f.renewErr
	case f.renewZero:
		return 0, nil
	}
	return ttl - time.Millisecond, nil
}

func (f *fakeBackend) Ready(ctx context.Context) error { return nil }
func (f *fakeBackend) Close() error                    { return nil }

func (f *fakeBackend) counts() ([]renewCall, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]renewCall(nil), f.renews...), f.unlocks
}

// kinds returns the kinds of the renewals and releases so far.
func (f *fakeBackend) kinds() (renews, unlocks []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.renews {
		renews = append(renews, r.kind)
	}
	return renews, append([]string(nil), f.unlockKinds...)
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatalf("reading a counter: %v", err)
	}
	return m.GetCounter().GetValue()
}

// testConn is a fake connection: its context, liveness and pushes.
type testConn struct {
	ka     *connKeepalive
	ctx    context.Context
	cancel context.CancelFunc
	idle   atomic.Bool // when set, the client last sent a command an hour ago
	closed atomic.Bool // connKeepalive closed the connection
	mu     sync.Mutex
	pushes [][]byte
}

func newTestConn(t *testing.T, proto int) *testConn {
	c := &testConn{}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	t.Cleanup(c.cancel)
	c.ka = newConnKeepalive(func() time.Time {
		if c.idle.Load() {
			return time.Now().Add(-time.Hour)
		}
		return time.Now()
	}, func(p []byte) bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.pushes = append(c.pushes, p)
		return true
	}, func() { c.closed.Store(true) }, proto)
	return c
}

func (c *testConn) pushed() [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([][]byte(nil), c.pushes...)
}

func newTestKeepalives(t *testing.T, b backends.Backend, idle time.Duration) *keepalives {
	return newLoggingKeepalives(t, b, idle, zap.NewNop())
}

// newObservedKeepalives is newTestKeepalives logging at info level to
// the entries it returns.
func newObservedKeepalives(t *testing.T, b backends.Backend, idle time.Duration) (*keepalives, *observer.ObservedLogs) {
	core, logs := observer.New(zap.InfoLevel)
	return newLoggingKeepalives(t, b, idle, zap.New(core)), logs
}

func newLoggingKeepalives(t *testing.T, b backends.Backend, idle time.Duration, log *zap.Logger) *keepalives {
	reg := prometheus.NewRegistry()
	held := newHeldLocks(newMetrics(reg))
	k := newKeepalives(b, held, log, idle, 0, reg)
	t.Cleanup(func() {
		k.close()
		held.close()
	})
	return k
}

// waitEnded waits (up to 5 s) until the connection's watchdogs ended.
func waitEnded(t *testing.T, c *testConn) time.Time {
	t.Helper()
	for i := 0; i < 500; i++ {
		if c.ka.live.Load() == 0 {
			return time.Now()
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("watchdog still running after 5s")
	return time.Time{}
}

// waitStopped waits until every watchdog of k has returned: a watchdog
// stops counting on its connection (waitEnded) before it has finished
// what it does last, such as setting a lock-delay.
func waitStopped(t *testing.T, k *keepalives) {
	t.Helper()
	for i := 0; i < 500; i++ {
		var m dto.Metric
		if err := k.active.Write(&m); err != nil {
			t.Fatalf("reading a gauge: %v", err)
		}
		if m.GetGauge().GetValue() == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("a watchdog goroutine still running after 5s")
}

func TestWatchdog(t *testing.T) {
	// Long enough that a loaded machine's scheduling delays (tens of ms)
	// stay well inside a renewal period.
	const ttl = 200 * time.Millisecond
	// maxHoldSlack is how much before the MAXHOLD deadline its loss may be
	// told: the fake's 1 ms short validity and the scheduling between a
	// renewal's send and its record.
	const maxHoldSlack = 5 * time.Millisecond
	noQuorum := fmt.Errorf("extend: %w", quorum.ErrNoQuorum)
	none := lostReason(255)
	for _, tc := range []struct {
		name      string
		renewErr  error
		failFirst int
		renewZero bool
		proto     int
		maxHold   time.Duration
		idle      bool // the client is idle from the start
		run       time.Duration
		// what happens after run: "close" cancels the connection,
		// "unlock" UNLOCKs the lock, "" nothing (the lock ends by itself)
		then        string
		lost        lostReason
		why         string // in the LOCKLOST notice
		minRenews   int
		maxRenews   int
		wantUnlocks int
	}{
		// The maxRenews bounds allow a renewal every 7/8 of the period
		// (TTL/3), as renewals come up to an eighth early (spread), and
		// one more.
		{name: "renews while alive, released on close", proto: 2, run: 10 * ttl, then: "close",
			lost: none, minRenews: 5, maxRenews: 35, wantUnlocks: 1},
		{name: "UNLOCK stops it without a release", proto: 3, run: 3 * ttl, then: "unlock",
			lost: none, minRenews: 1, maxRenews: 12},
		{name: "idle client: lost at the first renewal", proto: 3, idle: true,
			lost: lostIdle, why: "sent no command for 1s", maxRenews: 0},
		{name: "idle under RESP2: no push", proto: 2, idle: true,
			lost: lostIdle, why: "sent no command", maxRenews: 0},
		// A failed renewal is tried again while the lease it extends has
		// time left (200 ms lease: at +67 ms, then every 11 ms while one
		// more retry and a renewal period fit before +180 ms), then the
		// lock is lost.
		{name: "renewal without quorum", proto: 3, renewErr: noQuorum,
			lost: lostRenewFailed, why: "did not reach a quorum", minRenews: 2, maxRenews: 5},
		{name: "one renewal fails, the retry saves the lock", proto: 3, renewErr: noQuorum, failFirst: 1,
			run: 6 * ttl, then: "close", lost: none, minRenews: 3, maxRenews: 23, wantUnlocks: 1},
		{name: "renewal finds the lock gone", proto: 3, renewZero: true,
			lost: lostRenewFailed, why: "no longer held", minRenews: 1, maxRenews: 1},
		{name: "MAXHOLD ends it at the deadline", proto: 3, maxHold: 800 * time.Millisecond,
			lost: lostMaxHold, why: "MAXHOLD of 800 ms reached", minRenews: 2, maxRenews: 15},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := &fakeBackend{renewErr: tc.renewErr, failFirst: tc.failFirst, renewZero: tc.renewZero}
			k := newTestKeepalives(t, b, time.Second)
			c := newTestConn(t, tc.proto)
			c.idle.Store(tc.idle)
			start := time.Now()
			if !k.start(c.ctx, c.ka, "k", "tok", ttl, tc.maxHold) {
				t.Fatalf("start = false; want true")
			}
			if n := k.count(); n != 1 {
				t.Fatalf("count = %d; want 1", n)
			}
			time.Sleep(tc.run)
			switch tc.then {
			case "close":
				c.cancel()
			case "unlock":
				w := k.beginUnlock("k", "tok")
				k.endUnlock(w, true, c.ka)
			}
			ended := waitEnded(t, c)
			// The watchdog stops counting on the connection before it
			// releases, or tells of the loss: wait for its goroutine.
			waitStopped(t, k)
			renews, unlocks := b.counts()
			if len(renews) < tc.minRenews || len(renews) > tc.maxRenews {
				t.Errorf("%d renewals in %v; want %d to %d", len(renews), ended.Sub(start), tc.minRenews, tc.maxRenews)
			}
			for _, r := range renews {
				if r.ttl > ttl {
					t.Errorf("renewed with ttl %v; want at most the lock's %v", r.ttl, ttl)
				}
				if tc.maxHold > 0 && r.at.Add(r.ttl).After(start.Add(tc.maxHold+5*time.Millisecond)) {
					t.Errorf("renewal at +%v for %v outlasts MAXHOLD %v", r.at.Sub(start), r.ttl, tc.maxHold)
				}
			}
			// The MAXHOLD loss is told by the end of the validity last
			// answered, which ends before the deadline: the fake answers
			// each renewal 1 ms short of its lease, counted from when the
			// renewal was sent. So the end may come a few ms early, never
			// more (a renewal period early would be a hold cut short).
			if tc.maxHold > 0 && ended.Sub(start) < tc.maxHold-maxHoldSlack {
				t.Errorf("ended after %v; want within %v of the MAXHOLD deadline %v or after", ended.Sub(start), maxHoldSlack, tc.maxHold)
			}
			if unlocks != tc.wantUnlocks {
				t.Errorf("%d releases; want %d", unlocks, tc.wantUnlocks)
			}
			if n := k.count(); n != 0 {
				t.Errorf("count = %d after the end; want 0", n)
			}
			for r := lostReason(0); r < numLostReasons; r++ {
				want := 0.0
				if r == tc.lost {
					want = 1
				}
				if got := counterValue(t, k.lost[r]); got != want {
					t.Errorf("lockproxy_lock_lost_total{reason=%q} = %v; want %v", r.label(), got, want)
				}
			}
			why, lost := c.ka.takeLost([]byte("k"))
			if lost != (tc.lost != none) || !strings.Contains(why, tc.why) {
				t.Errorf("lost notice = %q, %v; want one containing %q: %v", why, lost, tc.why, tc.lost != none)
			}
			if _, again := c.ka.takeLost([]byte("k")); again {
				t.Errorf("lost notice given twice; want once")
			}
			wantPush := 0
			if tc.lost != none && tc.proto == 3 {
				wantPush = 1
			}
			pushes := c.pushed()
			if len(pushes) != wantPush {
				t.Fatalf("%d pushes %q; want %d", len(pushes), pushes, wantPush)
			}
			if wantPush == 1 {
				if want := ">3\r\n$9\r\nlock-lost\r\n$1\r\nk\r\n$3\r\ntok\r\n"; string(pushes[0]) != want {
					t.Errorf("push = %q; want %q", pushes[0], want)
				}
			}
		})
	}
}

// TestWatchdogReentrant: the watchdog counts the holds granted while it
// runs; UNLOCK stops it only with the last, and a close releases those left.
func TestWatchdogReentrant(t *testing.T) {
	b := &fakeBackend{}
	k := newTestKeepalives(t, b, time.Second)
	c := newTestConn(t, 2)
	if k.granted(c.ctx, c.ka, "k", "tok") {
		t.Fatalf("granted before start = true; want false")
	}
	k.start(c.ctx, c.ka, "k", "tok", time.Second, 0)
	for i := 0; i < 2; i++ {
		if !k.granted(c.ctx, c.ka, "k", "tok") {
			t.Fatalf("granted = false; want true while the watchdog runs")
		}
	}
	k.endUnlock(k.beginUnlock("k", "tok"), true, c.ka)
	k.endUnlock(k.beginUnlock("k", "tok"), false, c.ka) // UNLOCK :0 changes nothing
	if n := k.count(); n != 1 {
		t.Fatalf("count after one of three UNLOCKs = %d; want 1", n)
	}
	c.cancel()
	waitEnded(t, c)
	waitStopped(t, k) // the releases come after the watchdog stops counting on c
	if _, unlocks := b.counts(); unlocks != 2 {
		t.Errorf("%d releases on close; want the 2 holds left", unlocks)
	}
}

// TestWatchdogSharedToken: two connections hold one lock with the same
// token (a client's pool, reentrant holds). The lock is kept while either
// is alive; the first to close releases its own holds only, the other is
// still renewed and, when lost, told; the last close releases the rest. A
// hold granted without KEEPALIVE is released with the watchdog, and an
// UNLOCK through a connection that holds none takes one hold all the same.
func TestWatchdogSharedToken(t *testing.T) {
	b := &fakeBackend{}
	k := newTestKeepalives(t, b, time.Second)
	a, c := newTestConn(t, 3), newTestConn(t, 3)
	const ttl = 60 * time.Millisecond
	k.start(a.ctx, a.ka, "k", "tok", ttl, 0)
	if !k.granted(c.ctx, c.ka, "k", "tok") || !k.granted(c.ctx, c.ka, "k", "tok") {
		t.Fatal("granted = false; want the other connection to join the watchdog")
	}
	if !k.granted(context.Background(), nil, "k", "tok") {
		t.Fatal("granted (no KEEPALIVE) = false; want true")
	}
	a.cancel()
	waitEnded(t, a)
	waitFor(t, func() bool { _, u := b.counts(); return u == 1 }, "the closed connection's one hold released")
	renews, _ := b.counts()
	waitFor(t, func() bool { r, _ := b.counts(); return len(r) >= len(renews)+2 }, "renewals for the other connection")
	if n := k.count(); n != 1 {
		t.Fatalf("count = %d; want the watchdog still running", n)
	}

	// An UNLOCK through a third connection takes one of c's holds (there
	// is a loose one, which goes first).
	k.endUnlock(k.beginUnlock("k", "tok"), true, nil)
	k.endUnlock(k.beginUnlock("k", "tok"), true, nil)
	if n := k.count(); n != 1 {
		t.Fatalf("count after two of four UNLOCKs = %d; want 1", n)
	}
	c.cancel()
	waitEnded(t, c)
	waitStopped(t, k) // the releases come after the watchdog stops counting on c
	if n := k.count(); n != 0 {
		t.Fatalf("count after both closed = %d; want 0", n)
	}
	if _, u := b.counts(); u != 2 {
		t.Errorf("%d releases; want 2 (a's hold on its close, c's last one on its close)", u)
	}

	// Lost while two connections hold it: both are told. The renewal
	// that finds it gone is held until c2 joined: on a loaded machine it
	// could otherwise come (a third of the TTL after start) before c2's
	// grant, which then starts no watchdog of its own here. Held no longer
	// than its try's timeout (a third of the TTL), hence a longer TTL.
	b2 := &fakeBackend{renewZero: true, renewGate: make(chan struct{})}
	k2 := newTestKeepalives(t, b2, time.Second)
	a2, c2 := newTestConn(t, 3), newTestConn(t, 3)
	k2.start(a2.ctx, a2.ka, "k", "tok", 600*time.Millisecond, 0)
	if !k2.granted(c2.ctx, c2.ka, "k", "tok") {
		t.Fatal("granted = false; want the other connection to join the watchdog")
	}
	close(b2.renewGate)
	waitEnded(t, a2)
	waitEnded(t, c2)
	waitStopped(t, k2) // the notices come after the watchdog stops counting on them
	for i, conn := range []*testConn{a2, c2} {
		if _, lost := conn.ka.takeLost([]byte("k")); !lost || len(conn.pushed()) != 1 {
			t.Errorf("connection %d: lost %v, pushes %q; want the notice and one push", i, lost, conn.pushed())
		}
	}
}

// waitFor waits (up to 5 s) until cond holds.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for i := 0; i < 500; i++ {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("waited 5 s for %s", what)
}

// TestWatchdogRenewDuringUnlock: a renewal that finds the lock gone while
// an UNLOCK of it is in flight is that UNLOCK's doing, not a loss.
func TestWatchdogRenewDuringUnlock(t *testing.T) {
	// The renewal answers only once the UNLOCK is in flight: on a loaded
	// machine it could otherwise come (a third of the TTL after start)
	// before it, and be a loss indeed. It can be held no longer than its
	// try's timeout (a third of the TTL too), hence a TTL that leaves a
	// loaded machine's delays far inside both.
	b := &fakeBackend{renewZero: true, renewGate: make(chan struct{})}
	k := newTestKeepalives(t, b, time.Second)
	c := newTestConn(t, 3)
	k.start(c.ctx, c.ka, "k", "tok", 600*time.Millisecond, 0)
	w := k.beginUnlock("k", "tok")
	close(b.renewGate)
	waitEnded(t, c)
	k.endUnlock(w, true, c.ka)
	waitStopped(t, k) // a notice would come after the watchdog stops counting on c
	if _, lost := c.ka.takeLost([]byte("k")); lost || len(c.pushed()) != 0 {
		t.Errorf("lost notice %v, pushes %q; want none", lost, c.pushed())
	}
	if got := counterValue(t, k.lost[lostRenewFailed]); got != 0 {
		t.Errorf("renew_failed = %v; want 0", got)
	}
}

// TestKeepalivesClose: closing stops every watchdog, each releasing within
// the bound even when the nodes do not answer, and refuses new ones.
func TestKeepalivesClose(t *testing.T) {
	b := &fakeBackend{unlockBlock: true}
	k := newTestKeepalives(t, b, time.Second)
	k.release = 100 * time.Millisecond
	var conns []*testConn
	for i := 0; i < 20; i++ {
		c := newTestConn(t, 2)
		conns = append(conns, c)
		k.start(c.ctx, c.ka, fmt.Sprintf("k%d", i), "tok", time.Minute, 0)
	}
	start := time.Now()
	k.close()
	took := time.Since(start)
	if took > 2*time.Second {
		t.Errorf("close took %v; want about the 100ms release bound", took)
	}
	for i, c := range conns {
		if n := c.ka.live.Load(); n != 0 {
			t.Errorf("conn %d: %d watchdogs after close; want 0", i, n)
		}
	}
	if _, unlocks := b.counts(); unlocks != 20 {
		t.Errorf("%d releases; want 20", unlocks)
	}
	c := newTestConn(t, 2)
	if k.start(c.ctx, c.ka, "late", "tok", time.Minute, 0) {
		t.Errorf("start after close = true; want false")
	}
	if _, unlocks := b.counts(); unlocks != 21 {
		t.Errorf("%d releases; want the late lock released too (21)", unlocks)
	}
}

func TestKeepaliveLimitPerConn(t *testing.T) {
	k := newTestKeepalives(t, &fakeBackend{}, time.Second)
	c := newTestConn(t, 2)
	if k.full(nil) != nil || k.full(c.ka) != nil {
		t.Fatalf("full on a new connection; want not")
	}
	c.ka.live.Store(maxKeepalivePerConn)
	if err := k.full(c.ka); err != errTooManyKeepalive {
		t.Errorf("full with %d watchdogs = %v; want %v", maxKeepalivePerConn, err, errTooManyKeepalive)
	}
	c.ka.live.Store(0)
}

// TestLostNoticesPastTheBoundCloseTheConnection: a connection keeps at
// most maxKeepalivePerConn lost-lock notices waiting (it may lose that
// many locks, take as many again, and lose those too, reading none). One
// more lock lost past the bound closes the connection, on RESP2 as on
// RESP3 (where the pushes waiting past as many close it: resp.Session's
// PushHeld), and a notice already waiting for the same lock is told
// again without a close. Before, a RESP2 connection's notice past the bound
// was dropped: its client was never told that lock was lost, and went on
// relying on it.
func TestLostNoticesPastTheBoundCloseTheConnection(t *testing.T) {
	for _, proto := range []int{2, 3} {
		c := newTestConn(t, proto)
		for i := 0; i < maxKeepalivePerConn; i++ {
			c.ka.tellLost(fmt.Sprint(i), "tok", "why", 1)
		}
		c.ka.tellLost("0", "tok", "again", 1)
		if c.closed.Load() {
			t.Fatalf("RESP%d: closed at %d notices, one told again; want open until one past the bound", proto, maxKeepalivePerConn)
		}
		c.ka.tellLost("past", "tok", "why", 1)
		if !c.closed.Load() {
			t.Errorf("RESP%d: the notice past %d waiting left the connection open; want it closed, the loss never dropped silently",
				proto, maxKeepalivePerConn)
		}
		// The notices kept are given once each.
		if why, lost := c.ka.takeLostToken([]byte("0"), []byte("tok")); !lost || why != "again" {
			t.Errorf("RESP%d: notice of 0 = %q, %v; want the last told", proto, why, lost)
		}
		if _, lost := c.ka.takeLostToken([]byte("0"), []byte("tok")); lost {
			t.Errorf("RESP%d: notice of 0 given twice", proto)
		}
	}
}

func TestLostReasonLabels(t *testing.T) {
	seen := map[string]bool{}
	for r := lostReason(0); r < numLostReasons; r++ {
		seen[r.label()] = true
	}
	for _, want := range []string{"renew_failed", "idle", "maxhold"} {
		if !seen[want] {
			t.Errorf("no reason labelled %q", want)
		}
	}
}

// TestLockDelay: a KEEPALIVE lock lost without a release is kept for the
// key's lock-delay (one renewal to the delay, no release); a lost renewal
// cannot be, and keys without a rule are released as usual.
func TestLockDelay(t *testing.T) {
	const ttl = 60 * time.Millisecond
	const delay = 5 * time.Second
	for _, tc := range []struct {
		name        string
		key         string
		idle        bool
		renewZero   bool
		wantDelay   bool
		wantUnlocks int
	}{
		{name: "connection closed: delayed", key: "order:1", wantDelay: true},
		{name: "idle: delayed", key: "order:1", idle: true, wantDelay: true},
		{name: "renewal found it gone: nothing to delay", key: "order:1", renewZero: true},
		{name: "no rule: released", key: "other", wantUnlocks: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := &fakeBackend{renewZero: tc.renewZero}
			k := newTestKeepalives(t, b, time.Second)
			k.delayFor = (&Limits{LockDelays: []LockDelay{{Pattern: "order:*", Delay: delay}}}).lockDelay
			c := newTestConn(t, 3)
			c.idle.Store(tc.idle)
			if !k.start(c.ctx, c.ka, tc.key, "tok", ttl, 0) {
				t.Fatalf("start = false")
			}
			if !tc.idle && !tc.renewZero {
				time.Sleep(ttl / 2)
				c.cancel()
			}
			waitEnded(t, c)
			waitStopped(t, k)
			renews, unlocks := b.counts()
			delayed := 0
			for _, r := range renews {
				if r.ttl == delay {
					delayed++
				}
			}
			if (delayed == 1) != tc.wantDelay || delayed > 1 {
				t.Errorf("%d renewals to the delay; want delayed=%v", delayed, tc.wantDelay)
			}
			if unlocks != tc.wantUnlocks {
				t.Errorf("%d releases; want %d", unlocks, tc.wantUnlocks)
			}
			if got := counterValue(t, k.delayed); (got == 1) != tc.wantDelay {
				t.Errorf("lockproxy_lock_delays_total = %v; want delayed=%v", got, tc.wantDelay)
			}
		})
	}
}

// TestLostByBackend: a backend that reports a lost lock by itself ends its
// watchdog at once, with the push and the LOCKLOST notice, and no release.
func TestLostByBackend(t *testing.T) {
	b := &fakeBackend{}
	k := newTestKeepalives(t, b, time.Minute)
	c := newTestConn(t, 3)
	if !k.start(c.ctx, c.ka, "k", "tok", time.Minute, 0) {
		t.Fatal("start = false")
	}
	k.lostByBackend("k", "other") // not this lock: nothing happens
	if n := k.count(); n != 1 {
		t.Fatalf("%d watchdogs after a loss of another token; want 1", n)
	}
	k.lostByBackend("k", "tok")
	waitEnded(t, c)
	if _, unlocks := b.counts(); unlocks != 0 {
		t.Errorf("%d releases; want 0", unlocks)
	}
	if why, lost := c.ka.takeLost([]byte("k")); !lost || !strings.Contains(why, "reported it lost") {
		t.Errorf("lost notice = %q, %v; want the backend's report", why, lost)
	}
	if p := c.pushed(); len(p) != 1 {
		t.Errorf("%d pushes; want 1", len(p))
	}
}

// TestKeepaliveLimitPerServer: past locks.max_keepalive watchdogs over
// all connections, one more KEEPALIVE lock is refused on any connection,
// also one far below its own bound, and there is room again once one
// ends. Without it, many connections could each start the per-connection
// bound's worth of watchdogs.
func TestKeepaliveLimitPerServer(t *testing.T) {
	k := newTestKeepalives(t, &fakeBackend{}, time.Minute)
	k.max, k.errFull = 2, tooManyKeepaliveServer(2)
	a, b, c := newTestConn(t, 2), newTestConn(t, 2), newTestConn(t, 2)
	for i, conn := range []*testConn{a, b} {
		if err := k.full(conn.ka); err != nil {
			t.Fatalf("full before lock %d = %v; want room", i, err)
		}
		if !k.start(conn.ctx, conn.ka, fmt.Sprint("key", i), "tok", time.Minute, 0) {
			t.Fatalf("start %d = false", i)
		}
	}
	err := k.full(c.ka)
	if err == nil || !strings.Contains(err.Error(), "on this server (limit 2, locks.max_keepalive)") {
		t.Fatalf("full with 2 of 2 watchdogs = %v; want the server's refusal", err)
	}
	a.cancel() // the holder's connection closes: its watchdog releases and ends
	deadline := time.Now().Add(5 * time.Second)
	for k.full(c.ka) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("still full 5 s after a holder's connection closed")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
