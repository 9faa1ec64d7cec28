package zookeeper

import (
	"strconv"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestValidityEndsBeforeLeaderExpiresSession proves that the validity of a
// grant through a follower ends before the leader can expire the holder's
// session when the follower is cut off from its peers right after the
// grant. Only the leader expires sessions, and a follower reports the
// sessions it heard from only when it answers the leader's pings: the
// grant's round trip is never reported, and the leader counts the session
// timeout from the client's previous ping, up to a third of it earlier.
// The LOCK is timed just before the client's second ping, the worst case;
// a rival must not be granted while the first holder's validity runs.
// Validity counted the whole session timeout from the grant's start before
// sessionHorizon (2.97 s here, the rival granted after about 2.5 s); it is
// now 5/12 of it (1.23 s).
func TestValidityEndsBeforeLeaderExpiresSession(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an ensemble")
	}
	zs, links, follower, others := ensembleWithFollower(t)
	const root = "/horizon-ens"
	b := newBackend(t, others, root, 10*time.Second)
	const session = 3 * time.Second
	for attempt := range 3 {
		key := "k" + strconv.Itoa(attempt)
		// go-zookeeper pings every third of the session timeout on a
		// ticker started with the session: LOCK just before the second
		// ping, so that the last touch the follower reported to the
		// leader is the first ping's.
		newAt := time.Now()
		a := newBackend(t, []string{zs[follower].Addr}, root, session)
		time.Sleep(time.Until(newAt.Add(2*session/3 - 150*time.Millisecond)))
		start := time.Now()
		l := mustLock(t, a, key, "A", session, backends.Write)
		links.Cut(follower)
		validUntil := start.Add(l.Validity) // no later than a's own count
		lb, err := lock(t, b, key, "B", 10*time.Second, 30*time.Second, backends.Write)
		granted := time.Now()
		links.Heal(follower)
		if err != nil {
			t.Fatalf("B: %v", err)
		}
		t.Logf("attempt %d: A validity %v; B granted %v after A's LOCK began", attempt,
			l.Validity.Round(time.Millisecond), granted.Sub(start).Round(time.Millisecond))
		if granted.Before(validUntil) {
			t.Fatalf("two holders: B granted (fence %d) %v before A's validity (fence %d) ends",
				lb.Fence, validUntil.Sub(granted).Round(time.Millisecond), l.Fence)
		}
		a.Close()
		waitFor(t, "the follower back", func() bool { m, _ := zs[follower].Mode(); return m == "follower" })
	}
}

// ensembleWithFollower starts a linked three-server ensemble and returns
// the index of a follower and the addresses of the other two.
func ensembleWithFollower(t *testing.T) ([]*harness.ZooKeeper, *harness.PeerLinks, int, []string) {
	zs, links, err := harness.LaunchZooKeeperEnsembleLinked(t.TempDir(), 3)
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	t.Cleanup(func() {
		for _, z := range zs {
			z.Kill()
		}
		links.Close()
	})
	follower := -1
	waitFor(t, "a leader", func() bool {
		lead := false
		for i, z := range zs {
			switch m, _ := z.Mode(); m {
			case "leader":
				lead = true
			case "follower":
				follower = i
			}
		}
		return lead && follower >= 0
	})
	var others []string
	for i, z := range zs {
		if i != follower {
			others = append(others, z.Addr)
		}
	}
	return zs, links, follower, others
}

// TestSessionHorizon pins the session's part of validity: 2/3 of the
// session timeout less half a server tick, the tick taken as half the
// session timeout when not configured.
func TestSessionHorizon(t *testing.T) {
	for _, c := range []struct {
		session, tick, want time.Duration
	}{
		{12 * time.Second, 0, 5 * time.Second},
		{12 * time.Second, 2 * time.Second, 7 * time.Second},
		{3 * time.Second, 500 * time.Millisecond, 1750 * time.Millisecond},
		{time.Second, 4 * time.Second, 0},
	} {
		b := &Backend{cfg: Config{SessionTimeout: c.session, ServerTick: c.tick}}
		if got := b.sessionHorizon(); got != c.want {
			t.Errorf("session %v tick %v: horizon %v, want %v", c.session, c.tick, got, c.want)
		}
	}
}
