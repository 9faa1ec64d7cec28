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

// TestScriptTurningStringLockIntoOtherTypeLeavesNothing: a script that
// deletes a lock key's string token and stores another type in its place
// is refused like one that creates it on a free key, and what it stored is
// deleted on every node: it made that value, no one else's is there (lock
// keys hold string tokens only). Before, only a value stored where there
// was nothing was deleted, and the hash stayed on the nodes, so SET NX
// found the key held and GET answered WRONGTYPE until its expiry.
func TestScriptTurningStringLockIntoOtherTypeLeavesNothing(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := e.client(t)
	ctx := lockclient.CtxFor(t, 60*time.Second)
	for _, tc := range []struct{ name, store string }{
		{"hash", `redis.call('hset', KEYS[1], ARGV[1], 1)`},
		{"list", `redis.call('rpush', KEYS[1], ARGV[1])`},
		{"set", `redis.call('sadd', KEYS[1], ARGV[1])`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "lock:retype:" + tc.name
			if ok, err := c.SetNX(ctx, key, "tok", 20*time.Second).Result(); err != nil || !ok {
				t.Fatalf("SET NX PX = %v, %v", ok, err)
			}
			// The script is the test: start with the token on every node.
			e.requireOnEveryNode(t, "SET NX PX", key)
			script := `if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end redis.call('del', KEYS[1]) ` +
				tc.store + ` redis.call('pexpire', KEYS[1], 20000) return 1`
			err := c.Eval(ctx, script, []string{key}, "tok").Err()
			if err == nil || !strings.Contains(err.Error(), "string token") {
				t.Fatalf("script = %v; want the non-string refusal", err)
			}
			if n := e.present(t, key); n != 0 {
				t.Errorf("after the refused script %s is on %d of 3 nodes; want none (what the script stored there is deleted)", key, n)
			}
			if ok, err := c.SetNX(ctx, key, "other", 5*time.Second).Result(); err != nil || !ok {
				t.Errorf("SET NX PX after the refusal = %v, %v; want true", ok, err)
			}
		})
	}
}

// TestStringWrittenOverOtherTypeRolledBack: a SET (without NX) or a script
// that replaces a lock key's hash with a string token is refused like any
// script that finds another type there, and the token it wrote is rolled
// back with its other writes. Before, the string it left in the hash's
// place was not counted as a write: the client got the refusal, and its
// token held the key on every node for the whole TTL, so its own SET NX
// and every other client's found the lock taken by a holder that believed
// it had none.
func TestStringWrittenOverOtherTypeRolledBack(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := e.client(t)
	ctx := lockclient.CtxFor(t, 60*time.Second)
	for _, tc := range []struct {
		name, key string
		args      []any
	}{
		{"SET PX", "lock:over:set", []any{"SET", "lock:over:set", "tok", "PX", 20000}},
		{"SET XX PX", "lock:over:xx", []any{"SET", "lock:over:xx", "tok", "XX", "PX", 20000}},
		{"script", "lock:over:eval", []any{"EVAL", `redis.call('del', KEYS[1]) redis.call('set', KEYS[1], ARGV[1], 'PX', 20000) return 1`, 1, "lock:over:eval", "tok"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := tc.key
			// A hash on every node, written directly (what a hash lock
			// script leaves on a node whose answer was lost).
			for i, d := range e.direct {
				if err := d.HSet(ctx, keyPrefix+"lock:"+key, "uuid-X:1", 1).Err(); err != nil {
					t.Fatalf("node %d: HSET: %v", i, err)
				}
				d.PExpire(ctx, keyPrefix+"lock:"+key, 20*time.Second)
			}
			err := c.Do(ctx, tc.args...).Err()
			if err == nil || !strings.Contains(err.Error(), "string token") {
				t.Fatalf("%v over a hash = %v; want the non-string refusal", tc.args, err)
			}
			if n := e.holding(t, key, "tok"); n != 0 {
				t.Errorf("after the refusal the client's token holds %s on %d of 3 nodes; want none (rolled back)", key, n)
			}
			if ok, err := c.SetNX(ctx, key, "other", 5*time.Second).Result(); err != nil || !ok {
				t.Errorf("SET NX PX after the refusal = %v, %v; want true", ok, err)
			}
		})
	}
}
