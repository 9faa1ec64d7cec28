package redis

import (
	"testing"
	"time"
)

// TestWaitStaleHeardBits: the announcements that woke a head which was
// then granted stay in its queue's heard bits (only a refused attempt or
// a node announcing twice clears them), and the next head, promoted, counts
// them as part of the next release. README promises that the head tries
// once a majority of nodes announced a release, or soon (5 ms) after the
// first announcement when the others do not come.
//
//   - "next release from a node silent in the last": three nodes, node 2's
//     subscription down when release 1 is announced by nodes 0 and 1, and
//     release 2 announced by node 2 alone (0 and 1 down or lagging now).
//     Node 2's announcement makes three bits, neither the majority (2)
//     nor the first: no early signal is armed, and the promoted head
//     sleeps on its predecessor's lease (up to leaseSleepMax, 1 s) instead
//     of trying soon after.
//   - "one announcement of the next release is not a majority": release
//     1 announced by node 0 alone wakes the head by the early signal; the
//     head is granted; node 1's announcement of release 2, well after,
//     completes a "majority" with node 0's stale bit and signals the next
//     head at once, with release 2 announced by one node of three.
func TestWaitStaleHeardBits(t *testing.T) {
	const soon = 20 * time.Millisecond
	signaledWithin := func(w *waiter, d time.Duration) bool {
		select {
		case <-w.turn:
			return true
		default:
		}
		select {
		case <-w.turn:
			return true
		case <-time.After(d):
			return false
		}
	}
	for _, tc := range []struct {
		name    string
		release func(t *testing.T, qs *waitQueues, a *waiter) // announces release 1, which wakes a
		next    int                                           // the node announcing release 2
	}{
		{"next release from a node silent in the last", func(t *testing.T, qs *waitQueues, a *waiter) {
			qs.wake("k", 0)
			qs.wake("k", 1)
			if !signaledWithin(a, 0) {
				t.Fatal("release 1 announced by a majority did not signal the head")
			}
		}, 2},
		{"one announcement of the next release is not a majority", func(t *testing.T, qs *waitQueues, a *waiter) {
			qs.wake("k", 0)
			if !signaledWithin(a, 5*time.Second) {
				t.Fatal("release 1 announced by one node did not signal the head soon after")
			}
		}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			qs := newWaitQueues(2, soon)
			a, _ := qs.join("k", false)
			<-a.turn
			b, _ := qs.join("k", false)
			tc.release(t, qs, a)
			qs.leaveHeld(a, true, time.Now().Add(30*time.Second))
			select {
			case <-b.promoted:
			default:
				t.Fatal("b not promoted after a was granted")
			}
			// Release 2 comes later than one release's announcements
			// spread (well past soon).
			time.Sleep(3 * soon)
			first := time.Now()
			qs.wake("k", tc.next)
			select {
			case <-b.turn:
				if since := time.Since(first); since < soon {
					t.Fatalf("signaled %v after one node of three announced release 2; want soon (%v) after, as for any minority", since, soon)
				}
			case <-time.After(2 * time.Second):
				t.Fatalf("release 2, announced by node %d alone, never signaled the promoted head "+
					"(release 1's heard bits were kept): it sleeps on its predecessor's lease", tc.next)
			}
			qs.leave(b, false)
		})
	}
}
