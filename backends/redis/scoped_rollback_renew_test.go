package redis_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/backends/redis"
	"github.com/lockproxy/lockproxy/test/faultproxy"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestScopedRollbackKeepsRenewedHold: a RENEW that counted a hold made by
// a refused attempt of the same token keeps that hold, though the
// attempt's roll-back, scoped to it and sent unheard, comes after it.
//
// Nodes n0, n1, n2. Instance 1 reaches n2 through a slow link (700 ms each
// way, within its 2 s node timeout); instance 2 reaches n1 and n2 through
// links the test can cut. U holds the key. T's LOCK … TOKEN through
// instance 1 (attempt a) is refused by n0 and n1 and answered nil without
// hearing n2 out; its roll-back to n2, scoped to a, follows it there. The
// client, told nil, goes on through instance 2: U is released, and T's
// next LOCK … TOKEN (PX 3000) is granted by n0 and n1 (its link to n2 cut
// meanwhile). Attempt a then reaches n2, where the key is free: a fresh
// hold of T, marked a. T's RENEW … PX 60000 through instance 2 (its link
// to n1 cut now) renews n0 and that hold on n2: a majority, validity about
// a minute. Then a's roll-back reaches n2. Had it removed the hold (the
// mark still named a: a renewal left it), T would hold the key on n0
// alone once n1's 3 s lease ended, and a rival would be granted n1 and n2
// while T's renewed validity runs. Likewise for RLOCK … TOKEN, U a writer.
// Before, a renewal left the mark (lockm, or the read
// mark in lockrh) in place and the roll-back took the renewed hold.
func TestScopedRollbackKeepsRenewedHold(t *testing.T) {
	for _, mode := range []backends.Mode{backends.Write, backends.Read} {
		t.Run(fmt.Sprint("read=", mode == backends.Read), func(t *testing.T) { scopedRollbackKeepsRenewedHold(t, mode) })
	}
}

