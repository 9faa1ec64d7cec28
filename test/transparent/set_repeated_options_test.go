package transparent

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestSetRepeatedOptionsAsRedis: SET's options as redis-server 7.0 takes
// them, checked against a node directly (on a key outside the patterns)
// and through lockproxy on a lock key. Redis lets an option be repeated,
// the last PX or EX winning (only PX with EX, or either with KEEPTTL, is a
// syntax error), and reads only the last TTL given; lockproxy answered a
// repeated PX or EX with a syntax error.
func TestSetRepeatedOptionsAsRedis(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := e.client(t)
	ctx := lockclient.CtxFor(t, 60*time.Second)
	for i, tc := range []struct {
		name string
		opts []any
		ok   bool  // Redis answers OK (else an error)
		pttl int64 // when ok, the key's TTL in ms is about this
	}{
		{"PX twice, the last wins", []any{"PX", 100, "PX", 20000}, true, 20000},
		{"PX twice, the last shorter", []any{"PX", 20000, "PX", 9000}, true, 9000},
		{"EX twice", []any{"EX", 1, "EX", 20}, true, 20000},
		{"NX twice", []any{"NX", "NX", "PX", 20000}, true, 20000},
		{"only the last TTL is read", []any{"PX", "abc", "PX", 20000}, true, 20000},
		{"PX then EX", []any{"PX", 20000, "EX", 20}, false, 0},
		{"EX then PX", []any{"EX", 20, "PX", 20000}, false, 0},
		{"NX and XX", []any{"NX", "XX", "PX", 20000}, false, 0},
		{"PX without a value", []any{"PX", 20000, "PX"}, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plain := fmt.Sprintf("plain:%d", i)
			lock := fmt.Sprintf("lock:rep%d", i)
			for _, target := range []struct {
				what string
				c    *redis.Client
				key  string
			}{{"redis-server", e.direct[0], plain}, {"lockproxy", c, lock}} {
				_, err := target.c.Do(ctx, append([]any{"SET", target.key, "tok"}, tc.opts...)...).Result()
				if (err == nil) != tc.ok {
					t.Errorf("%s: SET %s tok %v = %v; want ok %v", target.what, target.key, tc.opts, err, tc.ok)
					continue
				}
				if err != nil {
					if !strings.HasPrefix(err.Error(), "ERR syntax error") && !strings.HasPrefix(err.Error(), "ERR value is not an integer") {
						t.Errorf("%s: SET %s tok %v = %v; want Redis's error", target.what, target.key, tc.opts, err)
					}
					continue
				}
				d, err := target.c.PTTL(ctx, target.key).Result()
				if ms := d.Milliseconds(); err != nil || ms > tc.pttl || ms < tc.pttl-3000 {
					t.Errorf("%s: PTTL %s after SET %v = %v, %v; want about %d ms", target.what, target.key, tc.opts, d, err, tc.pttl)
				}
			}
		})
	}
	// locks.max_ttl (default 10 min) applies to the TTL the key gets, the
	// last one.
	if err := c.Do(ctx, "SET", "lock:repmax", "tok", "PX", 1000, "PX", int64(time.Hour/time.Millisecond)).Err(); err == nil {
		t.Errorf("SET lock:repmax tok PX 1000 PX 3600000 = OK; want refused (above locks.max_ttl)")
	}
	if n := e.present(t, "lock:repmax"); n != 0 {
		t.Errorf("lock key with the refused TTL is on %d node(s); want none", n)
	}
}
