package commands

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/backends/redis"
)

// infoHookBackend is a real RedLock backend whose Info runs after, once
// the nodes answered, a hook set for one call: it places a grant between
// the nodes' answer and endUnlock's use of it, an interleaving the
// handler allows (endUnlock asks without k.mu held).
type infoHookBackend struct {
	*redis.Backend
	mu    sync.Mutex
	after func()
}

func (b *infoHookBackend) Info(ctx context.Context, key string) (backends.LockInfo, bool, error) {
	info, ok, err := b.Backend.Info(ctx, key)
	b.mu.Lock()
	f := b.after
	b.after = nil
	b.mu.Unlock()
	if f != nil {
		f()
	}
	return info, ok, err
}

// TestPooledUnlockAskRacedByReentrantKeepaliveGrant: the token held k
// without KEEPALIVE (C) when B took it again with KEEPALIVE, so the
// watchdog counts one of B's holds and one it does not count
// (uncounted). The client's pool releases C's hold through A; A's
// endUnlock asks the nodes how many holds are left (one: B's), and as the
// answer comes back B takes k again, reentrant, with KEEPALIVE (now two on
// the nodes, both B's, and two counted). endUnlock compares the stale one
// with the two counted and takes one of B's KEEPALIVE holds quietly: B's
// next UNLOCK then stops the watchdog with a hold of B's still on the
// nodes that nobody renews and nobody told B about (a silent loss).
func TestPooledUnlockAskRacedByReentrantKeepaliveGrant(t *testing.T) {
	const ttl = 900 * time.Millisecond
	be := &infoHookBackend{Backend: newRealRedLock(t, 3)}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	k := newTestKeepalives(t, be, time.Minute)
	b, a := newTestConn(t, 3), newTestConn(t, 3)
	const key, tok = "ask-raced-grant", "t-ask-raced"
	if _, err := be.Lock(ctx, backends.LockRequest{Key: key, Token: tok, TTL: ttl}); err != nil {
		t.Fatalf("C's LOCK: %v", err)
	}
	bLock := func(i int) {
		start := time.Now()
		l, err := be.Lock(ctx, backends.LockRequest{Key: key, Token: tok, TTL: ttl})
		if err != nil {
			t.Errorf("B's LOCK %d: %v", i, err)
			return
		}
		g := grantTiming{sent: start, validity: l.Validity, begun: start, holds: l.Holds}
		if !k.grantedGrant(b.ctx, b.ka, key, tok, backends.Write, true, ttl, 0, g) &&
			!k.startGrant(b.ctx, b.ka, key, tok, ttl, 0, backends.Write, true, g) {
			t.Errorf("B's LOCK %d not kept", i)
		}
	}
	bLock(1)
	op := k.beginUnlock(key, tok)
	k.whichHold(ctx, op)
	if ok, err := be.Unlock(ctx, key, tok); err != nil || !ok {
		t.Fatalf("A's UNLOCK = %v, %v", ok, err)
	}
	be.mu.Lock()
	be.after = func() { bLock(2) }
	be.mu.Unlock()
	k.endUnlock(op, true, a.ka)
	if t.Failed() {
		t.FailNow()
	}
	// B releases one of its two holds: one is left, B's, and B relies on it.
	op = k.beginUnlock(key, tok)
	k.whichHold(ctx, op)
	if ok, err := be.Unlock(ctx, key, tok); err != nil || !ok {
		t.Fatalf("B's UNLOCK = %v, %v", ok, err)
	}
	k.endUnlock(op, true, b.ka)
	if _, held, err := be.Info(ctx, key); err != nil || !held {
		t.Fatalf("Info after B's UNLOCK = held %v, %v; want B's second hold (the premise)", held, err)
	}
	if n := k.count(); n != 1 {
		why, lost := b.ka.takeLost([]byte(key))
		t.Fatalf("watchdogs running = %d with B's second KEEPALIVE hold on the nodes; want 1 (B told lost: %v %q, pushes %q)", n, lost, why, b.pushed())
	}
	// The lease must outlive its TTL while B holds it.
	deadline := time.Now().Add(2 * ttl)
	for time.Now().Before(deadline) {
		if _, held, err := be.Info(ctx, key); err == nil && !held {
			if why, lost := b.ka.takeLost([]byte(key)); !lost {
				t.Fatalf("B's hold expired and B was told nothing")
			} else {
				t.Fatalf("B's hold lost: %q", why)
			}
		}
		time.Sleep(ttl / 6)
	}
}
