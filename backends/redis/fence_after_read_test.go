package redis

import (
	"errors"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/test/harness"
)

// backendOver is a Backend over addrs, configured like newRealBackend's:
// a lockproxy instance that reaches only some of the nodes (the others
// are refused addresses, as behind a partition).
func backendOver(t *testing.T, addrs ...string) *Backend {
	t.Helper()
	cfg := Config{RetryMin: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond,
		Quorum: quorum.Config{DriftFactor: 0.01, DriftMin: 2 * time.Millisecond}}
	for _, a := range addrs {
		cfg.Nodes = append(cfg.Nodes, NodeConfig{Addr: a, KeyPrefix: "lp:", Timeout: time.Second, Metrics: NewMetrics(nil)})
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// TestFenceOfWriteAfterRead: README promises every grant's fence is
// strictly greater than the fence of every earlier grant of the key. A
// read grant's fence is the highest slot counter among the nodes that
// granted it, and nothing raises the other nodes to it; a later write
// granted by a majority without the highest node reads lower counters.
//
// The counters of three nodes drift apart without any fault of the
// nodes: an instance cut off from n1 and n2 keeps trying (LOCK … WAIT
// retries), and each attempt's SET NX + HINCRBY reaches n0 alone. Then an
// instance cut off from n2 takes a read lock (n0, n1 grant: fence =
// n0's counter), releases it, and an instance cut off from n0 takes the
// write lock (n1, n2 grant): its fence is below the read's.
func TestFenceOfWriteAfterRead(t *testing.T) {
	harness.RequireBinary(t, "redis-server", "redis-server")
	rs := harness.StartRedisN(t, 3, harness.RedisOptions{})
	n0, n1, n2 := rs[0].Addr, rs[1].Addr, rs[2].Addr
	ctx := ctxTimeout(t, 60*time.Second)
	const key = "fence-after-read"

	cutOff := backendOver(t, n0, harness.RefusedAddr(t), harness.RefusedAddr(t))
	for i := 0; i < 20; i++ {
		_, err := cutOff.Lock(ctx, backends.LockRequest{Key: key, Token: "cut-off", TTL: time.Second})
		if !errors.Is(err, quorum.ErrNoQuorum) {
			t.Fatalf("attempt %d from the instance cut off from n1, n2 = %v; want NOQUORUM", i, err)
		}
	}

	reader := backendOver(t, n0, n1, harness.RefusedAddr(t))
	r, err := reader.Lock(ctx, backends.LockRequest{Key: key, Token: "reader", TTL: 10 * time.Second, Mode: backends.Read})
	if err != nil {
		t.Fatalf("RLOCK through the instance cut off from n2: %v", err)
	}
	if ok, err := reader.Unlock(ctx, key, "reader"); !ok || err != nil {
		t.Fatalf("UNLOCK reader = %v, %v", ok, err)
	}

	writer := backendOver(t, harness.RefusedAddr(t), n1, n2)
	w, err := writer.Lock(ctx, backends.LockRequest{Key: key, Token: "writer", TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("LOCK through the instance cut off from n0: %v", err)
	}
	if w.Fence <= r.Fence {
		t.Errorf("write grant after the read grant got fence %d, read grant had %d: "+
			"README says every fence is strictly greater than that of every earlier grant "+
			"(a resource that saw the reader's fence now refuses the writer)", w.Fence, r.Fence)
	}
}
