package transparent

import (
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestLockScriptsUnderCatchAllPattern: with a lock pattern of wildcards
// alone ('*': every key is a lock, a lockproxy that serves locks only),
// a lock script's ARGV (the holder's token, a TTL) is not taken for a
// lock key named outside KEYS: every such argument matches '*', and the
// seed's release, redis-py's and redsync's scripts were all refused
// ("the script's argument 'tok' is a lock key"), so no lock could be
// released or extended but by DEL and PEXPIRE. An argument that matches
// a pattern with text in it (lock:*) is still refused.
func TestLockScriptsUnderCatchAllPattern(t *testing.T) {
	// The seed article's compare-and-delete release.
	const release = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
	t.Parallel()
	e := start(t, "--lock-pattern", "*")
	c := e.client(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)
	const key = "order:lock:42"
	for _, step := range []struct {
		name, script string
		args         []any
		want         int64
	}{
		{"acquire", "", nil, 0},
		{"extend (compare-and-PEXPIRE)", "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end", []any{"tok-1", 20000}, 1},
		{"release by another token", release, []any{"tok-2"}, 0},
		{"release (the seed's script)", release, []any{"tok-1"}, 1},
	} {
		if step.script == "" {
			if ok, err := c.SetNX(ctx, key, "tok-1", 10*time.Second).Result(); err != nil || !ok {
				t.Fatalf("%s: SET NX PX = %v, %v", step.name, ok, err)
			}
			continue
		}
		n, err := c.Eval(ctx, step.script, []string{key}, step.args...).Int64()
		if err != nil || n != step.want {
			t.Errorf("%s: EVAL = %d, %v; want %d", step.name, n, err, step.want)
		}
	}
	e.requireGone(t, "after the release", key)

	// A pattern with text still catches a lock key passed as an argument.
	err := c.Eval(ctx, "return redis.call('get', KEYS[1])", []string{key}, "lock:other").Err()
	if err == nil || !strings.Contains(err.Error(), "argument 'lock:other' is a lock key") {
		t.Errorf("script with the lock key lock:other in ARGV = %v; want the refusal", err)
	}
}
