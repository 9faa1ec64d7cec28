package redis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/backends/redis"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestScopedRollbackKeepsOtherInstancesGrant: B's LOCK … TOKEN through
// one instance, whose link to the third node is slow (300 ms each way,
// within its 2 s node timeout), is refused by the two other nodes and
// answered nil without waiting for the third. There the attempt takes two
// round trips (its first step, acquireMarkedScript, finds the key held;
// then acquireScript), both refused as A holds the key, and its roll-back
// waits on that instance's writer until the attempt's answer is read
// (4 × 300 ms), reaching the node at about 1.5 s. Meanwhile, through
// another instance, A's hold is released and B's next LOCK … TOKEN is
// granted on all three nodes. Scoped to its attempt, the roll-back finds
// the hold marked by the other one and leaves it: B keeps all three nodes
// for as long as its lease lasts. A plain release there (what a refused
// attempt of a token lockproxy made gets) takes the grant's hold, leaving
// B one node short of what its grant counted, and fails this test.
func TestScopedRollbackKeepsOtherInstancesGrant(t *testing.T) {
	const (
		ttl     = time.Minute
		timeout = 2 * time.Second // the node timeout at this TTL
		latency = 300 * time.Millisecond
	)
	harness.RequireBinary(t, "redis-server", "redis-server")
	rs := harness.StartRedisN(t, 3, harness.RedisOptions{})
	p := linkTo(t, rs[2].Addr)
	b := redis.NewBackendOn(t, rs, timeout, func(c *redis.Config) { c.Nodes[2].Addr = p.Addr() })
	b2 := redis.NewBackendOn(t, rs, timeout)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const key = "scoped-other-instance"
	redis.WarmUp(ctx, t, b, rs, "soi-warm", ttl)
	redis.WarmUp(ctx, t, b2, rs, "soi-warm2", ttl)
	if _, err := b2.Lock(ctx, backends.LockRequest{Key: key, Token: "A", TTL: ttl}); err != nil {
		t.Fatalf("LOCK A = %v", err)
	}
	c2 := rs[2].Client(t)
	waitUntil(t, "A's hold on the third node", func() bool { return c2.Get(ctx, "lp:lock:"+key).Val() == "A" })
	p.SetLatency(latency, 0)
	sent := time.Now()
	if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "B", TTL: ttl}); !errors.Is(err, backends.ErrNotAcquired) {
		t.Fatalf("B's first LOCK … TOKEN = %v; want not acquired", err)
	}
	// The attempt's second step runs on the third node at 3 × latency;
	// its roll-back, sent once that answer is back, reaches it at 5 ×
	// latency.
	time.Sleep(time.Until(sent.Add(3*latency + 100*time.Millisecond)))
	if ok, err := b2.Unlock(ctx, key, "A"); !ok || err != nil {
		t.Fatalf("UNLOCK A through the other instance = %v, %v; want released", ok, err)
	}
	l, err := b2.Lock(ctx, backends.LockRequest{Key: key, Token: "B", TTL: ttl})
	if err != nil {
		t.Fatalf("B's LOCK … TOKEN through the other instance = %v; want a grant", err)
	}
	if d := time.Since(sent); d > 4*latency {
		t.Skipf("B's grant through the other instance came %v after the first attempt; the host is too slow for the order this test needs", d)
	}
	waitUntil(t, "B's hold on the third node", func() bool { return c2.Get(ctx, "lp:lock:"+key).Val() == "B" })
	for end := sent.Add(5*latency + timeout); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if v := c2.Get(ctx, "lp:lock:"+key).Val(); v != "B" {
			t.Fatalf("the third node holds %q %v after B's first attempt, while B holds the key (validity %v); want B's grant kept",
				v, time.Since(sent).Round(time.Millisecond), l.Validity)
		}
	}
}

// waitUntil polls cond every millisecond for up to 5 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for i := 0; i < 5000; i++ {
		if cond() {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("%s: not within 5 s", what)
}
