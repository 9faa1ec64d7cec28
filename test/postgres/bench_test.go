package postgres

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// BenchmarkPostgresCycles measures LOCK+UNLOCK cycles through one lockproxy
// on the shared PostgreSQL (fsync off, as the Redis nodes and ZooKeeper of
// test/bench run without syncing), each client on its own key, the way
// test/bench's BenchmarkBackends measures the other two backends:
//
//	go test -run '^$' -bench BenchmarkPostgresCycles -benchtime 3s ./test/postgres/
func BenchmarkPostgresCycles(b *testing.B) {
	addr := startInstance(b, shared.DSN(), newPrefix()).addr
	for _, clients := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			benchCycles(b, addr, clients)
		})
	}
}

func benchCycles(b *testing.B, addr string, clients int) {
	cs := make([]lockclient.Doer, clients)
	for i := range cs {
		cs[i] = lc.NewClient(b, addr, 2)
	}
	per := max(b.N/clients, 1)
	lat := make([][]time.Duration, clients)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	var failures int
	var mu sync.Mutex
	b.ResetTimer()
	start := time.Now()
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("bench-%d-%s", i, lockclient.RandID())
			for range per {
				t0 := time.Now()
				g, ok, err := lockclient.TryLock(ctx, cs[i], key, "PX", 10000)
				if err != nil || !ok {
					mu.Lock()
					failures++
					mu.Unlock()
					continue
				}
				if err := cs[i].Do(ctx, "UNLOCK", key, g.Token).Err(); err != nil {
					mu.Lock()
					failures++
					mu.Unlock()
					continue
				}
				lat[i] = append(lat[i], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	b.StopTimer()
	all := slices.Concat(lat...)
	slices.Sort(all)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(len(all))/el.Seconds(), "cycles/s")
	if len(all) > 0 {
		b.ReportMetric(float64(all[len(all)*50/100])/1e6, "p50-ms")
		b.ReportMetric(float64(all[min(len(all)*99/100, len(all)-1)])/1e6, "p99-ms")
	}
	b.ReportMetric(float64(failures), "failures")
}
