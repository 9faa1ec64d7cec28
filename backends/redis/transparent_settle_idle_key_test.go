package redis

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// TestTransparentWriteOnIdleKeyDoesNotWait: a transparent write waits for
// its keys' writer only where one of its keys has an operation queued
// there and not yet answered. Here n2's only writer is held inside a
// batch (an earlier grant of "other", before its caller hears of it):
// settling "free", which has nothing queued, returns while the writer is
// held; settling "other", whose acquire is still unanswered, does not.
// Before, both queued a marker behind the held batch, and every
// transparent write paid a writer's batch of latency (half its time when
// the node was slow).
func TestTransparentWriteOnIdleKeyDoesNotWait(t *testing.T) {
	b, _ := newRealBackend(t, 3)
	ctx := ctxTimeout(t, 30*time.Second)
	n2 := b.nodes[2]
	resume := holdWriterInGrant(t, ctx, b, n2)
	if slot("free") == slot("other") {
		t.Fatal("the test's keys share a slot")
	}

	// A long deadline: a settle that waits for the held writer would
	// wait half of it.
	long, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	settled := func(key string) chan struct{} {
		done := make(chan struct{})
		go func() {
			n2.settleKeys(long, []string{key})
			close(done)
		}()
		return done
	}
	select {
	case <-settled("free"):
	case <-time.After(10 * time.Second):
		t.Fatal(`settling "free" (nothing queued) waited for n2's held writer`)
	}
	other := settled("other")
	select {
	case <-other:
		t.Fatal(`settling "other" returned while its acquire on n2 was unanswered`)
	case <-time.After(200 * time.Millisecond):
	}
	resume()
	select {
	case <-other:
	case <-time.After(10 * time.Second):
		t.Fatal(`settling "other" did not return once n2's writer went on`)
	}
}

// holdWriterInGrant holds n's writer (it must be the node's only one,
// Workers 1, which every key shares) inside the batch of a grant of the
// key "other" to token "o", after the batch was answered by the node and
// before the grant's caller hears of it, and returns what lets it go on
// (called again, or at the test's end, it does nothing).
func holdWriterInGrant(t *testing.T, ctx context.Context, b *Backend, n *Node) (resume func()) {
	t.Helper()
	held, release := make(chan struct{}), make(chan struct{})
	// Set before the LOCK that runs it is queued: the writer reads it
	// after receiving an operation.
	n.beforeFenceStore = func() {
		n.beforeFenceStore = nil
		close(held)
		<-release
	}
	var once sync.Once
	resume = func() { once.Do(func() { close(release) }) }
	t.Cleanup(resume)
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "other", Token: "o", TTL: time.Minute, NoReentry: true}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-time.After(5 * time.Second):
		t.Fatal("the writer did not reach the grant's fence write")
	}
	return resume
}

// TestInFlightCountsReturnToZero: every operation counted in a node's
// inFlight is uncounted once answered, whatever its end (granted,
// refused, released, given up by its caller, refused by a closed node). A
// count left behind would make every transparent write on its slot wait
// for a writer's batch.
func TestInFlightCountsReturnToZero(t *testing.T) {
	b, _ := newRealBackend(t, 3)
	ctx := ctxTimeout(t, 60*time.Second)
	for i := range 50 {
		key := "count-" + string(rune('a'+i%26))
		g, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "t", TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		// Refused: held by "t".
		if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "u", TTL: 10 * time.Second}); err == nil {
			t.Fatalf("%s: a second holder was granted", key)
		}
		if _, err := b.Renew(ctx, key, g.Token, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if ok, err := b.Unlock(ctx, key, g.Token); !ok || err != nil {
			t.Fatalf("%s: UNLOCK = %v, %v", key, ok, err)
		}
	}
	// Callers that gave up before their answers came.
	for range 20 {
		short, cancel := context.WithTimeout(ctx, 50*time.Microsecond)
		_, _ = b.Lock(short, backends.LockRequest{Key: "count-short", Token: "s", TTL: 10 * time.Second})
		cancel()
	}
	n := b.nodes[0]
	req := quorum.Request{Key: "count-direct", Token: "d", TTL: 10 * time.Second}
	if _, err := n.Acquire(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Release(ctx, "count-direct", "d", quorum.AnyHold); err != nil {
		t.Fatal(err)
	}

	counted := func() (sum int32) {
		for _, nd := range b.nodes {
			for i := range nd.inFlight {
				sum += nd.inFlight[i].Load()
			}
		}
		return sum
	}
	// Roll-backs and late releases go on after their callers returned.
	deadline := time.Now().Add(10 * time.Second)
	for counted() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d operations still counted in flight 10 s after the last one", counted())
		}
		time.Sleep(20 * time.Millisecond)
	}

	// A closed node answers what is queued on it, counts included.
	b.Close()
	for _, nd := range b.nodes {
		nd.unmark("count-closed", "c", false)
	}
	if c := counted(); c != 0 {
		t.Fatalf("%d operations counted in flight on closed nodes", c)
	}
}
