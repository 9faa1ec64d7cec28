package transparent

import (
	"regexp"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestScriptErrorLineAsRedisSays: a script that fails on a lock key names
// the line of the client's own script, as Redis does (user_script:N),
// whichever way it is run on the nodes and with a shebang line or not.
// lockproxy runs the body inside a function of its own (the expiry check
// after it), and that function's header used to take the first line:
// every error named the line after the one that failed.
func TestScriptErrorLineAsRedisSays(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := e.client(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)
	line := regexp.MustCompile(`user_script:\d+:`)
	for _, tc := range []struct{ name, body string }{
		{"first line", `error('boom')`},
		{"third line", "local x = 1\n\nerror('boom')"},
		{"after a comment", "-- release\nreturn redis.call('get', KEYS[1]) + 1"},
		{"script that may acquire", "redis.call('set', KEYS[1], 'v', 'PX', 5000)\nerror('boom')"},
		{"shebang", "#!lua\nerror('boom')"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The same script straight on a node, on a key of its own:
			// what Redis says.
			want := e.direct[0].Eval(ctx, tc.body, []string{"plain"}).Err()
			got := c.Eval(ctx, tc.body, []string{"lock:line"}).Err()
			if want == nil || got == nil {
				t.Fatalf("errors: lockproxy %v, Redis %v; want both to fail", got, want)
			}
			if g, w := line.FindString(got.Error()), line.FindString(want.Error()); g != w || w == "" {
				t.Errorf("lockproxy's error %q names %q; Redis's %q names %q", got, g, want, w)
			}
		})
	}
}

// TestScriptVarargsAsRedis: a script on lock keys that names "..." (the
// chunk's varargs, empty in Redis) runs as it does on Redis. lockproxy's
// function around the body took no varargs, so such a script failed to
// compile ("cannot use '...' outside a vararg function").
func TestScriptVarargsAsRedis(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := e.client(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)
	for _, tc := range []struct{ name, body string }{
		{"count", `return select('#', ...)`},
		{"table", "local a = {...}\nreturn #a"},
		{"shebang", "#!lua\nreturn select('#', ...)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, werr := e.direct[0].Eval(ctx, tc.body, []string{"plain"}).Result()
			got, gerr := c.Eval(ctx, tc.body, []string{"lock:varargs"}).Result()
			if werr != nil || gerr != nil || got != want {
				t.Errorf("lockproxy answered %v, %v; Redis %v, %v", got, gerr, want, werr)
			}
		})
	}
}
