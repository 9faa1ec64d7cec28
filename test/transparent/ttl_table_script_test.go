package transparent

import (
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestScriptsReturningTimesAmongOtherValuesNotGuessed: a script whose
// reply carries a key's PTTL inside a table ({GET k, PTTL k}, as a
// "locked? and for how long" check), or computes one from several keys
// (the smallest PTTL of its keys), gets "no majority" when the nodes'
// leases differ, as they always do by some milliseconds. That is kept on
// purpose: lockproxy cannot tell which integers of a reply are times (a
// 1 may be a flag, a count, or a millisecond), and agreeing on each
// integer apart would build a reply no node gave (the value from one
// majority and the time from another). Only a script that returns a PTTL
// or TTL reply itself, and otherwise nothing that could pass for time
// left, gets PTTL's rule (TestBsmRedislockTTLWithNodesApart).
func TestScriptsReturningTimesAmongOtherValuesNotGuessed(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := e.client(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)
	for _, k := range []string{"lock:tt1", "lock:tt2"} {
		if err := c.Do(ctx, "SET", k, "tok", "NX", "PX", 10000).Err(); err != nil {
			t.Fatalf("SET %s NX PX: %v", k, err)
		}
		for i, ms := range []int64{9000, 6000, 3000} {
			if err := e.direct[i].PExpire(ctx, keyPrefix+"lock:"+k, time.Duration(ms)*time.Millisecond).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name, verb, body string
		keys             []string
	}{
		{"value and PTTL", "EVAL", `return {redis.call("get", KEYS[1]), redis.call("pttl", KEYS[1])}`, []string{"lock:tt1"}},
		{"value and PTTL, read-only", "EVAL_RO", `return {redis.call("get", KEYS[1]), redis.call("pttl", KEYS[1])}`, []string{"lock:tt1"}},
		{"smallest PTTL of the keys", "EVAL_RO", `local m = -2
for _, k in ipairs(KEYS) do
  local t = redis.call("pttl", k)
  if m == -2 or t < m then m = t end
end
return m`, []string{"lock:tt1", "lock:tt2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []any{tc.verb, tc.body, len(tc.keys)}
			for _, k := range tc.keys {
				args = append(args, k)
			}
			v, err := c.Do(ctx, args...).Result()
			if err == nil || !strings.HasPrefix(err.Error(), "ERR no majority") {
				t.Errorf("%s with 9 s, 6 s, 3 s left on the nodes = %v, %v; want ERR no majority (not a guess)", tc.verb, v, err)
			}
		})
	}
}
