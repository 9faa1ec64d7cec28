package transparent

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// lockInfoHolds returns the extra-hold count (LOCKINFO's holds) and the
// fence LOCKINFO shows for tok's hold of key; c speaks RESP2, so LOCKINFO
// is a flat array.
func lockInfoHolds(ctx context.Context, t *testing.T, c *redis.Client, key, tok string) (holds, fence int64) {
	t.Helper()
	v, err := c.Do(ctx, "LOCKINFO", key, "TOKEN", tok).Slice()
	if err != nil {
		t.Fatalf("LOCKINFO %s: %v", key, err)
	}
	for i := 0; i+1 < len(v); i += 2 {
		switch v[i] {
		case "fence":
			fence, _ = v[i+1].(int64)
		case "holders":
			hs, _ := v[i+1].([]any)
			if len(hs) == 1 {
				h, _ := hs[0].([]any)
				for j := 0; j+1 < len(h); j += 2 {
					if h[j] == "holds" {
						holds, _ = h[j+1].(int64)
					}
				}
			}
		}
	}
	return holds, fence
}

// TestTransparentRenewalExtendsReentrantHoldsAndFence: LOCK/UNLOCK and
// transparent commands share locks (README), and transparent code renews
// a lock with PEXPIRE, EXPIRE, a compare-and-PEXPIRE script (the seed's
// watchdog, redsync's touch, bsm/redislock's Refresh) or a SET XX PX of
// the holder's own token. Each must renew the whole hold, as RENEW does:
// were only the lock key extended, the hold's extra reentrant holds
// (lockm) and its fence (lockf) would still expire at the first TTL, and
// one UNLOCK of a token holding the lock twice would then free it while
// the token still holds it: another client's SET NX PX succeeds, two
// holders. LOCKINFO would also show a fence other than the grant's.
func TestTransparentRenewalExtendsReentrantHoldsAndFence(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := redis.NewClient(&redis.Options{Addr: e.addr, Protocol: 2}) // LOCKINFO as a flat array
	t.Cleanup(func() { _ = c.Close() })
	ctx := lockclient.CtxFor(t, 90*time.Second)
	// redsync's touch: scriptMayAcquire is false, so it runs as a plain
	// EVAL on every node.
	const touch = `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("pexpire", KEYS[1], ARGV[2]) else return 0 end`
	// A renewal written as a SET: it may write, so it runs with the reads
	// around it (RunScript), and leaves the value as it was.
	const setXX = `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("set", KEYS[1], ARGV[1], "XX", "PX", ARGV[2]) else return 0 end`
	for _, tc := range []struct {
		name  string
		renew func(key string) error
	}{
		{"PEXPIRE", func(key string) error { return c.PExpire(ctx, key, 5*time.Second).Err() }},
		{"EXPIRE", func(key string) error { return c.Expire(ctx, key, 5*time.Second).Err() }},
		{"compare-and-PEXPIRE script", func(key string) error { return c.Eval(ctx, touch, []string{key}, "lt", 5000).Err() }},
		{"compare-and-SET-XX script", func(key string) error { return c.Eval(ctx, setXX, []string{key}, "lt", 5000).Err() }},
		{"SET XX PX", func(key string) error { return c.SetXX(ctx, key, "lt", 5*time.Second).Err() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "lock:renew:" + strings.ReplaceAll(tc.name, " ", "-")
			var grant int64
			for i := 0; i < 2; i++ { // a reentrant hold: two LOCKs with one token
				g, err := c.Do(ctx, "LOCK", key, "PX", 1000, "TOKEN", "lt").Slice()
				if err != nil {
					t.Fatal(err)
				}
				grant, _ = g[5].(int64)
			}
			if err := tc.renew(key); err != nil {
				t.Fatal(err)
			}
			time.Sleep(1300 * time.Millisecond) // past the first TTL, within the renewed one
			// A rival's failed attempt, as happens while a lock is held.
			if ok, err := c.SetNX(ctx, key, "rival", 5*time.Second).Result(); err != nil || ok {
				t.Fatalf("rival SET NX PX while held = %v, %v", ok, err)
			}
			if holds, fence := lockInfoHolds(ctx, t, c, key, "lt"); holds != 2 || fence != grant {
				t.Errorf("LOCKINFO after the renewal: holds %d, fence %d; want the hold's 2 and %d", holds, fence, grant)
			}
			if err := c.Do(ctx, "UNLOCK", key, "lt").Err(); err != nil {
				t.Fatal(err)
			}
			if ok, err := c.SetNX(ctx, key, "other", 5*time.Second).Result(); err == nil && ok {
				t.Errorf("after UNLOCK of one of two holds, another client's SET NX PX succeeded: two holders")
			}
		})
	}
}

