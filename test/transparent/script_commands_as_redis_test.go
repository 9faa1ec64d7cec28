package transparent

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestScriptCommandsAsRedis: without an upstream, the script commands on
// a lock key answer as a plain redis-server does, error text included:
// EVAL_RO and EVALSHA_RO of a read (and their refusal of a write), a
// NOSCRIPT, SCRIPT LOAD of a script that does not compile, SCRIPT FLUSH
// and what EVALSHA and SCRIPT EXISTS answer after it, and a numkeys
// Redis refuses (negative, above the number of arguments, not a number),
// which lockproxy answered with "unknown command 'EVAL'", as if it served
// no scripts. The rows run in order on a plain redis-server and through
// lockproxy, with lock:a held by "tok" on both.
func TestScriptCommandsAsRedis(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := e.client(t)
	plain := harness.StartRedis(t, harness.RedisOptions{}).Client(t)
	ctx := lockclient.CtxFor(t, 60*time.Second)
	const key = "lock:a"
	if err := plain.Set(ctx, key, "tok", 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	if ok, err := c.SetNX(ctx, key, "tok", 10*time.Second).Result(); err != nil || !ok {
		t.Fatalf("SET NX PX through lockproxy = %v, %v", ok, err)
	}
	const (
		read  = `return redis.call('get', KEYS[1])`
		write = `return redis.call('del', KEYS[1])`
	)
	rows := [][]any{
		{"SCRIPT", "LOAD", read},
		{"SCRIPT", "LOAD", write},
		{"EVALSHA_RO", sha1hex(read), 1, key},
		{"EVAL_RO", read, 1, key},
		{"EVALSHA_RO", sha1hex(write), 1, key},
		{"EVAL_RO", write, 1, key},
		{"EVALSHA_RO", sha1hex("return 7"), 1, key},
		{"EVALSHA_RO", strings.ToUpper(sha1hex(read)), 1, key},
		{"EVALSHA_RO", sha1hex(read)[:39], 1, key},
		{"SCRIPT", "EXISTS", strings.ToUpper(sha1hex(read)), "nosuchsha"},
		{"SCRIPT", "LOAD", "return +"},
		{"SCRIPT", "EXISTS", sha1hex("return +"), sha1hex(read)},
		{"EVAL", "return +", 1, key},
		{"EVAL_RO", "return -", 1, key},
		{"SCRIPT", "EXISTS", sha1hex("return +"), sha1hex("return -")},
		{"EVALSHA", sha1hex("return +"), 1, key},
	}
	for _, cmd := range []string{"EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO"} {
		script := read
		if cmd == "EVALSHA" || cmd == "EVALSHA_RO" {
			script = sha1hex(read)
		}
		rows = append(rows,
			[]any{cmd, script, -1, key},
			[]any{cmd, script, 2, key},
			[]any{cmd, script, "one", key},
		)
	}
	rows = append(rows,
		[]any{"GET", key},
		[]any{"SCRIPT", "FLUSH", "NOW"},
		[]any{"SCRIPT", "FLUSH", "SYNC", "ASYNC"},
		[]any{"SCRIPT", "EXISTS", sha1hex(read)},
		[]any{"SCRIPT", "FLUSH"},
		[]any{"SCRIPT", "EXISTS", sha1hex(read)},
		[]any{"EVALSHA_RO", sha1hex(read), 1, key},
		[]any{"EVAL_RO", read, 1, key},
		[]any{"SCRIPT", "LOAD", read},
		[]any{"SCRIPT", "FLUSH", "async"},
		[]any{"SCRIPT", "EXISTS", sha1hex(read)},
		[]any{"SCRIPT", "LOAD", read},
		[]any{"SCRIPT", "FLUSH", "SYNC"},
		[]any{"SCRIPT", "EXISTS", sha1hex(read)},
	)
	reply := func(v any, err error) string {
		if err != nil && !errors.Is(err, redis.Nil) {
			return "error: " + err.Error()
		}
		return fmt.Sprint(v)
	}
	for _, args := range rows {
		want := reply(plain.Do(ctx, args...).Result())
		if got := reply(c.Do(ctx, args...).Result()); got != want {
			t.Errorf("%v: lockproxy %q; redis-server %q", args, got, want)
		}
	}
}

// TestScriptNumkeysAsRedisWithUpstream: with an upstream, EVAL, EVALSHA,
// FCALL and their _RO forms with a numkeys Redis refuses answer as the
// upstream, a plain redis-server, does (its refusal, or "Function not
// found" first for FCALL), also when a lock key is among the arguments:
// Redis runs nothing then, so there is no key to keep from it. lockproxy
// answered "'eval' is not supported on lock keys", which EVAL is, taking
// every argument after a bad numkeys for a key.
func TestScriptNumkeysAsRedisWithUpstream(t *testing.T) {
	t.Parallel()
	_, c, upc := startWithUpstream(t)
	ctx := lockclient.CtxFor(t, 60*time.Second)
	const read = `return redis.call('get', KEYS[1])`
	fn := "#!lua name=numkeys\nredis.register_function{function_name='getk', callback=function(k, a) return redis.call('get', k[1]) end, flags={'no-writes'}}"
	if err := upc.FunctionLoad(ctx, fn).Err(); err != nil {
		t.Fatal(err)
	}
	if err := upc.ScriptLoad(ctx, read).Err(); err != nil {
		t.Fatal(err)
	}
	reply := func(v any, err error) string {
		if err != nil && !errors.Is(err, redis.Nil) {
			return "error: " + err.Error()
		}
		return fmt.Sprint(v)
	}
	for _, cmd := range [][]any{
		{"EVAL", read}, {"EVAL_RO", read}, {"EVALSHA", sha1hex(read)}, {"EVALSHA_RO", sha1hex(read)},
		{"FCALL", "getk"}, {"FCALL_RO", "getk"}, {"FCALL", "nosuchfunction"},
	} {
		for _, key := range []string{"lock:a", "plain:a"} {
			for _, nk := range []any{-1, 2, "one"} {
				args := append(append([]any{}, cmd...), nk, key)
				want := reply(upc.Do(ctx, args...).Result())
				if got := reply(c.Do(ctx, args...).Result()); got != want {
					t.Errorf("%v: lockproxy %q; redis-server %q", args, got, want)
				}
			}
		}
	}
}
