package transparent

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestWithUpstream: transparent mode and the drop-in relay together. Lock
// keys go to the nodes and never to the upstream, other keys to the
// upstream and never to the nodes; in one pipeline mixing both, every
// reply comes back in order; inside MULTI a lock-key command is refused
// and the transaction aborts, as Redis does for a bad command.
func TestWithUpstream(t *testing.T) {
	t.Parallel()
	e, c, upc := startWithUpstream(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)

	cmds, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, "plain:a", "1", 0)
		p.SetNX(ctx, "lock:x", "tok", 5*time.Second)
		p.Get(ctx, "plain:a")
		p.Get(ctx, "lock:x")
		p.Incr(ctx, "plain:n")
		p.Del(ctx, "lock:x")
		return nil
	})
	if err != nil {
		t.Fatalf("pipeline: %v", err)
	}
	var got []string
	for _, cmd := range cmds {
		got = append(got, cmd.String())
	}
	want := []string{"set plain:a 1: OK", "set lock:x tok ex 5 nx: true", "get plain:a: 1", "get lock:x: tok", "incr plain:n: 1", "del lock:x: 1"}
	for i := range want {
		if i >= len(got) || got[i] != want[i] {
			t.Fatalf("pipeline replies %q; want %q", got, want)
		}
	}
	if n, _ := upc.Exists(ctx, "lock:x", keyPrefix+"lock:lock:x").Result(); n != 0 {
		t.Errorf("the upstream has %d lock keys; want none", n)
	}
	for i, d := range e.direct {
		if n, _ := d.Exists(ctx, "plain:a", "plain:n").Result(); n != 0 {
			t.Errorf("node %d has %d plain keys; want none", i, n)
		}
	}
	if v, _ := upc.Get(ctx, "plain:a").Result(); v != "1" {
		t.Errorf("upstream plain:a = %q; want 1", v)
	}

	_, err = c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, "plain:b", "1", 0)
		p.SetNX(ctx, "lock:y", "tok", 5*time.Second)
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "EXECABORT") && !strings.Contains(err.Error(), "not allowed inside MULTI") {
		t.Errorf("MULTI with a lock-key SET = %v; want the lock-key command refused and EXECABORT", err)
	}
	if n, _ := upc.Exists(ctx, "plain:b").Result(); n != 0 {
		t.Errorf("the aborted transaction's plain:b exists on the upstream")
	}
}

// TestFenceThroughLockInfo: acquisitions in transparent mode get fences
// like LOCK's, shown by LOCKINFO: SET NX PX and a script that sets the key
// (as bsm/redislock's obtain does), each above the grant before.
func TestFenceThroughLockInfo(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := redis.NewClient(&redis.Options{Addr: e.addr, Protocol: 2}) // LOCKINFO as a flat array
	t.Cleanup(func() { _ = c.Close() })
	ctx := lockclient.CtxFor(t, 30*time.Second)
	fence := func(key, tok string) int64 {
		t.Helper()
		v, err := c.Do(ctx, "LOCKINFO", key, "TOKEN", tok).Slice()
		if err != nil {
			t.Fatalf("LOCKINFO %s: %v", key, err)
		}
		for i := 0; i+1 < len(v); i += 2 {
			if v[i] == "fence" {
				f, _ := v[i+1].(int64)
				return f
			}
		}
		t.Fatalf("LOCKINFO %s = %v: no fence", key, v)
		return 0
	}
	// PX 1000: 50 ms per node. PX 100's 10 ms, on instances just started,
	// were refused (NOQUORUM) on a loaded CI host.
	g, err := c.Do(ctx, "LOCK", "lock:f", "PX", 1000).Slice()
	if err != nil {
		t.Fatal(err)
	}
	first, _ := g[5].(int64)
	time.Sleep(1100 * time.Millisecond)
	if ok, err := c.SetNX(ctx, "lock:f", "a", 5*time.Second).Result(); !ok || err != nil {
		t.Fatalf("SET NX PX = %v, %v", ok, err)
	}
	second := fence("lock:f", "a")
	if second <= first {
		t.Errorf("SET NX PX's fence %d; want above the LOCK's %d", second, first)
	}
	if n, _ := c.Del(ctx, "lock:f").Result(); n != 1 {
		t.Fatalf("DEL = %d", n)
	}
	script := "return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', 5000)"
	if v, err := c.Eval(ctx, script, []string{"lock:f"}, "b").Result(); err != nil || v != "OK" {
		t.Fatalf("script acquisition = %v, %v", v, err)
	}
	if third := fence("lock:f", "b"); third <= second {
		t.Errorf("script acquisition's fence %d; want above SET NX PX's %d", third, second)
	}
}

