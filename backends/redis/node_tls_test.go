package redis

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestNodeConnKilledWhileIdle: a writer's idle connection closed by the
// node (CLIENT KILL, Redis's timeout, a restart) is noticed before the
// next batch, over TLS as over TCP, so the batch does not fail on it.
func TestNodeConnKilledWhileIdle(t *testing.T) {
	overTCPAndTLS(t, func(t *testing.T, r *harness.Redis, cfg NodeConfig) {
		n := NewNode(cfg)
		defer n.Close()
		ctx := ctxTimeout(t, 10*time.Second)
		if _, err := n.Acquire(ctx, quorum.Request{Key: "a", Token: "t", TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if err := r.Client(t).Do(ctx, "CLIENT", "KILL", "TYPE", "normal").Err(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		if _, err := n.Acquire(ctx, quorum.Request{Key: "b", Token: "t", TTL: time.Minute}); err != nil {
			t.Fatalf("first Acquire after the node closed the idle connection: %v", err)
		}
	})
}

// TestNodeTLSNoSpuriousRedial: the idle check does not take what a TLS
// 1.3 server sends after the handshake (session tickets) for replies out
// of step: 20 acquires with pauses between them reuse the connections.
func TestNodeTLSNoSpuriousRedial(t *testing.T) {
	ca := harness.NewTestCA(t)
	r := harness.StartRedis(t, harness.RedisOptions{TLS: ca})
	n := NewNode(NodeConfig{Addr: r.Addr, KeyPrefix: "lp:", Timeout: time.Second, Metrics: NewMetrics(nil), TLS: ca.ClientConfig()})
	defer n.Close()
	ctx := ctxTimeout(t, 10*time.Second)
	direct := r.Client(t)
	received := func() int {
		info, err := direct.Info(ctx, "stats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(l, "total_connections_received:"); ok {
				n, _ := strconv.Atoi(v)
				return n
			}
		}
		t.Fatal("no total_connections_received")
		return 0
	}
	if _, err := n.Acquire(ctx, quorum.Request{Key: "a", Token: "t", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	before := received()
	for i := 0; i < 20; i++ {
		if _, err := n.Acquire(ctx, quorum.Request{Key: "a", Token: "t", TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if d := received() - before; d > 1 {
		t.Fatalf("the node took %d new connections over 20 acquires on idle connections; want at most 1", d)
	}
}

// overTCPAndTLS runs f as two subtests, "tcp" and "tls", each with a
// redis-server of its own (over TLS with a test CA in the second) and a
// NodeConfig for it: lp: keys, a 1 s node timeout.
func overTCPAndTLS(t *testing.T, f func(t *testing.T, r *harness.Redis, cfg NodeConfig)) {
	t.Helper()
	harness.RequireBinary(t, "redis-server", "redis-server")
	ca := harness.NewTestCA(t)
	for _, tc := range []struct {
		name string
		opts harness.RedisOptions
	}{{"tcp", harness.RedisOptions{}}, {"tls", harness.RedisOptions{TLS: ca}}} {
		t.Run(tc.name, func(t *testing.T) {
			r := harness.StartRedis(t, tc.opts)
			cfg := NodeConfig{Addr: r.Addr, KeyPrefix: "lp:", Timeout: time.Second, Metrics: NewMetrics(nil)}
			if tc.opts.TLS != nil {
				cfg.TLS = ca.ClientConfig()
			}
			f(t, r, cfg)
		})
	}
}
