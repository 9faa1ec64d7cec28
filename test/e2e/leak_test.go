package e2e

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// goroutines reads lockproxy's goroutine count from its admin port.
func goroutines(t *testing.T, in *instance) int {
	t.Helper()
	code, body := httpGet(t, "http://"+in.admin+"/debug/pprof/goroutine?debug=1")
	if code != 200 {
		t.Fatalf("goroutine profile: HTTP %d", code)
	}
	first, _, _ := strings.Cut(body, "\n")
	n, err := strconv.Atoi(strings.TrimPrefix(first, "goroutine profile: total "))
	if err != nil {
		t.Fatalf("goroutine profile header %q: %v", first, err)
	}
	return n
}

// TestNoGoroutineLeak: after connections that lock, wait, take keepalive
// locks and vanish have all gone, and others that left in the middle of a
// command (before AUTH and after it) or after a wrong password, lockproxy's
// goroutines fall back to where they were.
func TestNoGoroutineLeak(t *testing.T) {
	cl := startCluster(t, 3)
	in := startInstanceEnv(t, cl.addrs(), []string{"LOCKPROXY_AUTH_PASSWORD=pw"})
	// Warm up: node connections and pools exist before the baseline.
	warm := redis.NewClient(&redis.Options{Addr: in.addr, Password: "pw", PoolSize: 1, MaxRetries: -1})
	g := lc.MustLock(t, warm, "warm", "PX", 1000)
	lc.Unlock(t, warm, "warm", g.Token)
	warm.Close()
	time.Sleep(200 * time.Millisecond)
	base := goroutines(t, in)

	const clients = 100
	var wg sync.WaitGroup
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			// Half a command, then gone: before AUTH, and after it.
			half := "*3\r\n$4\r\nAUTH\r\n$2\r\np"
			if i%2 == 1 {
				half = "*2\r\n$4\r\nAUTH\r\n$2\r\npw\r\n*4\r\n$4\r\nLOCK\r\n$3\r\nabc"
			}
			if nc, err := net.DialTimeout("tcp", in.addr, 5*time.Second); err == nil {
				_, _ = nc.Write([]byte(half))
				_ = nc.Close()
			}
			if i%5 == 0 {
				bad := redis.NewClient(&redis.Options{Addr: in.addr, Password: "wrong", PoolSize: 1, MaxRetries: -1})
				bad.Ping(ctx)
				bad.Close()
			}
			c := redis.NewClient(&redis.Options{Addr: in.addr, Password: "pw", Protocol: 2 + i%2, PoolSize: 1, MaxRetries: -1})
			defer c.Close()
			key := fmt.Sprintf("leak:%d", i%10)
			for j := 0; j < 5; j++ {
				v, err := c.Do(ctx, "LOCK", key, "PX", 2000, "WAIT", 50).Result()
				if err != nil || v == nil {
					continue
				}
				if gr, err := lockclient.ParseGrant(v); err == nil {
					c.Do(ctx, "UNLOCK", key, gr.Token)
				}
			}
			// A keepalive lock left to the disconnect, and a wait cut short
			// by it.
			c.Do(ctx, "LOCK", fmt.Sprintf("leak:ka:%d", i), "KEEPALIVE")
			if i%3 == 0 {
				short, cancelShort := context.WithTimeout(ctx, 30*time.Millisecond)
				c.Do(short, "LOCK", "leak:0", "PX", 1000, "WAIT", 5000)
				cancelShort()
			}
		}(i)
	}
	wg.Wait()

	last := requireGoroutinesSettle(t, in, base, "the clients")
	t.Logf("goroutines: %d before %d clients, %d after", base, clients, last)
}

// requireGoroutinesSettle waits up to 10 s for in's goroutines to come
// back to within 5 of base, its count before what the test did (named by
// before), and fails with a goroutine dump if they do not; it returns the
// last count.
func requireGoroutinesSettle(t *testing.T, in *instance, base int, before string) int {
	t.Helper()
	var last int
	err := eventually(100, 100*time.Millisecond, func() error {
		last = goroutines(t, in)
		if last > base+5 {
			return fmt.Errorf("%d goroutines; %d before %s", last, base, before)
		}
		return nil
	})
	if err != nil {
		_, dump := httpGet(t, "http://"+in.admin+"/debug/pprof/goroutine?debug=1")
		t.Fatalf("goroutines did not settle: %v\n%s", err, dump)
	}
	return last
}
