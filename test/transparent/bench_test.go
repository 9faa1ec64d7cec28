package transparent

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkCycles compares one lock cycle (acquire, release; each client
// on its own key) in transparent mode — SET NX PX plus the seed's
// compare-and-delete script through EVALSHA — with LOCK and UNLOCK on the
// same lockproxy, at 16 concurrent clients:
//
//	go test -run '^$' -bench Cycles -benchtime 3s ./test/transparent/
func BenchmarkCycles(b *testing.B) {
	e := start(b)
	c := e.client(b)
	var ids atomic.Int64
	run := func(b *testing.B, cycle func(ctx context.Context, key, token string) error) {
		b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0))) // about 16 goroutines
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			key := fmt.Sprintf("lock:bench:%d", ids.Add(1))
			for pb.Next() {
				if err := cycle(ctx, key, "token"); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	b.Run("transparent", func(b *testing.B) {
		run(b, func(ctx context.Context, key, token string) error {
			ok, err := c.SetNX(ctx, key, token, 5*time.Second).Result()
			if err != nil || !ok {
				return fmt.Errorf("SET NX = %v, %v", ok, err)
			}
			n, err := seedRelease.Run(ctx, c, []string{key}, token).Int64()
			if err != nil || n != 1 {
				return fmt.Errorf("release = %d, %v", n, err)
			}
			return nil
		})
	})
	b.Run("LOCK-UNLOCK", func(b *testing.B) {
		run(b, func(ctx context.Context, key, token string) error {
			if err := c.Do(ctx, "LOCK", key, "PX", 5000, "TOKEN", token).Err(); err != nil {
				return err
			}
			n, err := c.Do(ctx, "UNLOCK", key, token).Int64()
			if err != nil || n != 1 {
				return fmt.Errorf("UNLOCK = %d, %v", n, err)
			}
			return nil
		})
	})
}
