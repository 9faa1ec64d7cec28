package zookeeper

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestInfoNotStaleOnCutFollower proves that LOCKINFO syncs before it reads:
// an instance on a follower cut off from its peers stays connected to it
// (the follower serves its clients until syncLimit passes without its
// leader) after the leader expired the instance's session and a rival took
// the lock, and a plain read, served from the follower's stale data, still
// showed the expired holder. Synced, it shows it no more (the sync cannot
// reach the leader and the read fails).
func TestInfoNotStaleOnCutFollower(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an ensemble")
	}
	zs, links, follower, others := ensembleWithFollower(t)
	const root = "/info-stale"
	b := newBackend(t, others, root, 10*time.Second)
	a := newBackend(t, []string{zs[follower].Addr}, root, 2*time.Second)
	mustLock(t, a, "stale", "A", 30*time.Second, backends.Write)
	links.Cut(follower)
	defer links.Heal(follower)
	lb, err := lock(t, b, "stale", "B", 10*time.Second, 30*time.Second, backends.Write)
	if err != nil {
		t.Fatalf("B: %v", err)
	}
	info, ok, err := a.Info(ctxT(t, time.Second), "stale")
	t.Logf("B granted (fence %d); LOCKINFO through A = %+v, %v, %v", lb.Fence, info, ok, err)
	if err == nil && ok && len(info.Holders) > 0 && info.Holders[0].Token == "A" {
		t.Errorf("LOCKINFO through A shows A holding (TTL %v) after its session expired and B took the lock", info.TTL)
	}
}
