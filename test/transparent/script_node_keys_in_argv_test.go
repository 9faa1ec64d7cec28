package transparent

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestScriptCannotNameNodeKeysThroughArgvOrEscapes: a script on lock keys
// runs on the lock nodes as lockproxy's own user, where every key
// lockproxy keeps is reachable: the fence counters (redlock.key_prefix +
// "fence"), other holds' meta keys. A body that spells the prefix was
// refused, but the same name passed in ARGV, or spelled with a Lua escape
// ('lockproxy\58fence'), ran: DEL of the fence counters on every node
// made the next grant's fence start again from 1, below fences already
// handed out. The relay refuses both for the upstream; so does transparent
// mode now, and the counters stay.
func TestScriptCannotNameNodeKeysThroughArgvOrEscapes(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := redis.NewClient(&redis.Options{Addr: e.addr, Protocol: 2}) // LOCK's reply as a flat array
	t.Cleanup(func() { _ = c.Close() })
	ctx := lockclient.CtxFor(t, 30*time.Second)
	fence := func() int64 {
		t.Helper()
		g, err := c.Do(ctx, "LOCK", "lock:fenced", "PX", 5000).Slice()
		if err != nil || len(g) < 6 {
			t.Fatalf("LOCK = %v, %v", g, err)
		}
		if err := c.Do(ctx, "UNLOCK", "lock:fenced", g[1]).Err(); err != nil {
			t.Fatalf("UNLOCK: %v", err)
		}
		f, _ := g[5].(int64)
		return f
	}
	var last int64
	for range 3 {
		last = fence()
	}
	for _, tc := range []struct {
		name string
		body string
		argv []any
	}{
		{"prefix in ARGV", `if redis.call('get', KEYS[1]) == false then return redis.call('del', ARGV[1]) end return 0`, []any{keyPrefix + "fence"}},
		{"prefix spelled with a Lua escape", `if redis.call('get', KEYS[1]) == false then return redis.call('del', 'lockproxy\58fence') end return 0`, nil},
	} {
		v, err := c.Eval(ctx, tc.body, []string{"lock:other"}, tc.argv...).Result()
		if err == nil || !strings.Contains(err.Error(), "key_prefix") {
			t.Errorf("%s: EVAL = %v, %v; want it refused for naming lockproxy's own keys", tc.name, v, err)
		}
		if next := fence(); next <= last {
			t.Fatalf("%s: the next grant's fence is %d, not above the %d handed out before: the script deleted the fence counters", tc.name, next, last)
		} else {
			last = next
		}
	}
}
