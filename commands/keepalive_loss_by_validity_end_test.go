package commands

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/backends/redis"
	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestKeepaliveLossToldByValidityEnd: a KEEPALIVE lock whose grant told
// a short validity (a slow grant's), on three real redis-server nodes of
// which two stop answering, is told lost by the end of that validity,
// when its lease may end, not a node timeout later: the watchdog's
// renewal gives the nodes until then (keepalives.renew), and RedLock's
// hold quorum now keeps to that deadline. Before, the quorum gave the
// nodes its whole node timeout (500 ms here) whatever the renewal's
// deadline, and the loss was told about 450 ms after the validity ended,
// while the holder still relied on the lock.
func TestKeepaliveLossToldByValidityEnd(t *testing.T) {
	const (
		ttl      = 20 * time.Second // node timeout: 5 %, capped at 500 ms
		timeout  = 500 * time.Millisecond
		validity = 100 * time.Millisecond
		slack    = 150 * time.Millisecond
	)
	harness.RequireBinary(t, "redis-server", "redis-server")
	rs := harness.StartRedisN(t, 3, harness.RedisOptions{})
	cfg := redis.Config{RetryMin: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond,
		Quorum: quorum.Config{DriftFactor: 0.01, DriftMin: 2 * time.Millisecond, TimeoutMax: timeout}}
	for _, r := range rs {
		cfg.Nodes = append(cfg.Nodes, redis.NodeConfig{Addr: r.Addr, KeyPrefix: "lp:", Timeout: timeout})
	}
	be, err := redis.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = be.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const key, token = "loss-by-validity-end", "t"
	if _, err := be.Lock(ctx, backends.LockRequest{Key: key, Token: token, TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		c := r.Client(t)
		waitFor(t, func() bool { return c.Get(ctx, "lp:lock:"+key).Val() == token }, "the hold on every node")
	}
	k := newTestKeepalives(t, be, time.Minute)
	c := newTestConn(t, 3)
	rs[1].Pause()
	rs[2].Pause()
	t.Cleanup(func() {
		rs[1].Resume()
		rs[2].Resume()
	})
	sent := time.Now()
	g := grantTiming{sent: sent, validity: validity, begun: sent, holds: 1}
	if !k.startGrant(c.ctx, c.ka, key, token, ttl, 0, backends.Write, true, g) {
		t.Fatal("KEEPALIVE lock not kept")
	}
	waitFor(t, func() bool { return counterValue(t, k.lost[lostRenewFailed]) > 0 }, "the loss")
	if told := time.Since(sent); told > validity+slack {
		t.Fatalf("loss of a KEEPALIVE lock told validity %v, two of three nodes silent, told %v after the grant; want by %v (the validity's end and slack)",
			validity, told.Round(time.Millisecond), validity+slack)
	}
}
