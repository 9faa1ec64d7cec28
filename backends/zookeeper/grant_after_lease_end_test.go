package zookeeper

import (
	"errors"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestGrantAfterLeaseEndNotAcquired: a first grant arms its node's lease
// timer (t0 + TTL, t0 before the children read that judged it granted)
// before it reads the node. When the grant's round trips outlast the TTL
// (a short PX, locks.min_ttl is 10 ms, on a loaded host or a slow
// ensemble), the timer fires meanwhile and deletes the node: before the
// read (the read finds it gone) or after it (the node is no longer
// tracked). Either way the grant came too late to be of use, and the
// answer is not acquired, as for a grant whose validity ran out with the
// node still there. Before, it was -NOQUORUM "lock node lost" from a
// healthy ensemble: about one LOCK PX 10 in a hundred without any fault.
func TestGrantAfterLeaseEndNotAcquired(t *testing.T) {
	root := testRoot(t)
	a := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	const ttl = 50 * time.Millisecond
	for _, tc := range []struct {
		name string
		read bool // the lease ends after the grant's read (true) or before it
	}{
		{"lease ends before the grant reads its node", false},
		{"lease ends after the grant read its node", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "late-" + tc.name
			ended := a.leasesEnded.Load()
			a.testGrantRead = func(read bool) {
				if read != tc.read {
					return
				}
				// The timer (armed for t0 + 50 ms) deletes the node.
				waitFor(t, "the lease timer to delete the node", func() bool { return a.leasesEnded.Load() > ended })
			}
			l, err := lock(t, a, key, "T", ttl, 0, backends.Write)
			a.testGrantRead = nil
			if !errors.Is(err, backends.ErrNotAcquired) {
				t.Errorf("LOCK whose lease ended during its grant = %+v, %v; want ErrNotAcquired (too late), not an ensemble error", l, err)
			}
			// Nothing stays held.
			mustLock(t, a, key, "U", time.Second, backends.Write)
			unlock(t, a, key, "U")
		})
	}
}
