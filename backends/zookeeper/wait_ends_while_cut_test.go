package zookeeper

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestWaitEndsOnTimeWhileCutOff: a LOCK … WAIT whose wait runs out while
// the instance's link to the ensemble is cut answers at its WAIT, not when
// its context ends. The wait ends with one more look at the key (its
// blocker may have just gone), which needs a server: while none answers,
// that look waited for the command's context, WAIT + TTL (7 s for WAIT
// 5000 PX 2000 in the partition fault row), or until the client library
// declared the connection lost (two thirds of the session timeout). Now
// the look is bounded (lastLookTimeout), and skipped when the instance
// knows it is disconnected: the answer is NOQUORUM, soon after the WAIT.
func TestWaitEndsOnTimeWhileCutOff(t *testing.T) {
	t.Parallel() // mostly waits, in a root of its own
	root := testRoot(t)
	b := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	for _, tc := range []struct {
		name string
		// cutAfter is how long after the waiter queued the link is cut:
		// at once, or just before the wait runs out. Either way the
		// client library has not yet seen the connection lost.
		cutAfter time.Duration
		// atWatch cuts the link instead just before the waiter sets its
		// watch, so that the watch's request is the one left without an
		// answer (seen in CI under load: answered after 8.7 s, when the
		// client library gave the connection up).
		atWatch bool
	}{
		{"cut as it queues", 0, false},
		{"cut as its wait ends", 1400 * time.Millisecond, false},
		{"cut as it sets its watch", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// An instance of its own behind a link of its own: the
			// heal below leaves the other's connection to be redone.
			link := harness.StartLink(t, zkAddr)
			a := newBackend(t, []string{link.Addr()}, root, 10*time.Second)
			if tc.atWatch {
				var once sync.Once
				a.testBeforeWatch = func(string) { once.Do(link.Cut) }
			}
			key := "cut-" + tc.name
			mustLock(t, b, key, "H", 30*time.Second, backends.Write)
			const wait = 1500 * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), wait+20*time.Second)
			defer cancel()
			start := time.Now()
			done := make(chan error, 1)
			go func() {
				_, err := a.Lock(ctx, backends.LockRequest{Key: key, Token: "W", TTL: 20 * time.Second, Wait: wait})
				done <- err
			}()
			if !tc.atWatch {
				waitFor(t, "the waiter queued", func() bool { return a.Waiting() == 1 })
				time.Sleep(tc.cutAfter)
				link.Cut()
			}
			var err error
			select {
			case err = <-done:
			case <-time.After(wait + 20*time.Second):
				t.Fatal("the waiter did not answer")
			}
			took := time.Since(start)
			if !errors.Is(err, quorum.ErrNoQuorum) && !errors.Is(err, backends.ErrNotAcquired) {
				t.Errorf("LOCK WAIT %v cut off = %v; want NOQUORUM or not acquired", wait, err)
			}
			if took > wait+1500*time.Millisecond {
				t.Errorf("LOCK WAIT %v answered after %v while cut off (%v); want soon after its WAIT", wait, took.Round(time.Millisecond), err)
			}
			t.Logf("answered after %v: %v", took.Round(time.Millisecond), err)
			link.Heal()
			unlock(t, b, key, "H")
		})
	}
}
