package zookeeper

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestRenewElsewhereLeaseKeptByPartialUnlock: the lease a RENEW through an
// instance that did not make the node set is the node's lease until a
// change restarts it; an UNLOCK of one of several holds keeps the lease as
// it is (its start and TTL), through either instance. Before, the renewing
// instance stopped enforcing the lease it set once the node changed at
// all, and the instance that made the node enforced the lease it knew of:
// a RENEW PX 1000 of a PX 20000 lock held twice, then an UNLOCK of one
// hold, left the key held for the whole original lease, 20 s, not 1 s.
func TestRenewElsewhereLeaseKeptByPartialUnlock(t *testing.T) {
	t.Parallel() // mostly waits on lease timers, in a root of its own
	root := testRoot(t)
	// Sessions whose horizon (5/12 of them, 12.5 s) is past the leases.
	a := newBackend(t, []string{zkAddr}, root, 30*time.Second)
	b := newBackend(t, []string{zkAddr}, root, 30*time.Second)
	const renw = time.Second
	for _, tc := range []struct {
		name   string
		unlock *Backend // the instance the UNLOCK of one hold goes through
	}{
		{"unlock through the renewing instance", b},
		{"unlock through the creating instance", a},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key := "renewed-elsewhere-partial-" + map[*Backend]string{a: "a", b: "b"}[tc.unlock]
			mustLock(t, a, key, "A", 20*time.Second, backends.Write)
			mustLock(t, a, key, "A", 20*time.Second, backends.Write) // a second hold
			start := time.Now()
			if v, err := b.Renew(ctxT(t, 10*time.Second), key, "A", renw); err != nil || v != backends.MinValidity {
				t.Fatalf("RENEW through the other instance = %v, %v; want %v (held, nothing promised)", v, err, backends.MinValidity)
			}
			if ok, err := tc.unlock.Unlock(ctxT(t, 10*time.Second), key, "A"); err != nil || !ok {
				t.Fatalf("UNLOCK of one of two holds = %v, %v; want true", ok, err)
			}
			if _, err := lock(t, b, key, "B", time.Second, renw+3*time.Second, backends.Write); err != nil {
				t.Fatalf("LOCK of a rival waiting %v after a RENEW PX %v and an UNLOCK of one hold = %v; want a grant when that lease ends",
					renw+3*time.Second, renw, err)
			}
			el := time.Since(start)
			if el < renw {
				t.Errorf("rival granted %v after a RENEW PX %v; want no sooner than its lease's end", el, renw)
			}
			if el > renw+1500*time.Millisecond {
				t.Errorf("rival granted %v after a RENEW PX %v; want by its lease's end (+1.5 s)", el, renw)
			}
		})
	}
}
