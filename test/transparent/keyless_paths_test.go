package transparent

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// Paths by which a lock key could be reached without naming it in a key
// position that transparent mode serves: a KEYS or SCAN pattern, a
// script's ARGV or body, another database, and the script cache that
// EVALSHA needs.

// keylessCAD is the compare-and-delete release script of lock libraries.
const keylessCAD = `if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end`

// TestKeysAndScanCannotMissHeldLocks: the seed's read-write lock takes a
// read lock with SET lock:x:read:<client> 1 NX PX, and a writer checks for
// readers with KEYS lock:x:read:* before its own SET NX PX. With an
// upstream, KEYS and SCAN are answered by the upstream, which never has
// lock keys (they are on the lock nodes): the writer would see no reader
// and take the write lock while the read lock is held. So a KEYS or SCAN
// MATCH pattern that may match a lock key is refused, with a reply that
// says where lock keys are; patterns that cannot, and the keyspace-wide
// forms (KEYS *, SCAN without MATCH), are relayed as before.
func TestKeysAndScanCannotMissHeldLocks(t *testing.T) {
	t.Parallel()
	_, c, upc := startWithUpstream(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)
	if ok, err := c.SetNX(ctx, "lock:doc:read:client1", "1", 10*time.Second).Result(); err != nil || !ok {
		t.Fatalf("reader's SET NX PX = %v, %v", ok, err)
	}
	if err := upc.Set(ctx, "plain:doc", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	scanKeys := func(v any) []any {
		l, _ := v.([]any)
		if len(l) != 2 {
			return nil
		}
		k, _ := l[1].([]any)
		return k
	}
	keysKeys := func(v any) []any { l, _ := v.([]any); return l }
	for _, tc := range []struct {
		name string
		args []any
		keys func(v any) []any
	}{
		{"KEYS", []any{"KEYS", "lock:doc:read:*"}, keysKeys},
		{"KEYS with ?", []any{"KEYS", "lock?doc:read:*"}, keysKeys},
		{"KEYS with a class", []any{"KEYS", "[l]ock:doc:read:*"}, keysKeys},
		{"KEYS starting with *", []any{"KEYS", "*:read:*"}, keysKeys},
		{"SCAN MATCH", []any{"SCAN", 0, "MATCH", "lock:doc:read:*", "COUNT", 1000}, scanKeys},
		{"SCAN COUNT then MATCH", []any{"SCAN", 0, "COUNT", 1000, "MATCH", "lock:*"}, scanKeys},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := c.Do(ctx, tc.args...).Result()
			if err != nil {
				// Refused: the writer's check fails loudly, not silently.
				if !strings.Contains(err.Error(), "lock nodes") {
					t.Errorf("%v = %v; want a refusal that says lock keys are on the lock nodes", tc.args, err)
				}
				return
			}
			if keys := tc.keys(v); len(keys) == 0 {
				t.Errorf("%v = %#v while lock:doc:read:client1 is held on the lock nodes; want the reader listed or the command refused", tc.args, v)
			}
		})
	}
	// Patterns that cannot match a lock key, and the keyspace-wide forms,
	// list the upstream's keys as before.
	for _, args := range [][]any{
		{"KEYS", "plain:*"},
		{"KEYS", "*"},
		{"SCAN", 0, "MATCH", "plain:*", "COUNT", 1000},
		{"SCAN", 0, "COUNT", 1000},
	} {
		if err := c.Do(ctx, args...).Err(); err != nil {
			t.Errorf("%v = %v; want it relayed", args, err)
		}
	}
	if keys, err := c.Keys(ctx, "plain:*").Result(); err != nil || len(keys) != 1 || keys[0] != "plain:doc" {
		t.Errorf("KEYS plain:* = %v, %v; want [plain:doc]", keys, err)
	}
}

