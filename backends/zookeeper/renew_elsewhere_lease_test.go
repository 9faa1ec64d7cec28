package zookeeper

import (
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestRenewThroughOtherInstanceSetsLease: a RENEW through an instance that
// did not make the node sets its lease as a RENEW through the one that did:
// the key is free when that lease ends, never sooner. The instance that
// made the node enforces the lease it knows of; a renewal through another
// one it sees only when its own timer fires, and then ends the lease as
// stored (TestLengthenedElsewhereLeaseEndsAsStored). Before, a RENEW that shortened the lease (PX 1000 of a PX
// 20000 lock) left the key held for the whole original lease, and one that
// lengthened it (PX 3500 of a PX 3000 lock, at once) held it until the
// original lease's end plus the new TTL (6.5 s), not 3.5 s.
func TestRenewThroughOtherInstanceSetsLease(t *testing.T) {
	t.Parallel() // mostly waits on lease timers, in a root of its own
	root := testRoot(t)
	// Sessions whose horizon (5/12 of them, 12.5 s) is past the leases.
	a := newBackend(t, []string{zkAddr}, root, 30*time.Second)
	b := newBackend(t, []string{zkAddr}, root, 30*time.Second)
	for _, tc := range []struct {
		name       string
		lock, renw time.Duration
	}{
		{"shortened", 20 * time.Second, time.Second},
		{"lengthened", 3 * time.Second, 3500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key := "renewed-elsewhere-" + tc.name
			mustLock(t, a, key, "A", tc.lock, backends.Write)
			start := time.Now()
			if v, err := b.Renew(ctxT(t, 10*time.Second), key, "A", tc.renw); err != nil || v != backends.MinValidity {
				t.Fatalf("RENEW through the other instance = %v, %v; want %v (held, nothing promised)", v, err, backends.MinValidity)
			}
			if _, err := lock(t, b, key, "B", time.Second, tc.renw+3*time.Second, backends.Write); err != nil {
				t.Fatalf("LOCK of a rival waiting %v after a RENEW PX %v = %v; want a grant when that lease ends",
					tc.renw+3*time.Second, tc.renw, err)
			}
			el, wall := time.Since(start), wallSince(start)
			if wall < tc.renw {
				t.Errorf("rival granted %v (%v on the wall clock) after a RENEW PX %v; want no sooner than its lease's end",
					el, wall, tc.renw)
			}
			if el > tc.renw+1500*time.Millisecond {
				t.Errorf("rival granted %v after a RENEW PX %v; want by its lease's end (+1.5 s)", el, tc.renw)
			}
		})
	}
}

// TestLengthenedElsewhereLeaseEndsAsStored: a reentrant LOCK, or a
// KEEPALIVE renewal (RenewHold), through an instance that did not make the
// node, that makes its lease end later, is enforced by the instance that
// made the node, which sees it when its own timer fires: the key is free
// when the lease as stored ends, not sooner than the first grant's
// validity. Before, that instance counted the stored TTL from when its
// timer fired: PX 3000 lengthened at once elsewhere to PX 3500 left the
// key held, its holder gone, for 6.5 s, not 3.5 s.
func TestLengthenedElsewhereLeaseEndsAsStored(t *testing.T) {
	t.Parallel() // mostly waits on lease timers, in a root of its own
	root := testRoot(t)
	// Sessions whose horizon (5/12 of them, 12.5 s) is past the leases.
	a := newBackend(t, []string{zkAddr}, root, 30*time.Second)
	b := newBackend(t, []string{zkAddr}, root, 30*time.Second)
	const first, longer = 3 * time.Second, 3500 * time.Millisecond
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, key string) (time.Duration, error)
	}{
		{"reentry", func(t *testing.T, key string) (time.Duration, error) {
			l, err := lock(t, b, key, "A", longer, 0, backends.Write)
			return l.Validity, err
		}},
		{"keepalive renewal", func(t *testing.T, key string) (time.Duration, error) {
			return b.RenewHold(ctxT(t, 10*time.Second), key, "A", backends.Write, longer)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key := "lengthened-elsewhere-" + strings.ReplaceAll(tc.name, " ", "-")
			start := time.Now()
			told := mustLock(t, a, key, "A", first, backends.Write).Validity
			if v, err := tc.change(t, key); err != nil || v != backends.MinValidity {
				t.Fatalf("%s PX %v through the other instance = %v, %v; want %v (held, nothing promised)",
					tc.name, longer, v, err, backends.MinValidity)
			}
			if _, err := lock(t, b, key, "B", time.Second, longer+3*time.Second, backends.Write); err != nil {
				t.Fatalf("LOCK of a rival waiting %v = %v; want a grant when the lengthened lease ends", longer+3*time.Second, err)
			}
			el, wall := time.Since(start), wallSince(start)
			if el < told || wall < longer {
				t.Errorf("rival granted %v (%v on the wall clock) after a grant told %v and a %s PX %v; want no sooner than either's end",
					el, wall, told, tc.name, longer)
			}
			if el > longer+1500*time.Millisecond {
				t.Errorf("rival granted %v after a %s PX %v; want by the stored lease's end (+1.5 s)", el, tc.name, longer)
			}
		})
	}
}

// wallSince is the time since start on the wall clock. A lease changed
// through another instance is stored as a wall-clock start and a TTL (the
// only time two hosts share), so a step of the wall clock moves its end
// as the monotonic clock counts it: one run saw all three such rivals
// granted 9-13 ms before 3.5 s on the monotonic clock, which only a wall
// clock stepped ahead between the change and the timer explains (timers
// run on the monotonic clock and never fire early). The holder through
// that instance was promised nothing (see validityOf); a validity told is
// timed on the monotonic clock of the instance that told it, and checked
// on it.
func wallSince(start time.Time) time.Duration {
	return time.Now().Round(0).Sub(start.Round(0))
}
