package redis

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/test/harness"
)

// BenchmarkRenewHold measures a KEEPALIVE watchdog's renewal (RenewHold)
// of a write hold of PX 5000 over three real redis-server nodes, set up
// as lockproxy's defaults set them up (pool_size 8, one batching writer
// per node), from 64 renewals in flight at once, as thousands of
// watchdogs renew: its wall time per renewal (the instance's renewal
// throughput is about its inverse), CPU and allocations in this process.
// The nodes share the host, so a loaded host inflates it.
func BenchmarkRenewHold(b *testing.B) {
	harness.RequireBinary(b, "redis-server", "redis-server")
	rs := harness.StartRedisN(b, 3, harness.RedisOptions{})
	cfg := Config{Quorum: quorum.Config{DriftFactor: 0.01, DriftMin: 2 * time.Millisecond}}
	for _, r := range rs {
		cfg.Nodes = append(cfg.Nodes, NodeConfig{Addr: r.Addr, KeyPrefix: "lp:",
			PoolSize: 8, Workers: 1, MaxBatch: 256, Timeout: quorum.DefaultTimeoutMax})
	}
	be, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = be.Close() })
	ctx := context.Background()
	const keys, ttl = 1000, 5 * time.Second
	for i := range keys {
		k := "bench-" + strconv.Itoa(i)
		if _, err := be.Lock(ctx, backends.LockRequest{Key: k, Token: "t-" + k, TTL: time.Minute}); err != nil {
			b.Fatal(err)
		}
	}
	var next, failed atomic.Int64
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			k := "bench-" + strconv.Itoa(int(next.Add(1)%keys))
			if v, err := be.RenewHold(ctx, k, "t-"+k, backends.Write, ttl); err != nil || v <= 0 {
				failed.Add(1)
			}
		}
	})
	b.StopTimer()
	if f := failed.Load(); f > 0 {
		b.ReportMetric(float64(f)/float64(b.N), "failed/op")
	}
}
