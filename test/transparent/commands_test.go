package transparent

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// acquireScript is a lock acquisition written as a script, as some
// libraries do (bsm/redislock's obtain, node-redlock's acquire).
const acquireScript = `if redis.call("set", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then return 1 end return 0`

// TestTransparentCommands checks transparent mode's rules command by
// command: the majority's reply, the refusals, EVALSHA and NOSCRIPT, and
// that a script acquisition on a minority is rolled back.
func TestTransparentCommands(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := e.client(t)
	ctx := lockclient.CtxFor(t, 60*time.Second)
	do := func(args ...any) (any, error) { return c.Do(ctx, args...).Result() }
	wantErr := func(what, contains string, args ...any) {
		t.Helper()
		v, err := do(args...)
		if err == nil || !strings.Contains(err.Error(), contains) {
			t.Errorf("%s: %v = %v, %v; want an error containing %q", what, args, v, err, contains)
		}
	}
	want := func(what string, w any, args ...any) {
		t.Helper()
		v, err := do(args...)
		if errors.Is(err, redis.Nil) {
			err, v = nil, nil
		}
		if err != nil || v != w {
			t.Errorf("%s: %v = %#v, %v; want %#v", what, args, v, err, w)
		}
	}
	nodeSet := func(i int, key, value string) {
		t.Helper()
		if err := e.direct[i].Set(ctx, keyPrefix+"lock:"+key, value, 10*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
	}

	// Keys outside the patterns are not lockproxy's: without an upstream
	// they are unknown commands, as before.
	wantErr("non-lock key", "unknown command 'SET'", "SET", "plain", "v")
	wantErr("non-lock script", "unknown command 'EVAL'", "EVAL", "return 1", 1, "plain")

	// SET NX PX is an acquisition; the value is the token.
	want("SET NX PX", "OK", "SET", "lock:a", "t1", "NX", "PX", 5000)
	want("SET NX PX on a held lock", nil, "SET", "lock:a", "t2", "NX", "PX", 5000)
	e.requireHeld(t, "SET NX PX", "lock:a", "t1")
	want("GET", "t1", "GET", "lock:a")
	want("EXISTS", int64(1), "EXISTS", "lock:a")
	want("PEXPIRE GT", int64(0), "PEXPIRE", "lock:a", 1000, "GT")
	want("PEXPIRE", int64(1), "PEXPIRE", "lock:a", 8000)
	if v, err := c.PTTL(ctx, "lock:a").Result(); err != nil || v <= 5*time.Second || v > 8*time.Second {
		t.Errorf("PTTL after PEXPIRE 8000 = %v, %v; want in (5 s, 8 s]", v, err)
	}
	if v, err := c.TTL(ctx, "lock:a").Result(); err != nil || v < 5*time.Second || v > 8*time.Second {
		t.Errorf("TTL after PEXPIRE 8000 = %v, %v; want in [5 s, 8 s]", v, err)
	}
	want("SET XX PX", "OK", "SET", "lock:a", "t3", "XX", "PX", 5000)
	want("SET XX GET", "t3", "SET", "lock:a", "t4", "XX", "KEEPTTL", "GET")
	want("DEL", int64(1), "DEL", "lock:a")
	e.requireGone(t, "DEL", "lock:a")
	want("PTTL of a free lock", int64(-2), "PTTL", "lock:a")
	want("GET of a free lock", nil, "GET", "lock:a")

	// Refusals, each saying why. lock:a is free and lock:held held:
	// neither may change.
	want("SET NX PX", "OK", "SET", "lock:held", "h", "NX", "PX", 10000)
	e.requireOnEveryNode(t, "SET NX PX", "lock:held")
	for _, r := range []struct {
		what, contains string
		args           []any
	}{
		{"SET without TTL", "needs PX or EX", []any{"SET", "lock:a", "t", "NX"}},
		// On a free key it would store a key without expiry.
		{"SET NX KEEPTTL", "needs PX or EX", []any{"SET", "lock:a", "t", "NX", "KEEPTTL"}},
		{"SET PXAT", "PXAT/EXAT", []any{"SET", "lock:a", "t", "NX", "PXAT", time.Now().Add(time.Minute).UnixMilli()}},
		{"SET NX GET", "takes only PX or EX", []any{"SET", "lock:a", "t", "NX", "PX", 1000, "GET"}},
		{"SET above max TTL", "locks.max_ttl", []any{"SET", "lock:a", "t", "NX", "PX", 11 * 60 * 1000}},
		{"PEXPIRE above max TTL", "locks.max_ttl", []any{"PEXPIRE", "lock:a", 11 * 60 * 1000}},
		{"mixed DEL", "mixes lock keys", []any{"DEL", "lock:a", "plain"}},
		{"mixed script", "mix lock keys", []any{"EVAL", "return 1", 2, "lock:a", "plain"}},
		{"bad option", "syntax error", []any{"SET", "lock:a", "t", "NX", "PX", 1000, "BOGUS"}},
		{"bad TTL", "invalid expire time", []any{"SET", "lock:a", "t", "NX", "PX", 0}},
		// Single-key string commands: served by no rule of transparent
		// mode (GETDEL would release without the holder's check,
		// PERSIST and SETEX above max_ttl would outlive the restart
		// quarantine, EXPIREAT reads each node's clock).
		{"INCR", "not supported on lock keys", []any{"INCR", "lock:held"}},
		{"SETNX", "not supported on lock keys", []any{"SETNX", "lock:a", "t"}},
		{"GETDEL", "not supported on lock keys", []any{"GETDEL", "lock:held"}},
		{"GETEX", "not supported on lock keys", []any{"GETEX", "lock:held", "PX", 100}},
		{"GETEX PERSIST", "not supported on lock keys", []any{"GETEX", "lock:held", "PERSIST"}},
		{"EXPIREAT", "not supported on lock keys", []any{"EXPIREAT", "lock:held", time.Now().Add(time.Second).Unix()}},
		{"PEXPIREAT", "not supported on lock keys", []any{"PEXPIREAT", "lock:held", time.Now().Add(100 * time.Millisecond).UnixMilli()}},
		{"SETEX", "not supported on lock keys", []any{"SETEX", "lock:held", 1, "other"}},
		{"PSETEX", "not supported on lock keys", []any{"PSETEX", "lock:held", 100, "other"}},
		{"SETEX on a free key", "not supported on lock keys", []any{"SETEX", "lock:a", 10, "t"}},
		{"PSETEX on a free key", "not supported on lock keys", []any{"PSETEX", "lock:a", 10000, "t"}},
		{"PERSIST", "not supported on lock keys", []any{"PERSIST", "lock:held"}},
	} {
		wantErr(r.what, r.contains, r.args...)
	}
	e.requireGone(t, "refused commands on a free lock key", "lock:a")
	if n := e.holding(t, "lock:held", "h"); n != len(e.nodes) {
		t.Errorf("after the refused commands lock:held holds its value on %d of %d nodes; want all", n, len(e.nodes))
	}
	for i, d := range e.direct {
		if ms, err := d.PTTL(ctx, keyPrefix+"lock:lock:held").Result(); err != nil || ms <= 5*time.Second {
			t.Errorf("node %d: PTTL of lock:held after the refused commands = %v, %v; want above 5 s (untouched)", i, ms, err)
		}
	}

	// The nodes disagree: an error saying so, never a guess.
	nodeSet(0, "lock:split", "x")
	nodeSet(1, "lock:split", "y")
	wantErr("GET with no majority", "no majority", "GET", "lock:split")
	nodeSet(2, "lock:split", "y")
	want("GET with a majority", "y", "GET", "lock:split")

	// PTTL and TTL: -2 or -1 when a majority says so, else the time the
	// key is still on a majority. Each row sets the key on the nodes
	// directly: a TTL in ms, noExpiry, or absent.
	const noExpiry, absent = int64(0), int64(-1)
	for i, r := range []struct {
		nodes      [3]int64
		pttl, ttl  [2]int64 // the range [lo, hi] wanted; PTTL in ms, TTL in s
		noMajority bool
	}{
		{nodes: [3]int64{9000, 6000, 100}, pttl: [2]int64{4001, 6000}, ttl: [2]int64{4, 6}},
		{nodes: [3]int64{noExpiry, noExpiry, 9000}, pttl: [2]int64{-1, -1}, ttl: [2]int64{-1, -1}},
		{nodes: [3]int64{absent, noExpiry, noExpiry}, pttl: [2]int64{-1, -1}, ttl: [2]int64{-1, -1}},
		{nodes: [3]int64{noExpiry, absent, absent}, pttl: [2]int64{-2, -2}, ttl: [2]int64{-2, -2}},
		{nodes: [3]int64{noExpiry, 9000, 6000}, pttl: [2]int64{4001, 6000}, ttl: [2]int64{4, 6}},
		{nodes: [3]int64{noExpiry, absent, 9000}, noMajority: true},
	} {
		key := fmt.Sprintf("lock:ttl%d", i)
		for j, ms := range r.nodes {
			if ms == absent {
				continue
			}
			if err := e.direct[j].Set(ctx, keyPrefix+"lock:"+key, "v", time.Duration(ms)*time.Millisecond).Err(); err != nil {
				t.Fatal(err)
			}
		}
		for k, cmd := range []string{"PTTL", "TTL"} {
			v, err := c.Do(ctx, cmd, key).Int64()
			switch want := [2][2]int64{r.pttl, r.ttl}[k]; {
			case r.noMajority:
				if err == nil || !strings.Contains(err.Error(), "no majority") {
					t.Errorf("%s with %v on the nodes = %d, %v; want a no-majority error", cmd, r.nodes, v, err)
				}
			case err != nil || v < want[0] || v > want[1]:
				t.Errorf("%s with %v on the nodes = %d, %v; want in [%d, %d]", cmd, r.nodes, v, err, want[0], want[1])
			}
		}
	}

	// EVALSHA: unknown scripts get NOSCRIPT; after SCRIPT LOAD (or an
	// EVAL) they run on every node.
	sum := sha1.Sum([]byte(acquireScript))
	sha := hex.EncodeToString(sum[:])
	wantErr("EVALSHA before load", "NOSCRIPT", "EVALSHA", sha, 1, "lock:s", "tok", 5000)
	if v, err := c.ScriptExists(ctx, sha).Result(); err != nil || v[0] {
		t.Errorf("SCRIPT EXISTS before load = %v, %v; want false", v, err)
	}
	want("SCRIPT LOAD", sha, "SCRIPT", "LOAD", acquireScript)
	if v, err := c.ScriptExists(ctx, sha).Result(); err != nil || !v[0] {
		t.Errorf("SCRIPT EXISTS after load = %v, %v; want true", v, err)
	}
	want("EVALSHA acquisition", int64(1), "EVALSHA", sha, 1, "lock:s", "tok", 5000)
	e.requireHeld(t, "EVALSHA acquisition", "lock:s", "tok")
	want("EVALSHA on a held lock", int64(0), "EVALSHA", sha, 1, "lock:s", "tok2", 5000)
	want("EVAL_RO", "tok", "EVAL_RO", `return redis.call("get", KEYS[1])`, 1, "lock:s")
	wantErr("script error", "ERR", "EVAL", `return redis.call("nosuchcommand")`, 1, "lock:s")

	// A script acquisition that reaches only a minority is rolled back
	// and answered with the other nodes' "not acquired".
	nodeSet(1, "lock:minority", "other")
	nodeSet(2, "lock:minority", "other")
	want("script acquisition on a minority", int64(0), "EVAL", acquireScript, 1, "lock:minority", "mine", 5000)
	if v, err := e.direct[0].Get(ctx, keyPrefix+"lock:lock:minority").Result(); !errors.Is(err, redis.Nil) {
		t.Errorf("node 0 after the minority acquisition: GET = %q, %v; want no key (rolled back)", v, err)
	}
	// With one node already held by another, two of three is a majority.
	nodeSet(2, "lock:majority", "other")
	want("script acquisition on a majority", int64(1), "EVAL", acquireScript, 1, "lock:majority", "mine", 5000)
	e.requireHeld(t, "script acquisition on a majority", "lock:majority", "mine")

	// A paused node (SIGSTOP) answers nothing: plain commands are answered
	// by the majority, and a script acquisition on the two others stands.
	e.nodes[2].Pause()
	want("GET with a node paused", "mine", "GET", "lock:majority")
	want("script acquisition with a node paused", int64(1), "EVAL", acquireScript, 1, "lock:paused", "p", 5000)
	want("GET of it with a node paused", "p", "GET", "lock:paused")
	e.nodes[2].Resume()

	// A library that tries EVALSHA first and falls back to EVAL works on a
	// fresh instance (go-redis's Script.Run does exactly that).
	s := redis.NewScript(`return redis.call("pexpire", KEYS[1], ARGV[1])`)
	if v, err := s.Run(context.Background(), c, []string{"lock:majority"}, 3000).Int64(); err != nil || v != 1 {
		t.Errorf("Script.Run (EVALSHA, then EVAL) = %d, %v; want 1", v, err)
	}
}