// TestScriptsNamingLockKeysOutsideKEYSRefused: a script that names its
// lock key in ARGV or in its body instead of KEYS is not served by the
// lock nodes (transparent mode goes by KEYS): relayed to the upstream it
// would take a same-named key on one Redis while another client holds the
// lock on the quorum, two holders; served on the nodes (its KEYS being
// lock keys), the ARGV key would be used there as is, outside lockproxy's
// key namespace, where no lock is. Such scripts are refused, with a reply
// that says lock keys must be passed in KEYS.
func TestScriptsNamingLockKeysOutsideKEYSRefused(t *testing.T) {
	t.Parallel()
	_, c, upc := startWithUpstream(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)
	const argvSet = "return redis.call('set', ARGV[1], ARGV[2], 'NX', 'PX', ARGV[3])"
	if err := c.ScriptLoad(ctx, argvSet).Err(); err != nil {
		t.Fatalf("SCRIPT LOAD of a script that names no lock key: %v", err)
	}
	fn := "#!lua name=keyless\nredis.register_function('keyless_acq', function(k, a) return redis.call('set', a[1], a[2], 'NX', 'PX', a[3]) end)"
	if err := upc.FunctionLoad(ctx, fn).Err(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		lk   string // the lock key the script reaches
		args []any
	}{
		{"lock key in ARGV, numkeys 0", "lock:k1", []any{"EVAL", argvSet, 0, "lock:k1", "B", 10000}},
		{"lock key literal in the body", "lock:k2", []any{"EVAL", "return redis.call('set', 'lock:k2', ARGV[1], 'NX', 'PX', ARGV[2])", 0, "B", 10000}},
		{"lock key in ARGV, KEYS a plain key", "lock:k3", []any{"EVAL", "redis.call('incr', KEYS[1]) " + argvSet, 1, "plain:calls", "lock:k3", "B", 10000}},
		// Served on the lock nodes (KEYS[1] is a lock key), but ARGV[1]
		// would be used there as is, outside lockproxy's key namespace.
		{"lock key in ARGV, KEYS a lock key", "lock:k4", []any{"EVAL", "redis.call('pexpire', KEYS[1], 1000) " + argvSet, 1, "lock:other", "lock:k4", "B", 10000}},
		{"lock key literal in the body, KEYS a lock key", "lock:k5", []any{"EVAL", "redis.call('pexpire', KEYS[1], 1000) return redis.call('set', 'lock:k5', 'B', 'NX', 'PX', 10000)", 1, "lock:other2"}},
		{"EVALSHA, lock key in ARGV", "lock:k6", []any{"EVALSHA", sha1hex(argvSet), 0, "lock:k6", "B", 10000}},
		{"EVAL_RO, lock key in ARGV", "lock:k7", []any{"EVAL_RO", "return redis.call('get', ARGV[1])", 0, "lock:k7"}},
		{"FCALL, lock key in ARGV", "lock:k8", []any{"FCALL", "keyless_acq", 0, "lock:k8", "B", 10000}},
		{"SCRIPT LOAD, lock key literal in the body", "lock:k9", []any{"SCRIPT", "LOAD", "return redis.call('set', \"lock:k9\", 'B', 'NX', 'PX', 10000)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Client A holds the lock through transparent mode.
			if ok, err := c.SetNX(ctx, tc.lk, "A", 10*time.Second).Result(); err != nil || !ok {
				t.Fatalf("A's SET NX PX %s = %v, %v", tc.lk, ok, err)
			}
			// Client B's script must not reach a key of that name.
			v, err := c.Do(ctx, tc.args...).Result()
			if err == nil || errors.Is(err, redis.Nil) || !strings.Contains(err.Error(), "in KEYS") {
				up, _ := upc.Exists(ctx, tc.lk).Result()
				t.Errorf("%v = %#v, %v while A holds %s on the quorum (on the upstream: %d); want it refused, saying lock keys must be passed in KEYS",
					tc.args, v, err, tc.lk, up)
			}
		})
	}
	if n, err := upc.Exists(ctx, "lock:k1", "lock:k2", "lock:k3", "lock:k6", "lock:k8").Result(); err != nil || n != 0 {
		t.Errorf("lock-pattern keys on the upstream = %d, %v; want none", n, err)
	}
	// Scripts that name lock keys only in KEYS, and scripts that name
	// none (a comment mentioning one is no name), still run.
	if n, err := c.Eval(ctx, keylessCAD, []string{"lock:k1"}, "A").Int(); err != nil || n != 1 {
		t.Errorf("A's compare-and-delete through KEYS = %d, %v; want 1", n, err)
	}
	if n, err := c.Eval(ctx, "-- counts uses of lock:k1\nreturn redis.call('incr', KEYS[1])", []string{"plain:ctr"}).Int(); err != nil || n != 1 {
		t.Errorf("a plain script with a comment naming a lock key = %d, %v; want 1", n, err)
	}
	if v, err := c.Eval(ctx, argvSet, nil, "plain:k", "B", 10000).Text(); err != nil || v != "OK" {
		t.Errorf("a keyless script on a plain key = %q, %v; want OK", v, err)
	}
}

