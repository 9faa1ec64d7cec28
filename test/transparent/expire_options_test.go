package transparent

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestExpireOptionsAsRedis: PEXPIRE and EXPIRE on a lock key take Redis
// 7's options in any number and order and refuse the same combinations
// with the same words, checked before the TTL as Redis does (lockproxy
// took one option at most: `PEXPIRE k 20000 XX GT` got an arity error).
// Each row runs on a plain redis-server and through lockproxy, on a key
// held for 10 s on both.
func TestExpireOptionsAsRedis(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := e.client(t)
	plain := harness.StartRedis(t, harness.RedisOptions{}).Client(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)
	reply := func(v any, err error) string {
		if err != nil && !errors.Is(err, redis.Nil) {
			return "error: " + err.Error()
		}
		return fmt.Sprint(v)
	}
	for i, args := range [][]any{
		{"PEXPIRE", 20000, "XX", "GT"},
		{"PEXPIRE", 5000, "XX", "GT"},
		{"PEXPIRE", 5000, "LT", "XX"},
		{"PEXPIRE", 20000, "GT", "GT"},
		{"EXPIRE", 30, "gt"},
		{"PEXPIRE", 20000, "NX", "XX"},
		{"PEXPIRE", 20000, "XX", "NX"},
		{"PEXPIRE", 20000, "GT", "LT"},
		{"PEXPIRE", "soon", "GT", "LT"},
		{"PEXPIRE", 20000, "XX", "BOGUS"},
		{"PEXPIRE", "soon", "XX"},
	} {
		key := fmt.Sprintf("lock:exp%d", i)
		cmd := append([]any{args[0], key}, args[1:]...)
		var got [2]string
		for j, cl := range []*redis.Client{plain, c} {
			if err := cl.Set(ctx, key, "tok", 10*time.Second).Err(); err != nil {
				t.Fatalf("SET %s: %v", key, err)
			}
			got[j] = reply(cl.Do(ctx, cmd...).Result())
		}
		if got[0] != got[1] {
			t.Errorf("%v: lockproxy %q; redis-server %q", cmd, got[1], got[0])
		}
	}
}
