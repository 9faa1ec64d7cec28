package postgres

import (
	"context"
	"fmt"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestHotKeyRenewLatency measures (it asserts nothing) what 1,000 LOCK …
// WAIT calls on one held key cost a RENEW of another key on the same
// backend (pool of 10). It runs only with LOCKPROXY_PG_HOTKEY=1:
//
//	LOCKPROXY_PG_HOTKEY=1 go test -count=1 -v -run TestHotKeyRenewLatency ./backends/postgres/
func TestHotKeyRenewLatency(t *testing.T) {
	if os.Getenv("LOCKPROXY_PG_HOTKEY") == "" {
		t.Skip("a measurement: set LOCKPROXY_PG_HOTKEY=1 to run it")
	}
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 10)
	ctx := context.Background()
	for _, k := range []string{"hot", "mine"} {
		if _, err := b.Lock(ctx, backends.LockRequest{Key: k, Token: "H", TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	measure := func(label string) {
		var ds []time.Duration
		for range 50 {
			s := time.Now()
			if _, err := b.Renew(ctx, "mine", "H", time.Minute); err != nil {
				t.Logf("%s: RENEW: %v", label, err)
			}
			ds = append(ds, time.Since(s))
			time.Sleep(20 * time.Millisecond)
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		t.Logf("%s: RENEW of another key p50 %v p90 %v max %v", label, ds[25], ds[45], ds[49])
	}
	measure("idle")
	wctx, cancel := context.WithTimeout(ctx, 8*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 1000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.Lock(wctx, backends.LockRequest{Key: "hot", Token: fmt.Sprint(i), TTL: time.Second, Wait: 7 * time.Second})
		}()
	}
	time.Sleep(time.Second)
	measure("1000 waiters on one key")
	cancel()
	wg.Wait()
}