// TestScriptLoadInsideMultiSaysWhy: SCRIPT LOAD and SCRIPT EXISTS are
// refused inside MULTI (lockproxy remembers scripts for EVALSHA outside
// transactions only); the refusal says so, not that a lock key was named.
func TestScriptLoadInsideMultiSaysWhy(t *testing.T) {
	t.Parallel()
	_, c, _ := startWithUpstream(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)
	for _, sub := range [][]any{{"SCRIPT", "LOAD", "return 1"}, {"SCRIPT", "EXISTS", sha1hex("return 1")}} {
		cmds, _ := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Do(ctx, sub...)
			return nil
		})
		var errs []string
		for _, cmd := range cmds {
			if err := cmd.Err(); err != nil {
				errs = append(errs, err.Error())
			}
		}
		all := strings.Join(errs, " | ")
		if strings.Contains(all, "on a lock key") || !strings.Contains(all, "inside MULTI") || !strings.Contains(strings.ToLower(all), "script") {
			t.Errorf("%v inside MULTI: %q; want a refusal about scripts inside MULTI, not about lock keys", sub, all)
		}
	}
}

// TestScriptCacheEvictsSoLoadedScriptRuns: EVALSHA is served from the
// bodies this instance remembers. Once it remembers 4,096 it must make
// room for a new one, or a body loaded after that is never remembered:
// redis-py's Script answers NOSCRIPT with SCRIPT LOAD and EVALSHA again,
// and that EVALSHA would get NOSCRIPT once more although SCRIPT LOAD just
// answered the SHA1, for the life of the process.
func TestScriptCacheEvictsSoLoadedScriptRuns(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := e.client(t)
	ctx := lockclient.CtxFor(t, 120*time.Second)
	for from := 0; from < 4096; from += 512 {
		_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := from; i < from+512; i++ {
				p.ScriptLoad(ctx, "return "+strconv.Itoa(i))
			}
			return nil
		})
		if err != nil {
			t.Fatalf("SCRIPT LOAD: %v", err)
		}
	}
	if err := c.SetNX(ctx, "lock:py", "tok", 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	// redis-py's Script.__call__: EVALSHA; on NOSCRIPT, SCRIPT LOAD and
	// EVALSHA again.
	body := keylessCAD + " -- another application's release script"
	sha := sha1hex(body)
	err := c.EvalSha(ctx, sha, []string{"lock:py"}, "tok").Err()
	if err == nil || !strings.HasPrefix(err.Error(), "NOSCRIPT") {
		t.Fatalf("first EVALSHA = %v; want NOSCRIPT", err)
	}
	if got, err := c.ScriptLoad(ctx, body).Result(); err != nil || got != sha {
		t.Fatalf("SCRIPT LOAD = %q, %v; want %s", got, err, sha)
	}
	if n, err := c.EvalSha(ctx, sha, []string{"lock:py"}, "tok").Int(); err != nil || n != 1 {
		t.Errorf("EVALSHA right after SCRIPT LOAD answered its SHA1 = %d, %v; want 1 (released)", n, err)
	}
	// An EVAL is remembered as well, for the EVALSHA that follows it.
	if err := c.SetNX(ctx, "lock:py", "tok", 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	evalBody := keylessCAD + " -- a third application's"
	if n, err := c.Eval(ctx, evalBody, []string{"lock:py"}, "other").Int(); err != nil || n != 0 {
		t.Fatalf("EVAL = %d, %v; want 0 (not the holder)", n, err)
	}
	if n, err := c.EvalSha(ctx, sha1hex(evalBody), []string{"lock:py"}, "tok").Int(); err != nil || n != 1 {
		t.Errorf("EVALSHA after the EVAL of its body = %d, %v; want 1 (released)", n, err)
	}
}

// TestLockKeysRefusedOutsideDatabaseZero: on Redis, a key in database 1
// and one of the same name in database 0 are two keys. Lock keys live in
// one keyspace on the lock nodes, whatever the client selected: served in
// database 1, a SET NX PX would be refused because database 0 holds the
// key, and a DEL in database 1 would release database 0's holder. So with
// an upstream (where SELECT n ≠ 0 is allowed) lock-key commands are
// refused in a database other than 0, saying so; LOCK and the other lock
// commands, lockproxy's own, ignore SELECT.
func TestLockKeysRefusedOutsideDatabaseZero(t *testing.T) {
	t.Parallel()
	e, _, _ := startWithUpstream(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)
	db0 := redis.NewClient(&redis.Options{Addr: e.addr, DB: 0})
	db1 := redis.NewClient(&redis.Options{Addr: e.addr, DB: 1})
	t.Cleanup(func() { _ = db0.Close(); _ = db1.Close() })
	if ok, err := db0.SetNX(ctx, "lock:db", "zero", 10*time.Second).Result(); err != nil || !ok {
		t.Fatalf("db 0 SET NX PX = %v, %v", ok, err)
	}
	for _, tc := range []struct {
		name string
		run  func() error
	}{
		{"SET NX PX", func() error { return db1.SetNX(ctx, "lock:db", "one", 10*time.Second).Err() }},
		{"DEL", func() error { return db1.Del(ctx, "lock:db").Err() }},
		{"GET", func() error { return db1.Get(ctx, "lock:db").Err() }},
		{"EVAL", func() error { return db1.Eval(ctx, keylessCAD, []string{"lock:db"}, "zero").Err() }},
		{"INCR", func() error { return db1.Incr(ctx, "lock:db").Err() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.run(); err == nil || !strings.Contains(err.Error(), "SELECT 0") {
				t.Errorf("%s on a lock key in db 1 = %v; want it refused, saying to SELECT 0", tc.name, err)
			}
			if v, err := db0.Get(ctx, "lock:db").Result(); err != nil || v != "zero" {
				t.Errorf("after %s in db 1, db 0's lock:db = %q, %v; want \"zero\" untouched", tc.name, v, err)
			}
		})
	}
	// Other keys in database 1 are relayed as before.
	if err := db1.Set(ctx, "plain:db1", "v", 0).Err(); err != nil {
		t.Errorf("SET on a plain key in db 1: %v", err)
	}
	// Lock commands are lockproxy's and ignore SELECT: LOCK in db 1 holds
	// the lock db 0's SET NX PX sees.
	if err := db1.Do(ctx, "LOCK", "lock:dbl", "PX", 10000, "TOKEN", "one").Err(); err != nil {
		t.Fatalf("LOCK in db 1: %v", err)
	}
	if ok, err := db0.SetNX(ctx, "lock:dbl", "zero", 10*time.Second).Result(); err != nil || ok {
		t.Errorf("db 0 SET NX PX of a key LOCKed in db 1 = %v, %v; want nil (held)", ok, err)
	}
}

// TestEvalshaAfterNodesLoseScriptCache: lockproxy serves EVALSHA from the
// bodies it remembers, sent to the nodes with EVAL, so a node that lost
// its script cache (SCRIPT FLUSH on it, as here, or a restart) still runs
// a client's acquire, renewal, read and release scripts, and every node
// takes part: none answers NOSCRIPT half-way through a fan-out, nor in
// the line-up of the holds' keys that follows a write (its own EVALSHA,
// run again with EVAL on NOSCRIPT). Before each command the rows flush
// the script cache of one node, or of all.
func TestEvalshaAfterNodesLoseScriptCache(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := e.client(t)
	ctx := lockclient.CtxFor(t, 60*time.Second)
	const (
		touch = `if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end`
		read  = `return redis.call('get', KEYS[1])`
	)
	for _, body := range []string{acquireScript, touch, read, keylessCAD} {
		if err := c.ScriptLoad(ctx, body).Err(); err != nil {
			t.Fatalf("SCRIPT LOAD: %v", err)
		}
	}
	for _, tc := range []struct {
		name    string
		flushed []int // the nodes whose script cache is flushed
	}{
		{"one node", []int{0}},
		{"every node", []int{0, 1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "lock:flushed:" + strings.ReplaceAll(tc.name, " ", "-")
			flush := func() {
				t.Helper()
				for _, i := range tc.flushed {
					if err := e.direct[i].ScriptFlush(ctx).Err(); err != nil {
						t.Fatalf("node %d: SCRIPT FLUSH: %v", i, err)
					}
				}
			}
			flush()
			if n, err := c.EvalSha(ctx, sha1hex(acquireScript), []string{key}, "tok", 5000).Int(); err != nil || n != 1 {
				t.Fatalf("EVALSHA acquisition = %d, %v; want 1", n, err)
			}
			if n := e.holding(t, key, "tok"); n != len(e.nodes) {
				t.Errorf("after the EVALSHA acquisition the key holds the token on %d of %d nodes; want all", n, len(e.nodes))
			}
			flush()
			if n, err := c.EvalSha(ctx, sha1hex(touch), []string{key}, "tok", 20000).Int(); err != nil || n != 1 {
				t.Errorf("EVALSHA renewal = %d, %v; want 1", n, err)
			}
			for i, d := range e.direct {
				if ms, err := d.PTTL(ctx, keyPrefix+"lock:"+key).Result(); err != nil || ms <= 10*time.Second {
					t.Errorf("node %d: PTTL after the EVALSHA renewal to 20 s = %v, %v; want above 10 s", i, ms, err)
				}
			}
			flush()
			if v, err := c.Do(ctx, "EVALSHA_RO", sha1hex(read), 1, key).Text(); err != nil || v != "tok" {
				t.Errorf("EVALSHA_RO read = %q, %v; want tok", v, err)
			}
			flush()
			if n, err := c.EvalSha(ctx, sha1hex(keylessCAD), []string{key}, "tok").Int(); err != nil || n != 1 {
				t.Errorf("EVALSHA release = %d, %v; want 1", n, err)
			}
			e.requireGone(t, "EVALSHA release", key)
		})
	}
}