// TestTransparentPexpireReplies: PEXPIRE on a lock key answers as Redis
// does, whatever it does to the hold's other keys: 1 when the TTL was set,
// 0 when the key is absent or an option (NX here) kept it from being set.
func TestTransparentPexpireReplies(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := e.client(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)
	if n, err := c.PExpire(ctx, "lock:px:absent", 5*time.Second).Result(); err != nil || n {
		t.Errorf("PEXPIRE of an absent lock key = %v, %v; want false", n, err)
	}
	if ok, err := c.SetNX(ctx, "lock:px:held", "tok", 5*time.Second).Result(); err != nil || !ok {
		t.Fatalf("SET NX PX = %v, %v", ok, err)
	}
	if n, err := c.Do(ctx, "PEXPIRE", "lock:px:held", 8000, "NX").Int(); err != nil || n != 0 {
		t.Errorf("PEXPIRE … NX of a key with a TTL = %d, %v; want 0", n, err)
	}
	if n, err := c.PExpire(ctx, "lock:px:held", 8*time.Second).Result(); err != nil || !n {
		t.Errorf("PEXPIRE of a held lock key = %v, %v; want true", n, err)
	}
	if ms, err := c.PTTL(ctx, "lock:px:held").Result(); err != nil || ms <= 5*time.Second {
		t.Errorf("PTTL after PEXPIRE 8000 = %v, %v; want above 5 s", ms, err)
	}
}

// TestTransparentDelLeavesNoExtraHolds: a lock held twice with LOCK and
// then deleted with DEL (a transparent release) is free; a later LOCK
// with the same token is a first hold, which one UNLOCK releases. Were
// the deleted hold's extra-hold record (lockm) left behind, it would
// count for the new hold, which one UNLOCK would then not release.
func TestTransparentDelLeavesNoExtraHolds(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := redis.NewClient(&redis.Options{Addr: e.addr, Protocol: 2})
	t.Cleanup(func() { _ = c.Close() })
	ctx := lockclient.CtxFor(t, 30*time.Second)
	const key = "lock:del:reentrant"
	for i := 0; i < 2; i++ {
		if err := c.Do(ctx, "LOCK", key, "PX", 10000, "TOKEN", "dt").Err(); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := c.Del(ctx, key).Result(); err != nil || n != 1 {
		t.Fatalf("DEL = %d, %v; want 1", n, err)
	}
	if err := c.Do(ctx, "LOCK", key, "PX", 10000, "TOKEN", "dt").Err(); err != nil {
		t.Fatal(err)
	}
	if holds, _ := lockInfoHolds(ctx, t, c, key, "dt"); holds != 1 {
		t.Errorf("LOCKINFO holds after DEL and a new LOCK = %d; want 1", holds)
	}
	if err := c.Do(ctx, "UNLOCK", key, "dt").Err(); err != nil {
		t.Fatal(err)
	}
	if ok, err := c.SetNX(ctx, key, "other", 5*time.Second).Result(); err != nil || !ok {
		t.Errorf("SET NX PX after the one hold's UNLOCK = %v, %v; want OK", ok, err)
	}
}

// TestNonStringRefusalRollsBackStringWrites: a script that stores a list
// or a hash at one lock key is refused ("lock keys hold string tokens")
// and what it created there is deleted. Its writes to its other lock keys
// must be rolled back too: the client was told it failed, so an
// acquisition of KEYS[1] left on the nodes (not judged, without a fence)
// would be held by no one until its TTL ends. A deletion cannot be undone
// (the README says so): python-redis-lock's unlock script, when
// lock_patterns cover its signal key, releases the lock and gets the
// refusal, and the lock is then free.
func TestNonStringRefusalRollsBackStringWrites(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := e.client(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)
	const acquireAndQueue = `local ok = redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) redis.call('rpush', KEYS[2], ARGV[1]) return ok`
	// python-redis-lock's UNLOCK_SCRIPT (v3/v4).
	const pyUnlock = `if redis.call("get", KEYS[1]) ~= ARGV[1] then return 1 else redis.call("del", KEYS[2]) redis.call("lpush", KEYS[2], 1) redis.call("pexpire", KEYS[2], ARGV[2]) redis.call("del", KEYS[1]) return 0 end`
	for _, tc := range []struct {
		name   string
		held   bool // lock:<name> held by "tok" before the script
		script string
		args   []any
	}{
		// The write is rolled back: the key is free again.
		{"acquire-and-queue", false, acquireAndQueue, []any{"tok", 10000}},
		// The deletion stays: the key is free (documented).
		{"python-redis-lock-unlock", true, pyUnlock, []any{"tok", 100}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key, second := "lock:"+tc.name, "lock:"+tc.name+":signal"
			if tc.held {
				if ok, err := c.SetNX(ctx, key, "tok", 10*time.Second).Result(); err != nil || !ok {
					t.Fatalf("SET NX PX = %v, %v", ok, err)
				}
				// A majority granted it; the third node's acquire may
				// land after the script, whose deletion would then miss
				// it. The test is of the script: start with the key on
				// every node.
				e.requireOnEveryNode(t, "SET NX PX", key)
			}
			err := c.Eval(ctx, tc.script, []string{key, second}, tc.args...).Err()
			if err == nil || !strings.Contains(err.Error(), "string token") {
				t.Fatalf("script = %v; want the non-string refusal", err)
			}
			if n := e.present(t, key); n != 0 {
				t.Errorf("after the refused script %s is on %d of 3 nodes (held by %d with the script's value); want none: the client was told it failed",
					key, n, e.holding(t, key, "tok"))
			}
			if n := e.present(t, second); n != 0 {
				t.Errorf("after the refused script its list %s is on %d of 3 nodes; want it deleted", second, n)
			}
			if ok, err := c.SetNX(ctx, key, "other", 5*time.Second).Result(); err != nil || !ok {
				t.Errorf("another client's SET NX PX after the refusal = %v, %v; want OK (the key is free on Redis's terms: the script failed)", ok, err)
			}
		})
	}
}
