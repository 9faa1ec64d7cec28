package transparent

import (
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// redissonLock is Redisson's RLock acquisition script: a hash of holder →
// hold count, and the PTTL when another holds it.
const redissonLock = `if ((redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; return redis.call('pttl', KEYS[1]);`

// TestHashLockRefused: a script that stores something other than a string
// token at a lock key (a hash, as Redisson's locks) cannot be judged by
// the acquisition rule, which compares string values: it is refused with
// an error naming the reason, and what it created on each node is deleted,
// so no partial grant is left behind. A hash that was there before (not
// written through lockproxy) is left alone, and refused too.
func TestHashLockRefused(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := e.client(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)

	err := c.Eval(ctx, redissonLock, []string{"lock:r"}, 30000, "uuid-A:1").Err()
	if err == nil || !strings.Contains(err.Error(), "string token") {
		t.Errorf("Redisson's lock script = %v; want the refusal", err)
	}
	for i, d := range e.direct {
		if n, err := d.Exists(ctx, keyPrefix+"lock:lock:r").Result(); err != nil || n != 0 {
			t.Errorf("node %d: the script's hash is still there (%d, %v)", i, n, err)
		}
	}

	// Held by X as a hash on nodes 1 and 2, written directly; the script
	// creates its own on node 3.
	nk := keyPrefix + "lock:lock:p"
	for _, d := range e.direct[:2] {
		if err := d.HSet(ctx, nk, "uuid-X:1", 1).Err(); err != nil {
			t.Fatal(err)
		}
		d.PExpire(ctx, nk, 30*time.Second)
	}
	err = c.Eval(ctx, redissonLock, []string{"lock:p"}, 30000, "uuid-B:1").Err()
	if err == nil || !strings.Contains(err.Error(), "string token") {
		t.Errorf("Redisson's lock script on a key held as a hash = %v; want the refusal", err)
	}
	for i, d := range e.direct {
		fields, err := d.HGetAll(ctx, nk).Result()
		switch {
		case err != nil:
			t.Errorf("node %d: HGETALL: %v", i, err)
		case i < 2 && (len(fields) != 1 || fields["uuid-X:1"] != "1"):
			t.Errorf("node %d: X's hash = %v; want it untouched", i, fields)
		case i == 2 && len(fields) != 0:
			t.Errorf("node 3: the script's hash %v is still there; want it deleted", fields)
		}
	}

	// String locks on the same instance are unaffected.
	if ok, err := c.SetNX(ctx, "lock:s", "tok", 5*time.Second).Result(); err != nil || !ok {
		t.Errorf("SET NX PX after the refusals = %v, %v; want true", ok, err)
	}
}
