package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestWaitSeesTransparentRelease: README, Transparent mode: "LOCK/UNLOCK
// and transparent commands see the same locks". A lock library's holder
// (SET NX PX 30 s) releases with its compare-and-delete script (or DEL)
// a quarter of a second into another client's LOCK … WAIT 4000 on the
// same key, through the same instance or another one. The waiter must get
// the lock, as it did when the head retried every 20–200 ms. Before, the
// head slept on the 30 s lease its refusal told (past the WAIT: no
// fallback) and the release, not announced, went unnoticed; then it tried
// again at least once a second (the cap on that sleep), about 750 ms after
// such a release. Now a transparent release is announced on every node
// (syncHoldsScript publishes it), so the grant must come well under that
// cap after the release.
func TestWaitSeesTransparentRelease(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	inA := startInstance(t, cl.addrs(), "--lock-pattern", "tl:*")
	inB := startInstance(t, cl.addrs(), "--lock-pattern", "tl:*")
	const cad = `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`
	for _, tc := range []struct {
		name    string
		waiter  string // the waiter's instance
		release func(ctx context.Context, c *redis.Client, key string) error
	}{
		{"compare-and-delete, same instance", inA.addr, func(ctx context.Context, c *redis.Client, key string) error {
			return c.Eval(ctx, cad, []string{key}, "lib-token").Err()
		}},
		{"compare-and-delete, other instance", inB.addr, func(ctx context.Context, c *redis.Client, key string) error {
			return c.Eval(ctx, cad, []string{key}, "lib-token").Err()
		}},
		{"DEL, other instance", inB.addr, func(ctx context.Context, c *redis.Client, key string) error {
			return c.Del(ctx, key).Err()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := lockclient.CtxFor(t, 30*time.Second)
			key := "tl:" + lockclient.RandID()
			lib := redis.NewClient(&redis.Options{Addr: inA.addr})
			defer lib.Close()
			if ok, err := lib.SetNX(ctx, key, "lib-token", 30*time.Second).Result(); !ok || err != nil {
				t.Fatalf("SET NX PX = %v, %v", ok, err)
			}
			w := redis.NewClient(&redis.Options{Addr: tc.waiter, ReadTimeout: 10 * time.Second})
			defer w.Close()
			got := make(chan any, 1)
			go func() {
				v, err := w.Do(ctx, "LOCK", key, "PX", 5000, "WAIT", 4000).Result()
				if err != nil {
					got <- err
					return
				}
				got <- v
			}()
			// Long enough for the waiter to be refused and subscribed, and
			// well before its fallback retry about 1 s after its attempts.
			time.Sleep(250 * time.Millisecond)
			released := time.Now()
			if err := tc.release(ctx, lib, key); err != nil {
				t.Fatalf("release: %v", err)
			}
			v := <-got
			took := time.Since(released)
			if v == nil || v == redis.Nil {
				t.Fatalf("LOCK … WAIT 4000 after the holder released at 0.25 s = %v; want a grant", v)
			} else if err, ok := v.(error); ok {
				t.Fatalf("LOCK … WAIT 4000 after the holder released at 0.25 s: %v; want a grant", err)
			}
			t.Logf("granted %v after the release", took)
			if took > announcedGrant {
				t.Errorf("LOCK … WAIT granted %v after the transparent release; want within %v: the release is announced, the 1 s fallback retry must not be what finds it",
					took, announcedGrant)
			}
		})
	}
}

// announcedGrant is how soon after an announced release a waiter must be
// granted: well under the 1 s cap on a waiting head's sleep, with room for
// a loaded machine.
const announcedGrant = 500 * time.Millisecond