// TestScriptsWithUpstream: with an upstream, an EVALSHA may be served by
// the nodes (lock keys) or relayed (other keys), so SCRIPT LOAD reaches
// both, SCRIPT EXISTS answers 1 only for a script both have, and SCRIPT
// FLUSH is relayed (and denied by default) instead of answered here: the
// client's NOSCRIPT, LOAD, EVALSHA fallback (redis-py's Script) works for
// either kind of key.
func TestScriptsWithUpstream(t *testing.T) {
	t.Parallel()
	_, c, upc := startWithUpstream(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)

	// A script on plain keys, the way redis-py's Script calls it.
	incr := "return redis.call('incr', KEYS[1])"
	sha := sha1hex(incr)
	if err := c.EvalSha(ctx, sha, []string{"plain:ctr"}).Err(); err == nil || !strings.HasPrefix(err.Error(), "NOSCRIPT") {
		t.Fatalf("EVALSHA before SCRIPT LOAD = %v; want NOSCRIPT", err)
	}
	if got, err := c.ScriptLoad(ctx, incr).Result(); err != nil || got != sha {
		t.Fatalf("SCRIPT LOAD = %q, %v; want %s", got, err, sha)
	}
	if n, err := c.EvalSha(ctx, sha, []string{"plain:ctr"}).Int64(); err != nil || n != 1 {
		t.Errorf("EVALSHA on a plain key after SCRIPT LOAD = %d, %v; want 1", n, err)
	}
	if v, err := upc.ScriptExists(ctx, sha).Result(); err != nil || !v[0] {
		t.Errorf("the upstream's SCRIPT EXISTS = %v, %v; want it loaded", v, err)
	}

	// A lock script known here only (an EVAL on a lock key), one known to
	// the upstream only, one known to neither, and the one both know.
	if err := c.Eval(ctx, acquireScript, []string{"lock:s"}, "tok", 5000).Err(); err != nil {
		t.Fatalf("EVAL on a lock key: %v", err)
	}
	upOnly := "return 42"
	if err := upc.ScriptLoad(ctx, upOnly).Err(); err != nil {
		t.Fatal(err)
	}
	got, err := c.ScriptExists(ctx, sha1hex(acquireScript), sha1hex(upOnly), sha1hex("return 7"), sha).Result()
	if want := []bool{false, false, false, true}; err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("SCRIPT EXISTS = %v, %v; want %v", got, err, want)
	}
	if err := c.ScriptLoad(ctx, acquireScript).Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := c.ScriptExists(ctx, sha1hex(acquireScript)).Result(); err != nil || !got[0] {
		t.Errorf("SCRIPT EXISTS after SCRIPT LOAD = %v, %v; want true", got, err)
	}
	if err := c.ScriptLoad(ctx, "return +").Err(); err == nil {
		t.Errorf("SCRIPT LOAD of a script that does not compile succeeded")
	}

	// FLUSH goes through upstream.deny_commands, which denies it by
	// default: nothing is flushed, here or there.
	if err := c.ScriptFlush(ctx).Err(); err == nil || !strings.Contains(err.Error(), "denied") {
		t.Errorf("SCRIPT FLUSH = %v; want it denied", err)
	}
	if got, err := c.ScriptExists(ctx, sha).Result(); err != nil || !got[0] {
		t.Errorf("SCRIPT EXISTS after a denied FLUSH = %v, %v; want true", got, err)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Errorf("PING: %v", err)
	}
}

func sha1hex(s string) string {
	sum := sha1.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestLockKeysNeverReachUpstream: with an upstream, a command transparent
// mode does not serve is refused when it names a lock key in any key
// position, rather than relayed, where it would act on another key of the
// same name (a lock of one node, or a holder check that reads nothing).
func TestLockKeysNeverReachUpstream(t *testing.T) {
	t.Parallel()
	_, c, upc := startWithUpstream(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)
	fn := "#!lua name=lk\nredis.register_function('acq', function(k, a) return redis.call('set', k[1], a[1], 'NX', 'PX', a[2]) end)"
	if err := upc.FunctionLoad(ctx, fn).Err(); err != nil {
		t.Fatal(err)
	}
	if err := upc.Set(ctx, "plain:src", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]any{
		{"MSETNX", "plain:a", "1", "lock:m", "tok"},
		{"FCALL", "acq", 1, "lock:f", "tok", 30000},
		{"HSET", "lock:h", "uuid:1", 1},
		{"HEXISTS", "lock:h", "uuid:1"},
		{"OBJECT", "ENCODING", "lock:x"},
		{"COPY", "plain:src", "lock:c"},
		{"RENAME", "plain:src", "lock:r"},
		{"SORT", "plain:list", "STORE", "lock:s"},
		{"INCR", "lock:i"},
	} {
		err := c.Do(ctx, args...).Err()
		if err == nil || !strings.Contains(err.Error(), "not supported on lock keys") {
			t.Errorf("%v = %v; want it refused", args, err)
		}
	}
	if keys, err := upc.Keys(ctx, "lock:*").Result(); err != nil || len(keys) != 0 {
		t.Errorf("the upstream's lock-pattern keys = %v, %v; want none", keys, err)
	}
	if v, err := upc.Get(ctx, "plain:src").Result(); err != nil || v != "v" {
		t.Errorf("plain:src = %q, %v; want it untouched", v, err)
	}
	// Inside MULTI the refusal aborts the transaction.
	_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, "plain:t", "1", 0)
		p.HSet(ctx, "lock:h", "f", "v")
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "EXECABORT") && !strings.Contains(err.Error(), "not supported on lock keys") {
		t.Errorf("MULTI with HSET on a lock key = %v; want EXECABORT", err)
	}
	if n, _ := upc.Exists(ctx, "plain:t", "lock:h").Result(); n != 0 {
		t.Errorf("the aborted transaction ran: %d keys", n)
	}
	// Commands on other keys are relayed as before.
	if n, err := c.Do(ctx, "FCALL", "acq", 1, "plain:f", "tok", 30000).Text(); err != nil || n != "OK" {
		t.Errorf("FCALL on a plain key = %q, %v; want OK", n, err)
	}
}

// startWithUpstream starts lockproxy in transparent mode in front of an
// upstream Redis of its own, and returns a client of each.
func startWithUpstream(t *testing.T) (*env, *redis.Client, *redis.Client) {
	t.Helper()
	up := harness.StartRedis(t, harness.RedisOptions{})
	e := start(t, "--upstream", up.Addr)
	return e, e.client(t), up.Client(t)
}