func scopedRollbackKeepsRenewedHold(t *testing.T, mode backends.Mode) {
	const (
		ttl     = time.Minute
		timeout = 2 * time.Second // the node timeout at this TTL
		latency = 700 * time.Millisecond
		short   = 3 * time.Second // the lease of T's grant
	)
	harness.RequireBinary(t, "redis-server", "redis-server")
	rs := harness.StartRedisN(t, 3, harness.RedisOptions{})
	slow2, cut1, cut2 := linkTo(t, rs[2].Addr), linkTo(t, rs[1].Addr), linkTo(t, rs[2].Addr)
	b1 := redis.NewBackendOn(t, rs, timeout, func(c *redis.Config) { c.Nodes[2].Addr = slow2.Addr() })
	b2 := redis.NewBackendOn(t, rs, timeout, func(c *redis.Config) {
		c.Nodes[1].Addr, c.Nodes[2].Addr = cut1.Addr(), cut2.Addr()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const key = "scoped-renewed"
	redis.WarmUp(ctx, t, b1, rs, "srr-warm", ttl)
	redis.WarmUp(ctx, t, b2, rs, "srr-warm2", ttl)
	if _, err := b2.Lock(ctx, backends.LockRequest{Key: key, Token: "U", TTL: ttl}); err != nil {
		t.Fatalf("LOCK U = %v", err)
	}
	c2 := rs[2].Client(t)
	waitUntil(t, "U's hold on n2", func() bool { return c2.Get(ctx, "lp:lock:"+key).Val() == "U" })
	// holds tells whether T holds the key on n2 in mode.
	holds := func() bool {
		if mode == backends.Read {
			return c2.ZScore(ctx, "lp:lockr:"+key, "T").Err() == nil
		}
		return c2.Get(ctx, "lp:lock:"+key).Val() == "T"
	}

	slow2.SetLatency(latency, 0)
	sent := time.Now()
	if _, err := b1.Lock(ctx, backends.LockRequest{Key: key, Token: "T", TTL: ttl, Mode: mode}); !errors.Is(err, backends.ErrNotAcquired) {
		t.Fatalf("T's LOCK … TOKEN through instance 1 = %v; want not acquired", err)
	}
	if ok, err := b2.Unlock(ctx, key, "U"); !ok || err != nil {
		t.Fatalf("UNLOCK U = %v, %v; want released", ok, err)
	}
	if d := time.Since(sent); d > latency/2 {
		t.Skipf("U released %v after T's attempt was sent; the host is too slow for the order this test needs", d)
	}
	waitUntil(t, "n2 free", func() bool { return c2.Exists(ctx, "lp:lock:"+key).Val() == 0 })
	cut2.Reset()
	if _, err := b2.Lock(ctx, backends.LockRequest{Key: key, Token: "T", TTL: short, Mode: mode}); err != nil {
		t.Fatalf("T's LOCK … TOKEN through instance 2 = %v; want a grant by n0 and n1", err)
	}
	granted := time.Now()
	cut2.PassThrough()
	// Attempt a reaches n2 at about one latency after it was sent.
	waitUntil(t, "T's refused attempt granted on n2", holds)
	cut1.Reset()
	v, err := b2.Renew(ctx, key, "T", ttl)
	if err != nil || v <= 0 {
		t.Fatalf("RENEW T through instance 2 = %v, %v; want renewed on n0 and n2", v, err)
	}
	if d := time.Since(sent); d > 3*latency {
		t.Skipf("RENEW answered %v after T's attempt was sent, when its roll-back may have reached n2; the host is too slow for the order this test needs", d)
	}
	renewed := time.Now()
	cut1.PassThrough()
	slow2.PassThrough()
	// The roll-back reaches n2 at about three latencies (sent once the
	// attempt's answer was read).
	for end := sent.Add(3*latency + timeout); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if !holds() {
			t.Fatalf("T's hold on n2 gone %v after RENEW T answered validity %v on n0 and n2; want it kept",
				time.Since(renewed).Round(time.Millisecond), v)
		}
	}
	// Once the grant's lease ended on n1, which RENEW did not reach, no
	// rival gets the key while T's renewed validity runs.
	time.Sleep(time.Until(granted.Add(short + 100*time.Millisecond)))
	if time.Since(renewed) >= v {
		t.Skip("the renewed validity ended before the rival's attempt")
	}
	if _, err := b1.Lock(ctx, backends.LockRequest{Key: key, Token: "V", TTL: ttl}); !errors.Is(err, backends.ErrNotAcquired) {
		t.Fatalf("a rival's LOCK %v after T's RENEW answered validity %v = %v; want not acquired", time.Since(renewed).Round(time.Millisecond), v, err)
	}
}

// TestScopedRollbackKeepsRenewedGrant is TestScopedRollbackKeepsRenewedHold
// for a node heard granting the refused attempt afresh, whose roll-back
// is not waited for either.
//
// Nodes n0 … n4. Instance 1 reaches n0, n1 and n2 through links of 200 ms
// each way, n3 through one that turns slow (1 s) once n3 answered, and
// not n4 (its link drops everything: n4 is not heard). Instance 2 reaches
// n2, n3 and n4 through links the test can cut. U holds the key on n0, n1
// and n2. T's LOCK … TOKEN through instance 1 (attempt a) is granted by
// n3, where the key is free, and refused by n0, n1 and n2: it is answered
// nil, n4 unheard, and n3's roll-back crawls there. The client goes on
// through instance 2: U is released, T's next LOCK … TOKEN (PX 3000) is
// granted by n0, n1 and n2 (n3 and n4 cut), and T's RENEW … PX 60000 (n2
// and n4 cut) renews n0, n1 and a's hold on n3: a majority, validity about
// a minute. Then a's roll-back reaches n3. A plain release there takes
// that hold: once n2's 3 s lease ended, T would hold the key on n0 and n1
// alone, and a rival would be granted n2, n3 and n4 while T's renewed
// validity runs.
func TestScopedRollbackKeepsRenewedGrant(t *testing.T) {
	for _, mode := range []backends.Mode{backends.Write, backends.Read} {
		t.Run(fmt.Sprint("read=", mode == backends.Read), func(t *testing.T) { scopedRollbackKeepsRenewedGrant(t, mode) })
	}
}

func scopedRollbackKeepsRenewedGrant(t *testing.T, mode backends.Mode) {
	const (
		ttl     = time.Minute
		timeout = 2 * time.Second // the node timeout at this TTL
		latency = 200 * time.Millisecond
		crawl   = time.Second
		short   = 3 * time.Second // the lease of T's grant
	)
	harness.RequireBinary(t, "redis-server", "redis-server")
	rs := harness.StartRedisN(t, 5, harness.RedisOptions{})
	var l1 [5]*faultproxy.Proxy // instance 1's links
	for i := range l1 {
		l1[i] = linkTo(t, rs[i].Addr)
	}
	cut2, cut3, cut4 := linkTo(t, rs[2].Addr), linkTo(t, rs[3].Addr), linkTo(t, rs[4].Addr)
	b1 := redis.NewBackendOn(t, rs, timeout, func(c *redis.Config) {
		for i := range c.Nodes {
			c.Nodes[i].Addr = l1[i].Addr()
		}
	})
	b2 := redis.NewBackendOn(t, rs, timeout, func(c *redis.Config) {
		c.Nodes[2].Addr, c.Nodes[3].Addr, c.Nodes[4].Addr = cut2.Addr(), cut3.Addr(), cut4.Addr()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const key = "scoped-renewed-grant"
	redis.WarmUp(ctx, t, b1, rs, "srg-warm", ttl)
	redis.WarmUp(ctx, t, b2, rs, "srg-warm2", ttl)
	c3 := rs[3].Client(t)
	// holds tells whether T holds the key on n3 in mode.
	holds := func() bool {
		if mode == backends.Read {
			return c3.ZScore(ctx, "lp:lockr:"+key, "T").Err() == nil
		}
		return c3.Get(ctx, "lp:lock:"+key).Val() == "T"
	}
	cut3.Reset()
	cut4.Reset()
	if _, err := b2.Lock(ctx, backends.LockRequest{Key: key, Token: "U", TTL: ttl}); err != nil {
		t.Fatalf("LOCK U = %v; want a grant by n0, n1 and n2", err)
	}
	for i := range 3 {
		l1[i].SetLatency(latency, 0)
	}
	l1[4].Blackhole()
	refused := make(chan error, 1)
	go func() {
		_, err := b1.Lock(ctx, backends.LockRequest{Key: key, Token: "T", TTL: ttl, Mode: mode})
		refused <- err
	}()
	waitUntil(t, "T's attempt granted on n3", holds)
	l1[3].SetLatency(crawl, 0)
	if err := <-refused; !errors.Is(err, backends.ErrNotAcquired) {
		t.Fatalf("T's attempt through instance 1 = %v; want not acquired", err)
	}
	answered := time.Now()
	if ok, err := b2.Unlock(ctx, key, "U"); !ok || err != nil {
		t.Fatalf("UNLOCK U = %v, %v; want released", ok, err)
	}
	if _, err := b2.Lock(ctx, backends.LockRequest{Key: key, Token: "T", TTL: short, Mode: mode}); err != nil {
		t.Fatalf("T's attempt through instance 2 = %v; want a grant by n0, n1 and n2", err)
	}
	granted := time.Now()
	cut3.PassThrough()
	cut2.Reset()
	v, err := b2.Renew(ctx, key, "T", ttl)
	if d := time.Since(answered); d > crawl/2 {
		t.Skipf("RENEW answered %v after the refusal, when its roll-back may have reached n3; the host is too slow for the order this test needs", d)
	}
	if err != nil || v <= 0 {
		t.Fatalf("RENEW T through instance 2 = %v, %v; want renewed on n0, n1 and n3", v, err)
	}
	renewed := time.Now()
	cut2.PassThrough()
	for end := answered.Add(crawl + timeout); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if !holds() {
			t.Fatalf("T's hold on n3 gone %v after RENEW T answered validity %v on n0, n1 and n3; want it kept",
				time.Since(renewed).Round(time.Millisecond), v)
		}
	}
	time.Sleep(time.Until(granted.Add(short + 100*time.Millisecond)))
	cut4.PassThrough()
	if time.Since(renewed) >= v {
		t.Skip("the renewed validity ended before the rival's attempt")
	}
	if _, err := b2.Lock(ctx, backends.LockRequest{Key: key, Token: "V", TTL: ttl}); !errors.Is(err, backends.ErrNotAcquired) {
		t.Fatalf("a rival's LOCK %v after T's RENEW answered validity %v = %v; want not acquired", time.Since(renewed).Round(time.Millisecond), v, err)
	}
}
