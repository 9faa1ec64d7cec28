package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/lockproxy/lockproxy/backends"
)

// newTestBackend starts a backend over the given in-process nodes, closed
// at cleanup.
func newTestBackend(t *testing.T, nodes []*miniredis.Miniredis, retryMin, retryMax time.Duration) *Backend {
	t.Helper()
	cfg := Config{RetryMin: retryMin, RetryMax: retryMax}
	for _, m := range nodes {
		cfg.Nodes = append(cfg.Nodes, NodeConfig{Addr: m.Addr(), KeyPrefix: "lockproxy:"})
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func startNodes(t *testing.T, n int) []*miniredis.Miniredis {
	t.Helper()
	var nodes []*miniredis.Miniredis
	for i := 0; i < n; i++ {
		nodes = append(nodes, miniredis.RunT(t))
	}
	return nodes
}

// waitFor polls cond every millisecond for at most 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for i := 0; i < 5000; i++ {
		if cond() {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("%s: not within 5 s", what)
}

// TestBackendWaitOrder: waiters queued in a known order are granted one at
// a time, in that order, each once.
func TestBackendWaitOrder(t *testing.T) {
	const waiters = 40
	b := newTestBackend(t, startNodes(t, 3), 5*time.Millisecond, 20*time.Millisecond)
	ctx := context.Background()
	key := "order"
	first, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "first", TTL: time.Minute})
	if err != nil {
		t.Fatalf("LOCK %q = %v; want a grant", key, err)
	}
	var (
		holding atomic.Bool
		mu      sync.Mutex
		order   []int
		wg      sync.WaitGroup
	)
	for i := 0; i < waiters; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			token := fmt.Sprintf("w%d", i)
			_, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: token, TTL: time.Minute, Wait: 20 * time.Second})
			if err != nil {
				t.Errorf("LOCK %q WAIT (waiter %d) = %v; want a grant", key, i, err)
				return
			}
			if !holding.CompareAndSwap(false, true) {
				t.Errorf("waiter %d granted while another waiter held %q", i, key)
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			holding.Store(false)
			if ok, err := b.Unlock(ctx, key, token); !ok || err != nil {
				t.Errorf("UNLOCK %q (waiter %d) = %v, %v; want true", key, i, ok, err)
			}
		}()
		waitFor(t, fmt.Sprintf("waiter %d queued", i), func() bool { return b.Waiting() == i+1 })
	}
	if ok, err := b.Unlock(ctx, key, first.Token); !ok || err != nil {
		t.Fatalf("UNLOCK %q = %v, %v; want true", key, ok, err)
	}
	wg.Wait()
	want := make([]int, waiters)
	for i := range want {
		want[i] = i
	}
	if !slices.Equal(order, want) {
		t.Errorf("grant order %v; want %v", order, want)
	}
	if n := b.Waiting(); n != 0 {
		t.Errorf("Waiting() = %d after every waiter returned; want 0", n)
	}
}

// TestBackendWaitWokenByOtherBackend: a release through one backend wakes a
// waiter on another sharing the nodes, long before the waiter's retry.
func TestBackendWaitWokenByOtherBackend(t *testing.T) {
	nodes := startNodes(t, 3)
	a := newTestBackend(t, nodes, time.Second, time.Second)
	// B retries only every 10 s: only the announcement can grant it soon.
	b := newTestBackend(t, nodes, 10*time.Second, 10*time.Second)
	ctx := context.Background()
	key := "across"
	held, err := a.Lock(ctx, backends.LockRequest{Key: key, Token: "a", TTL: time.Minute})
	if err != nil {
		t.Fatalf("LOCK %q on A = %v; want a grant", key, err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "b", TTL: time.Minute, Wait: 15 * time.Second})
		done <- err
	}()
	waitFor(t, "waiter queued on B", func() bool { return b.Waiting() == 1 })
	// The waiter subscribes after its first attempt fails.
	waitFor(t, "subscribed on every node", func() bool {
		for _, m := range nodes {
			if m.PubSubNumSub("lockproxy:released:" + key)["lockproxy:released:"+key] != 1 {
				return false
			}
		}
		return true
	})
	start := time.Now()
	if ok, err := a.Unlock(ctx, key, held.Token); !ok || err != nil {
		t.Fatalf("UNLOCK %q on A = %v, %v; want true", key, ok, err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("LOCK %q WAIT on B = %v; want a grant", key, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("granted on B %v after the release on A; want it woken, well before its 10 s retry", d)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("LOCK … WAIT on B not granted within 8 s of the release on A (its retry is 10 s): not woken")
	}
	// The last waiter gone, the subscriptions go too.
	waitFor(t, "unsubscribed on every node", func() bool {
		for _, m := range nodes {
			if m.PubSubNumSub("lockproxy:released:" + key)["lockproxy:released:"+key] != 0 {
				return false
			}
		}
		return true
	})
}

// TestBackendWaitCanceled: a waiter whose context ends leaves the queue and
// returns; the waiter behind it moves up.
func TestBackendWaitCanceled(t *testing.T) {
	b := newTestBackend(t, startNodes(t, 3), 5*time.Millisecond, 20*time.Millisecond)
	key := "canceled"
	held, err := b.Lock(context.Background(), backends.LockRequest{Key: key, Token: "h", TTL: time.Minute})
	if err != nil {
		t.Fatalf("LOCK %q = %v; want a grant", key, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan error, 1)
	go func() {
		_, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "gone", TTL: time.Minute, Wait: 20 * time.Second})
		gone <- err
	}()
	waitFor(t, "first waiter queued", func() bool { return b.Waiting() == 1 })
	next := make(chan error, 1)
	go func() {
		_, err := b.Lock(context.Background(), backends.LockRequest{Key: key, Token: "next", TTL: time.Minute, Wait: 20 * time.Second})
		next <- err
	}()
	waitFor(t, "second waiter queued", func() bool { return b.Waiting() == 2 })
	cancel()
	select {
	case err := <-gone:
		if !errors.Is(err, backends.ErrNotAcquired) {
			t.Errorf("canceled LOCK … WAIT = %v; want %v", err, backends.ErrNotAcquired)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("canceled LOCK … WAIT did not return within 5 s")
	}
	waitFor(t, "canceled waiter gone", func() bool { return b.Waiting() == 1 })
	if ok, err := b.Unlock(context.Background(), key, held.Token); !ok || err != nil {
		t.Fatalf("UNLOCK %q = %v, %v; want true", key, ok, err)
	}
	select {
	case err := <-next:
		if err != nil {
			t.Fatalf("LOCK … WAIT behind the canceled one = %v; want a grant", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("LOCK … WAIT behind the canceled one not granted within 5 s")
	}
}
