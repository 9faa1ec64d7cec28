package zookeeper

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestGrantTimerKeepsLeaseOfReentryMadeBeforeIt: a LOCK of token T waits
// behind H. H is released, and before the waiting LOCK looks again,
// another LOCK of T through the same instance finds the waiter's node
// granted (nothing blocks it) and reenters it, with a longer TTL: it is
// told a validity of about that TTL (the node is in this instance's
// session). The waiting LOCK then completes its grant: its lease timer
// must not end the node before the validity the reentry was told, or a
// rival is granted the key while the reentry's holder still counts on it
// (two holders); and it must answer the node's hold count, which counts
// the reentry's hold.
func TestGrantTimerKeepsLeaseOfReentryMadeBeforeIt(t *testing.T) {
	t.Parallel() // mostly waits on lease timers, in a root of its own
	root := testRoot(t)
	a := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	b := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	for _, tc := range []struct {
		name       string
		first      time.Duration // TTL of the waiting LOCK
		reentry    time.Duration // TTL of the LOCK that reenters its node
		reentryMod backends.Mode
		holds      int64 // the waiting LOCK's write holds after its grant
	}{
		{"write reentry", 1500 * time.Millisecond, 8 * time.Second, backends.Write, 2},
		{"read reentry (downgrade)", 1500 * time.Millisecond, 8 * time.Second, backends.Read, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "grant-" + strings.NewReplacer(" ", "-", "(", "", ")", "").Replace(tc.name)
			mustLock(t, b, key, "H", 30*time.Second, backends.Write)
			type res struct {
				l   backends.Lease
				at  time.Time
				err error
			}
			second := make(chan res, 1)
			var once sync.Once
			// Run by the waiting LOCK before it sets its watch on H: H goes,
			// and the second LOCK of T comes in before the waiter looks again.
			a.testBeforeWatch = func(string) {
				once.Do(func() {
					unlock(t, b, key, "H")
					l, err := lock(t, a, key, "T", tc.reentry, 0, tc.reentryMod)
					second <- res{l, time.Now(), err}
				})
			}
			defer func() { a.testBeforeWatch = nil }()
			l1, err := lock(t, a, key, "T", tc.first, 20*time.Second, backends.Write)
			if err != nil {
				t.Fatalf("waiting LOCK: %v", err)
			}
			r2 := <-second
			if r2.err != nil {
				t.Fatalf("second LOCK of T: %v", r2.err)
			}
			until := r2.at.Add(r2.l.Validity)
			t.Logf("waiting LOCK: %+v; second LOCK (before its grant): %+v", l1, r2.l)
			if l1.Holds != tc.holds || l1.Fence != r2.l.Fence {
				t.Errorf("waiting LOCK = %d holds on fence %d; want the node's %d on fence %d", l1.Holds, l1.Fence, tc.holds, r2.l.Fence)
			}
			for time.Now().Before(until.Add(-100 * time.Millisecond)) {
				l, err := lock(t, b, key, "U", time.Second, 0, backends.Write)
				if err == nil && time.Now().After(until) {
					grantedLate(t, until)
					break
				}
				if err == nil {
					t.Fatalf("token U granted (fence %d) %v before the end of the validity (%v) told to the second LOCK of T: two holders",
						l.Fence, time.Until(until).Round(time.Millisecond), r2.l.Validity)
				}
				if !errors.Is(err, backends.ErrNotAcquired) {
					t.Fatalf("LOCK U: %v", err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			for unlock(t, a, key, "T") {
			}
		})
	}
}

// TestGrantValidityNotStretchedByStalledWakeWrite: a grant with a LOCK of
// its token queued behind it rewrites its node (the wake-up write) to wake
// that LOCK. The grant must not wait for that write, and the validity it
// answers must end before the creating instance's lease timer deletes the
// node: computed before a write held up by a connection that stalls (cut,
// healed a few seconds later; the session lives on) and answered after
// it, it made the holder count on the key seconds after the node was
// deleted and a rival granted (two holders).
func TestGrantValidityNotStretchedByStalledWakeWrite(t *testing.T) {
	t.Parallel() // mostly waits on lease timers, in a root of its own
	root := testRoot(t)
	link := harness.StartLink(t, zkAddr)
	a := newBackend(t, []string{link.Addr()}, root, 10*time.Second)
	b := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	const ttl = 4 * time.Second
	for _, tc := range []struct {
		name  string
		stall time.Duration // how long the wake-up write is held up
	}{
		{"stalled 3s", 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "wakevalidity-" + strings.ReplaceAll(tc.name, " ", "-")
			mustLock(t, b, key, "H", 30*time.Second, backends.Write)
			var once sync.Once
			a.testBeforeWake = func() {
				once.Do(func() {
					t.Logf("wake-up write: link cut")
					link.Cut()
					time.AfterFunc(tc.stall, link.Heal)
				})
			}
			defer func() { a.testBeforeWake = nil }()
			type res struct {
				l   backends.Lease
				at  time.Time
				err error
			}
			first := make(chan res, 1)
			go func() {
				l, err := lock(t, a, key, "T", ttl, 20*time.Second, backends.Write)
				first <- res{l, time.Now(), err}
			}()
			waitFor(t, "the first LOCK queued", func() bool { return a.Waiting() == 1 })
			// A LOCK of T queued behind it, with a WAIT that ends during the
			// stall (its last look reenters T's node, keeping its lease: a
			// short TTL): the grant writes to wake it.
			go lock(t, b, key, "T", 500*time.Millisecond, tc.stall/2, backends.Write)
			waitFor(t, "the second LOCK queued", func() bool { return b.Waiting() == 1 })
			time.Sleep(100 * time.Millisecond)
			released := time.Now()
			unlock(t, b, key, "H")
			r1 := <-first
			t.Logf("first LOCK answered %v after H's release", r1.at.Sub(released).Round(time.Millisecond))
			if r1.err != nil {
				t.Fatalf("first LOCK: %v", r1.err)
			}
			if d := r1.at.Sub(released); d >= tc.stall {
				t.Errorf("first LOCK answered %v after H's release; want no wait for the stalled wake-up write (%v)", d.Round(time.Millisecond), tc.stall)
			}
			until := r1.at.Add(r1.l.Validity)
			t.Logf("first LOCK answered %+v; the holder counts on the key for %v more", r1.l, time.Until(until).Round(time.Millisecond))
			waitFor(t, "instance a back", func() bool { return a.Ready(context.Background()) == nil })
			for time.Now().Before(until.Add(-100 * time.Millisecond)) {
				l, err := lock(t, b, key, "U", time.Second, 0, backends.Write)
				if err == nil && time.Now().After(until) {
					grantedLate(t, until)
					break
				}
				if err == nil {
					t.Fatalf("token U granted (fence %d) %v before the end of the validity T's holder was told (%v): two holders",
						l.Fence, time.Until(until).Round(time.Millisecond), r1.l.Validity)
				}
				if !errors.Is(err, backends.ErrNotAcquired) {
					t.Fatalf("LOCK U: %v", err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			for unlock(t, b, key, "T") {
			}
		})
	}
}

// TestLeaseTimerWaitsForChangeInFlight: a reentry (or RenewHold of a node
// with both kinds) through the creating instance that keeps the node's
// stored lease changes the node's version but not its lease's start and
// TTL. That stored lease may have been started through an instance whose
// clock is ahead (simulated here by writing a start 3 s ahead): as stored
// it ends after the creating instance's timer, so the change fits in it
// and is told a validity past the timer's end, which only its written
// moves. The timer firing between the change's write and its written took
// the change for one that left the lease ended and deleted the node at
// once: a rival was granted while the holder still counted on the key.
func TestLeaseTimerWaitsForChangeInFlight(t *testing.T) {
	t.Parallel() // mostly waits on lease timers, in a root of its own
	root := testRoot(t)
	a := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	b := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	const (
		ttl    = time.Second     // the grant's, and the lease stored ahead
		skew   = 3 * time.Second // how far ahead the stored start is
		change = 2500 * time.Millisecond
	)
	for _, tc := range []struct {
		name   string
		setup  func(t *testing.T, key string)
		change func(t *testing.T, key string) (time.Duration, error)
	}{
		{"reentry",
			func(t *testing.T, key string) { mustLock(t, a, key, "T", ttl, backends.Write) },
			func(t *testing.T, key string) (time.Duration, error) {
				l, err := lock(t, a, key, "T", change, 0, backends.Write)
				return l.Validity, err
			}},
		{"RenewHold of a downgraded node",
			func(t *testing.T, key string) {
				mustLock(t, a, key, "T", ttl, backends.Write)
				mustLock(t, a, key, "T", ttl, backends.Read)
			},
			func(t *testing.T, key string) (time.Duration, error) {
				return a.RenewHold(ctxT(t, 30*time.Second), key, "T", backends.Read, change)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "inflight-" + strings.NewReplacer(" ", "-").Replace(tc.name)
			tc.setup(t, key)
			n, ok := a.cached(key, "T")
			if !ok {
				t.Fatal("T's node not tracked by its creating instance")
			}
			// A renewal through an instance whose clock is ahead.
			g, ok, err := a.get(ctxT(t, 30*time.Second), n.path)
			if err != nil || !ok {
				t.Fatalf("get %s: %v, %v", n.path, ok, err)
			}
			d := g.data
			d.startMS, d.ttl = time.Now().Add(skew).UnixMilli(), ttl
			st, err := a.conn.Set(n.path, d.encode(), g.stat.Version)
			if err != nil {
				t.Fatalf("set: %v", err)
			}
			// The creating instance's timer has seen it (and restarted
			// its lease from then, on its own clock).
			waitFor(t, "the timer to see the renewal", func() bool {
				a.mu.Lock()
				defer a.mu.Unlock()
				o := a.owned[n.path]
				return o != nil && o.version == st.Version
			})
			// A change through another instance that keeps the lease (as an
			// UNLOCK of one of several holds does): this instance's copy is
			// stale, so the change reads the node (and its owner) again.
			if _, err := a.conn.Set(n.path, d.encode(), st.Version); err != nil {
				t.Fatalf("set: %v", err)
			}
			var once sync.Once
			a.testBeforeWritten = func() {
				once.Do(func() {
					a.mu.Lock()
					end := a.owned[n.path].end
					a.mu.Unlock()
					time.Sleep(time.Until(end) + 300*time.Millisecond)
				})
			}
			defer func() { a.testBeforeWritten = nil }()
			v, err := tc.change(t, key)
			at := time.Now()
			if err != nil || v <= 0 {
				t.Fatalf("change = %v, %v; want it made", v, err)
			}
			until := at.Add(v)
			t.Logf("change told %v; %v left", v, time.Until(until).Round(time.Millisecond))
			for time.Now().Before(until.Add(-100 * time.Millisecond)) {
				l, err := lock(t, b, key, "U", time.Second, 0, backends.Write)
				if err == nil && time.Now().After(until) {
					grantedLate(t, until)
					break
				}
				if err == nil {
					t.Fatalf("token U granted (fence %d) %v before the end of the validity T's change was told (%v): two holders",
						l.Fence, time.Until(until).Round(time.Millisecond), v)
				}
				if !errors.Is(err, backends.ErrNotAcquired) {
					t.Fatalf("LOCK U: %v", err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			for unlock(t, a, key, "T") {
			}
		})
	}
}

// grantedLate logs a rival's grant by a LOCK that returned after the
// validity told to the holder ended: the grant came at some moment during
// that LOCK (slow on a loaded host), maybe after the end, which is no
// overlap, so the test stops looking rather than fail on it.
func grantedLate(t *testing.T, until time.Time) {
	t.Helper()
	t.Logf("token U granted by a LOCK that returned %v after the told validity ended; not counted",
		time.Since(until).Round(time.Millisecond))
}
