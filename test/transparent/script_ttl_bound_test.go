package transparent

import (
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestScriptCannotTakeLockPastMaxTTL: PEXPIRE above locks.max_ttl and SET
// without an expiry are refused on lock keys before they run (a node
// restarted without its data is kept out of the quorum for max_ttl, and
// no lock may outlive that). The same inside a script, a renewal that
// asks for an hour (the compare-and-PEXPIRE every library sends) or a
// PERSIST, left the lock key beyond max_ttl or without an expiry. Now the
// key's expiry is set to max_ttl in the same call, and the client gets an
// error instead of the script's reply (its renewal failed: the safe
// side); a renewal within max_ttl answers as before. Found by a review.
func TestScriptCannotTakeLockPastMaxTTL(t *testing.T) {
	t.Parallel()
	e := start(t, "--max-ttl", "1m")
	c := e.client(t)
	ctx := lockclient.CtxFor(t, 60*time.Second)
	const renew = `if redis.call('get',KEYS[1]) == ARGV[1] then return redis.call('pexpire',KEYS[1],ARGV[2]) else return 0 end`
	const persist = `if redis.call('get',KEYS[1]) == ARGV[1] then return redis.call('persist',KEYS[1]) else return 0 end`
	for _, tc := range []struct {
		name, key, body string
		args            []any
		wantErr         bool
	}{
		{"renewal within max_ttl", "lock:r1", renew, []any{"tok", 30000}, false},
		{"renewal to an hour", "lock:r2", renew, []any{"tok", 3600000}, true},
		{"PERSIST", "lock:r3", persist, []any{"tok"}, true},
		{"flags line first", "lock:r4", "#!lua flags=allow-oom\n" + renew, []any{"tok", 3600000}, true},
	} {
		if err := c.SetNX(ctx, tc.key, "tok", 5*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
		v, err := c.Eval(ctx, tc.body, []string{tc.key}, tc.args...).Result()
		switch {
		case tc.wantErr && (err == nil || !strings.Contains(err.Error(), "max_ttl")):
			t.Errorf("%s: %v, %v; want an error naming max_ttl", tc.name, v, err)
		case !tc.wantErr && (err != nil || v != int64(1)):
			t.Errorf("%s: %v, %v; want 1", tc.name, v, err)
		}
		for i, d := range e.direct {
			p, err := d.PTTL(ctx, keyPrefix+"lock:"+tc.key).Result()
			if err != nil || p <= 0 || p > time.Minute {
				t.Errorf("%s: the lock key's PTTL on node %d is %v (%v); want within max_ttl (1m)", tc.name, i, p, err)
			}
		}
	}
}
