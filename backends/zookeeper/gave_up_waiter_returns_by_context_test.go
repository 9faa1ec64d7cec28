package zookeeper

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestGaveUpWaiterReturnsByItsContext: Backend's contract is that every
// method returns by the time its context is done. A waiting LOCK whose
// context ends (its client went away, the server's drain time ran out)
// deletes its node before it returns, and that delete had a bound of its
// own (releaseTimeout, 2 s) whatever the context: while the instance's
// connection is silent (a stalled server, a link dropping packets, well
// within the session timeout) the LOCK returned 2 s after its context was
// done. The delete must go on in the background instead (it is retried
// by the lease machinery when it fails, as before), and be waited for
// only while the context lasts.
func TestGaveUpWaiterReturnsByItsContext(t *testing.T) {
	root := testRoot(t)
	link := harness.StartLink(t, zkAddr)
	a := newBackend(t, []string{link.Addr()}, root, 10*time.Second)
	b := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	const key = "stalled"
	mustLock(t, b, key, "H", 30*time.Second, backends.Write)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		err error
		at  time.Time
	}
	done := make(chan result, 1)
	go func() {
		_, err := a.Lock(ctx, backends.LockRequest{Key: key, Token: "W", TTL: 5 * time.Second, Wait: time.Minute})
		done <- result{err, time.Now()}
	}()
	waitFor(t, "the waiter queued", func() bool { return a.Waiting() == 1 })
	link.Cut()
	canceled := time.Now()
	cancel()
	var r result
	select {
	case r = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter did not return within 20 s of its context's end")
	}
	if r.err == nil {
		t.Fatal("the waiter was granted; want it to give up")
	}
	if late := r.at.Sub(canceled); late > 500*time.Millisecond {
		t.Errorf("LOCK returned %v after its context was done (%v); want by then", late.Round(time.Millisecond), r.err)
	}

	// Once the link is back, the node of the waiter that gave up goes.
	link.Heal()
	dir := keyDir(root, key)
	waitFor(t, "the gave-up waiter's node deleted", func() bool {
		k, err := b.children(context.Background(), dir)
		return err == nil && len(k) == 1
	})
	unlock(t, b, key, "H")
	mustLock(t, a, key, "X", time.Second, backends.Write)
}
