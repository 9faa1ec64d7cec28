package e2e

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

func TestGoRedisRESP2AndRESP3(t *testing.T) {
	t.Parallel()
	eachSize(t, func(t *testing.T, n int) {
		cl := startCluster(t, n)
		addr, _ := startProxy(t, cl.addrs())
		for _, tc := range []struct {
			proto int
			shape string
		}{
			{2, "[]interface {}"},
			{3, "map[interface {}]interface {}"},
		} {
			c := lc.NewClient(t, addr, tc.proto)
			ctx := lockclient.CtxFor(t, 20*time.Second)
			key := "proto-" + lockclient.RandID()
			v, err := c.Do(ctx, "LOCK", key, "PX", 10000).Result()
			if err != nil {
				t.Fatalf("RESP%d: LOCK %q: %v", tc.proto, key, err)
			}
			switch v.(type) {
			case []any:
				if tc.proto != 2 {
					t.Errorf("RESP%d: LOCK reply is a flat array %v; want a map", tc.proto, v)
				}
				if arr := v.([]any); len(arr) != 6 || arr[0] != "token" || arr[2] != "validity_ms" || arr[4] != "fence" {
					t.Errorf("RESP2: LOCK reply %v; want [token, <tok>, validity_ms, <n>, fence, <n>]", arr)
				}
			case map[any]any:
				if tc.proto != 3 {
					t.Errorf("RESP%d: LOCK reply is a map %v; want a flat array", tc.proto, v)
				}
			default:
				t.Errorf("RESP%d: LOCK reply %v is %T; want %s", tc.proto, v, v, tc.shape)
			}
			g, err := lockclient.ParseGrant(v)
			if err != nil {
				t.Fatalf("RESP%d: %v", tc.proto, err)
			}
			checkGrant(t, "LOCK", g, 10000)
			if err := c.Do(ctx, "LOCK", key, "PX", 10000).Err(); !errors.Is(err, redis.Nil) {
				t.Errorf("RESP%d: second LOCK %q: err = %v; want redis.Nil", tc.proto, key, err)
			}
			if got := lc.IntCmd(t, c, "RENEW", key, g.Token, "PX", 10000); got <= 0 {
				t.Errorf("RESP%d: RENEW = %d; want > 0", tc.proto, got)
			}
			if got := lc.Unlock(t, c, key, g.Token); got != 1 {
				t.Errorf("RESP%d: UNLOCK = %d; want 1", tc.proto, got)
			}
		}
	})
}

func TestRawHELLO(t *testing.T) {
	t.Parallel()
	eachSize(t, func(t *testing.T, n int) {
		cl := startCluster(t, n)
		addr, _ := startProxy(t, cl.addrs())
		rc := lc.DialRaw(t, addr)
		key := "hello-" + lockclient.RandID()

		steps := []struct {
			name  string
			args  []string
			kind  byte
			count int // elements (map: keys and values)
			null  bool
		}{
			{"LOCK under RESP2 is a flat array", []string{"LOCK", key, "PX", "10000"}, '*', 6, false},
			{"held under RESP2 is a null bulk", []string{"LOCK", key, "PX", "10000"}, '$', 0, true},
			{"HELLO 3 is a map", []string{"HELLO", "3"}, '%', 14, false},
			{"held under RESP3 is null", []string{"LOCK", key, "PX", "10000"}, '_', 0, true},
			{"LOCK under RESP3 is a map", []string{"LOCK", key + "-2", "PX", "10000"}, '%', 6, false},
			{"HELLO 2 is a flat array", []string{"HELLO", "2"}, '*', 14, false},
			{"LOCK after HELLO 2 is a flat array", []string{"LOCK", key + "-3", "PX", "10000"}, '*', 6, false},
		}
		for _, s := range steps {
			r := rc.Do(s.args...)
			if r.Kind != s.kind || r.Null != s.null || len(r.Elems) != s.count {
				t.Errorf("%s: %q = %v; want type %q, %d elements, null %v", s.name, s.args, r, s.kind, s.count, s.null)
				continue
			}
			if s.args[0] == "LOCK" && !s.null {
				m := r.Pairs()
				if m["token"].Kind != '$' || m["validity_ms"].Kind != ':' || m["fence"].Kind != ':' {
					t.Errorf("%s: %q = %v; want token bulk, validity_ms and fence integers", s.name, s.args, r)
				}
			}
			if s.args[0] == "HELLO" {
				if m := r.Pairs(); m["proto"].Int != int64(s.args[1][0]-'0') {
					t.Errorf("%s: proto = %v; want %s", s.name, m["proto"], s.args[1])
				}
			}
		}
	})
}
