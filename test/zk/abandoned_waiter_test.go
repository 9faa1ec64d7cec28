package zk

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestAbandonedWaiterDoesNotGrant: a waiter queued behind another waiter
// watches that waiter's node, not the holder's. When the waiter ahead
// gives up (its WAIT runs out and its node is deleted), the watch fires
// while the holder still holds: the waiter behind must look again and
// keep waiting, not take the lock. Through two instances, so the two
// waiters do not share one instance's queue.
func TestAbandonedWaiterDoesNotGrant(t *testing.T) {
	root := newRoot(t)
	ins := []*instance{startInstance(t, zkServers(), root), startInstance(t, zkServers(), root)}
	zc := zkConn(t)
	for _, tc := range []struct {
		name      string
		firstWait int // ms: the waiter ahead gives up after this
	}{
		{"waiter ahead gives up after 300ms", 300},
		{"waiter ahead gives up after 800ms", 800},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "abandon-" + lockclient.RandID()
			holder := lc.NewClient(t, ins[0].addr, 2)
			h := lc.MustLock(t, holder, key, "PX", 20000)

			// The waiter ahead, which gives up.
			ahead := lc.NewClient(t, ins[1].addr, 2)
			aheadDone := make(chan bool, 1)
			go func() {
				_, ok, _ := lockclient.TryLock(lockclient.CtxFor(t, 15*time.Second), ahead, key, "PX", 10000, "WAIT", tc.firstWait)
				aheadDone <- ok
			}()
			for end := time.Now().Add(10 * time.Second); lockNodes(t, zc, root, key) != 2; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(end) {
					t.Fatalf("the first waiter never queued")
				}
			}
			// The waiter behind it, which keeps waiting.
			behind := lc.NewClient(t, ins[0].addr, 2)
			type result struct {
				g  lockclient.Grant
				ok bool
				at time.Time
			}
			got := make(chan result, 1)
			go func() {
				g, ok, _ := lockclient.TryLock(lockclient.CtxFor(t, 30*time.Second), behind, key, "PX", 10000, "WAIT", 15000)
				got <- result{g, ok, time.Now()}
			}()
			for end := time.Now().Add(10 * time.Second); lockNodes(t, zc, root, key) != 3; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(end) {
					t.Fatalf("the second waiter never queued")
				}
			}
			if ok := <-aheadDone; ok {
				t.Fatalf("the waiter ahead was granted while the holder held")
			}
			// The waiter ahead is gone; the holder still holds for a while.
			select {
			case r := <-got:
				t.Errorf("the waiter behind was granted (fence %d, ok %v) while the holder (fence %d) still held, after the waiter ahead gave up",
					r.g.Fence, r.ok, h.Fence)
				if r.ok {
					lc.IntCmd(t, behind, "UNLOCK", key, r.g.Token)
				}
				lc.IntCmd(t, holder, "UNLOCK", key, h.Token)
				return
			case <-time.After(time.Second):
			}
			released := time.Now()
			if n := lc.IntCmd(t, holder, "UNLOCK", key, h.Token); n != 1 {
				t.Fatalf("holder UNLOCK = %d; want 1", n)
			}
			r := <-got
			if !r.ok {
				t.Fatalf("the waiter behind was not granted after the holder let go")
			}
			if r.g.Fence <= h.Fence {
				t.Errorf("waiter's fence %d; want > the holder's %d", r.g.Fence, h.Fence)
			}
			t.Logf("waiter behind granted %v after the holder's UNLOCK", r.at.Sub(released).Round(time.Millisecond))
			lc.IntCmd(t, behind, "UNLOCK", key, r.g.Token)
		})
	}
}
