package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestHungLeaderDoesNotStallInstance: the ensemble's leader is stopped
// (SIGSTOP) for longer than it takes the two other servers to notice and
// elect a new leader. An instance whose server list includes the stopped
// server ends up reconnecting to it (its session was there, or the
// follower it moved to drops its connections when it leaves the stopped
// leader); the stopped server's kernel still accepts the connection, and
// go-zookeeper then waits ten receive timeouts for the handshake's answer
// (20 s for a 3 s session, 67 s for the default 10 s). The instance is
// disconnected that long, every LOCK answering NOQUORUM, although a
// majority serves: an instance on the two other servers grants meanwhile.
// The wait for a server's handshake must be bounded like every other wait
// for its answers, so that the instance moves on to a server that serves.
func TestHungLeaderDoesNotStallInstance(t *testing.T) {
	zs := harness.StartZooKeeperEnsemble(t, 3)
	var leader *harness.ZooKeeper
	var followers []*harness.ZooKeeper
	for _, z := range zs {
		if m, _ := z.Mode(); m == "leader" && leader == nil {
			leader = z
		} else {
			followers = append(followers, z)
		}
	}
	if leader == nil || len(followers) != 2 {
		t.Fatalf("no leader among %v", harness.ZKAddrs(zs))
	}
	root := testRoot(t)
	const session = 3 * time.Second
	// a lists the leader and one follower; c, the control, the two
	// followers only.
	a := newBackend(t, []string{leader.Addr, followers[0].Addr}, root, session)
	c := newBackend(t, []string{followers[0].Addr, followers[1].Addr}, root, session)
	mustLock(t, a, "warm-a", "A", time.Second, backends.Write)
	mustLock(t, c, "warm-c", "C", time.Second, backends.Write)

	const stop = 25 * time.Second
	leader.Pause()
	stopped := time.Now()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			leader.Resume()
		}
	}
	t.Cleanup(resume)

	// firstGrant tries a fresh key every 200 ms until one is granted or the
	// stop ends; it returns when, after the stop began, that was.
	firstGrant := func(b *Backend, name string) chan time.Duration {
		out := make(chan time.Duration, 1)
		go func() {
			defer close(out)
			for i := 0; time.Since(stopped) < stop; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_, err := b.Lock(ctx, backends.LockRequest{Key: fmt.Sprintf("%s-%d", name, i), Token: name, TTL: 5 * time.Second})
				cancel()
				if err == nil {
					out <- time.Since(stopped)
					return
				}
				if !errors.Is(err, backends.ErrNotAcquired) {
					time.Sleep(200 * time.Millisecond)
				}
			}
		}()
		return out
	}
	ca, cc := firstGrant(a, "a"), firstGrant(c, "c")
	dc, okc := <-cc
	da, oka := <-ca
	resume()
	if !okc {
		t.Fatalf("control instance (on the two running servers) granted nothing during the %v stop: the ensemble did not recover", stop)
	}
	t.Logf("leader %s stopped; control instance first granted %v later, instance listing the stopped server %v later (ok=%v)",
		leader.Addr, dc.Round(time.Millisecond), da.Round(time.Millisecond), oka)
	// Once the ensemble serves again, the instance needs at most about two
	// sessions: one wasted wait for the stopped server's handshake, and the
	// move to a server that answers.
	if bound := dc + 3*session; !oka || da > bound {
		t.Errorf("instance listing the stopped server: first grant %v after the stop began (granted=%v); "+
			"the control instance granted after %v: want no later than %v, not the whole stop (%v)",
			da.Round(time.Millisecond), oka, dc.Round(time.Millisecond), bound.Round(time.Millisecond), stop)
	}
}
