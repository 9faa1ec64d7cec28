package transparent

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestFailedAcquisitionWithHoldersValueKeepsHold: many applications lock
// with a constant value ("1", "locked"). A client holds lock:cv = "1" on
// a majority (nodes 0 and 1); another tries the same key with the same
// value while node 1 is paused past the fan-out timeout. Its attempt
// fails (node 0 has the key, only node 2 takes the write) and is rolled
// back, also on node 1, whose answer was lost. That roll-back must not
// take the holder's "1" there: against one Redis the failed attempt
// changes nothing, and a third client must still be refused. For the
// script acquisition this failed before the roll-back on a lost node
// spared values a grant's fence is stored with; SET NX PX is checked
// alongside.
func TestFailedAcquisitionWithHoldersValueKeepsHold(t *testing.T) {
	for _, tc := range []struct {
		name    string
		attempt func(ctx context.Context, c *redis.Client, key string) (any, error)
	}{
		{"script", func(ctx context.Context, c *redis.Client, key string) (any, error) {
			return c.Eval(ctx, acquireScript, []string{key}, "1", 30000).Result()
		}},
		{"SET NX PX", func(ctx context.Context, c *redis.Client, key string) (any, error) {
			return c.Do(ctx, "SET", key, "1", "NX", "PX", 30000).Result()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := start(t)
			c := e.client(t)
			ctx := lockclient.CtxFor(t, 60*time.Second)
			const key = "lock:cv"
			holdOnTwo(t, ctx, e, c, key, "1")
			e.nodes[1].Pause()
			resumed := false
			defer func() {
				if !resumed {
					e.nodes[1].Resume()
				}
			}()
			v, err := tc.attempt(ctx, c, key)
			t.Logf("the second client's attempt with the holder's value: %v, %v", v, err)
			e.nodes[1].Resume()
			resumed = true
			// The roll-back queued for node 1 runs once it resumes.
			time.Sleep(500 * time.Millisecond)
			if n := e.holding(t, key, "1"); n < 2 {
				t.Errorf("the holder's value is on %d node(s) after another client's failed attempt; want 2 (nobody released it)", n)
			}
			if ok, err := c.SetNX(ctx, key, "other", 30*time.Second).Result(); ok || err != nil {
				t.Errorf("a third client's SET NX PX on the held key = %v, %v; want false", ok, err)
			}
		})
	}
}

// holdOnTwo has c hold key with value on nodes 0 and 1 only (as after a
// grant while node 2 was down): a majority, so a valid lock.
func holdOnTwo(t *testing.T, ctx context.Context, e *env, c *redis.Client, key, value string) {
	t.Helper()
	if ok, err := c.SetNX(ctx, key, value, 30*time.Second).Result(); !ok || err != nil {
		t.Fatalf("SET NX PX = %v, %v", ok, err)
	}
	// Answered once a majority granted: the third node's write may come
	// later, and must be there before node 2's copy is taken away, or the
	// holder is left on one node (seen on a loaded host).
	e.requireOnEveryNode(t, "holder", key)
	if err := e.direct[2].Del(ctx, keyPrefix+"lock:"+key).Err(); err != nil {
		t.Fatal(err)
	}
	e.requireHeld(t, "holder", key, value)
	// Open several connections in each node's pool, as a busy instance
	// has, so that a roll-back goes out on an idle one at once rather than
	// behind a new connection's handshake; and have every node run the
	// roll-back scripts once, so that node 1 has them cached.
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := redis.NewClient(&redis.Options{Addr: e.addr})
			defer cl.Close()
			for range 5 {
				cl.Del(ctx, fmt.Sprintf("lock:warm:%d", i))
			}
		}()
	}
	wg.Wait()
	for _, i := range []int{0, 2} {
		if err := e.direct[i].Set(ctx, keyPrefix+"lock:lock:warm", "x", 30*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if v, err := c.Eval(ctx, acquireScript, []string{"lock:warm"}, "y", 30000).Result(); err != nil || v != int64(0) {
		t.Fatalf("warm-up: a minority's script acquisition = %v, %v; want 0", v, err)
	}
}
