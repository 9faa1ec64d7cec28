package zookeeper

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestAbandonedNodeDeletedAfterBlip: a waiter that gives up while its
// instance is cut off (a blip well within the session timeout) cannot
// delete its node then; the session survives the blip, and the node must
// not, or once the holder releases it would hold the key for nobody until
// the instance restarts.
func TestAbandonedNodeDeletedAfterBlip(t *testing.T) {
	t.Parallel() // mostly waits on lease timers, in a root of its own
	root := testRoot(t)
	link := harness.StartLink(t, zkAddr)
	a := newBackend(t, []string{link.Addr()}, root, 10*time.Second)
	b := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	mustLock(t, b, "g", "H", 30*time.Second, backends.Write)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := a.Lock(ctx, backends.LockRequest{Key: "g", Token: "W", TTL: 5 * time.Second, Wait: time.Minute})
		errc <- err
	}()
	dir := keyDir(root, "g")
	waitFor(t, "the waiter queued", func() bool { k, _ := b.children(context.Background(), dir); return len(k) == 2 })
	link.Cut()
	cancel() // the client went away
	if err := <-errc; err == nil {
		t.Fatal("the waiter was granted; want it to give up")
	}
	time.Sleep(releaseTimeout + 500*time.Millisecond) // abandon's first delete fails meanwhile
	link.Heal()
	waitFor(t, "instance a back", func() bool { return a.Ready(context.Background()) == nil })
	waitFor(t, "the abandoned node deleted", func() bool { k, _ := b.children(context.Background(), dir); return len(k) == 1 })
	unlock(t, b, "g", "H")
	mustLock(t, b, "g", "X", time.Second, backends.Write)
}

// TestRenewThroughOtherInstancePromisesNothing: a node lives in the
// session of the instance that made it, which another instance cannot see
// the end of (that instance may be stopping): a renewal or reentry through
// another instance keeps the hold but reports the least validity, never
// one a rival could be granted within.
func TestRenewThroughOtherInstancePromisesNothing(t *testing.T) {
	root := testRoot(t)
	a := newBackend(t, []string{zkAddr}, root, 30*time.Second) // a horizon of 12.5 s
	b := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	mustLock(t, a, "r", "T", 30*time.Second, backends.Write)
	v, err := b.Renew(ctxT(t, 10*time.Second), "r", "T", 30*time.Second)
	if err != nil || v != time.Millisecond {
		t.Errorf("RENEW through the other instance = %v, %v; want 1ms (held, nothing promised)", v, err)
	}
	l, err := lock(t, b, "r", "T", 30*time.Second, 0, backends.Write)
	if err != nil || l.Validity != time.Millisecond || l.Holds != 2 {
		t.Errorf("reentry through the other instance = %+v, %v; want 2 holds and 1ms", l, err)
	}
	// Through the instance that made it, the usual validity.
	if v, err := a.Renew(ctxT(t, 10*time.Second), "r", "T", 30*time.Second); err != nil || v < 5*time.Second {
		t.Errorf("RENEW through the instance that made the node = %v, %v; want about the session's horizon", v, err)
	}
}

// TestReentryWhenHoldGoesMeanwhile: a reentry through another instance
// whose hold goes (its lease ends, an UNLOCK elsewhere) just before the
// reentry's write takes the key with the caller's own node, and that node
// is the one kept: the grant it returns is real. Before, the reentry
// called Lock again, whose node reentered the caller's, which the caller
// then deleted: a grant on a node that no longer existed.
func TestReentryWhenHoldGoesMeanwhile(t *testing.T) {
	root := testRoot(t)
	a := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	b := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	mustLock(t, a, "k", "T", 30*time.Second, backends.Write)
	var once sync.Once
	b.testBeforeReenter = func() { once.Do(func() { unlock(t, a, "k", "T") }) }
	l, err := lock(t, b, "k", "T", 30*time.Second, 0, backends.Write)
	if err != nil || l.Holds != 1 {
		t.Fatalf("LOCK whose hold went meanwhile = %+v, %v; want a first grant", l, err)
	}
	kids, err := b.children(context.Background(), keyDir(root, "k"))
	if err != nil || len(kids) != 1 {
		t.Fatalf("children = %v, %v; want the one node of the grant", kids, err)
	}
	wantNotAcquired(t, a, "k", "RIVAL", backends.Write)
	if !unlock(t, b, "k", "T") {
		t.Error("UNLOCK of the grant = false; want true")
	}
}

// TestReaderSeesDowngradeBeforeItsWatch: a reader blocked by a writer that
// downgrades between the reader's look at it and the reader's watch is
// granted at once, not when its WAIT runs out: the watch would never fire
// for a change already made.
func TestReaderSeesDowngradeBeforeItsWatch(t *testing.T) {
	root := testRoot(t)
	a := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	mustLock(t, a, "d", "W", 30*time.Second, backends.Write)
	var once sync.Once
	a.testBeforeWatch = func(string) {
		once.Do(func() {
			mustLock(t, a, "d", "W", 30*time.Second, backends.Read) // downgrade
			if !unlock(t, a, "d", "W") {                            // the write hold goes
				t.Error("UNLOCK of the write hold = false")
			}
		})
	}
	const wait = 30 * time.Second
	start := time.Now()
	if _, err := lock(t, a, "d", "R", 30*time.Second, wait, backends.Read); err != nil {
		t.Fatalf("reader: %v", err)
	}
	if took := time.Since(start); took >= wait/2 {
		t.Fatalf("reader granted after %v, at its WAIT's end; want it at once", took)
	}
}
