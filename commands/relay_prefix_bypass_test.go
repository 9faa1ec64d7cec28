package commands

import (
	"context"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/harness"
)

// TestRelayCannotReachPrefixKeys: keys under redlock.key_prefix on the
// upstream (a lock node too, in some deployments) stay out of reach of
// relayed commands whatever their shape: an XREADGROUP whose GROUP clause
// comes after COUNT (Redis reads the options in any order, and a group
// may be named "streams"), and a script that gets the key's name in ARGV
// rather than KEYS. Each row's command must be refused, and the lock key
// must be left as it was.
func TestRelayCannotReachPrefixKeys(t *testing.T) {
	up := harness.StartRedis(t, harness.RedisOptions{})
	uc := up.Client(t)
	ctx := context.Background()
	addr := defaultsProxy(t, up, 2)
	if err := uc.XAdd(ctx, &goredis.XAddArgs{Stream: "lockproxy:s", Values: []string{"f", "v"}}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := uc.XGroupCreate(ctx, "lockproxy:s", "streams", "0").Err(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"XREADGROUP with GROUP after COUNT", []string{"XREADGROUP", "COUNT", "1", "GROUP", "streams", "c", "STREAMS", "lockproxy:s", ">"}},
		{"XREADGROUP with GROUP twice", []string{"XREADGROUP", "GROUP", "g", "c", "GROUP", "streams", "c", "STREAMS", "lockproxy:s", ">"}},
		{"EVAL with the key in ARGV", []string{"EVAL", "return redis.call('DEL', ARGV[1])", "0", "lockproxy:lock:x"}},
		{"EVAL naming the key with a Lua escape", []string{"EVAL", "return redis.call('DEL', 'lockproxy\\58lock:x')", "0"}},
		{"EVAL_RO with the key in ARGV", []string{"EVAL_RO", "return redis.call('GET', ARGV[1])", "0", "lockproxy:lock:x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := uc.Set(ctx, "lockproxy:lock:x", "token", 0).Err(); err != nil {
				t.Fatal(err)
			}
			c := dialFrames(t, addr)
			c.sendArgs(tc.args...)
			r, err := c.read(5e9)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(r, "-ERR") || !strings.Contains(r, "reserved") {
				t.Errorf("%q: %s; want the reserved-prefix refusal", tc.args, r)
			}
			if v, _ := uc.Get(ctx, "lockproxy:lock:x").Result(); v != "token" {
				t.Errorf("%q: the lock key is now %q; want it untouched", tc.args, v)
			}
		})
	}
}

// TestFunctionRestoreCannotBringPrefixKeys: FUNCTION LOAD of a library
// whose body names a key under redlock.key_prefix is refused; FUNCTION
// RESTORE of the same library, dumped elsewhere, must not let it in, or
// an FCALL with no key at all reaches the lock key.
func TestFunctionRestoreCannotBringPrefixKeys(t *testing.T) {
	ctx := context.Background()
	scratch := harness.StartRedis(t, harness.RedisOptions{}).Client(t)
	lib := "#!lua name=lib\nredis.register_function('f', function() return redis.call('DEL', 'lockproxy:lock:x') end)"
	if err := scratch.FunctionLoad(ctx, lib).Err(); err != nil {
		t.Fatal(err)
	}
	payload, err := scratch.FunctionDump(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	up := harness.StartRedis(t, harness.RedisOptions{})
	uc := up.Client(t)
	if err := uc.Set(ctx, "lockproxy:lock:x", "token", 0).Err(); err != nil {
		t.Fatal(err)
	}
	c := dialFrames(t, defaultsProxy(t, up, 2))
	c.sendArgs("FUNCTION", "LOAD", lib)
	if r, _ := c.read(5e9); !strings.HasPrefix(r, "-") {
		t.Fatalf("FUNCTION LOAD of a body naming the prefix: %s; want a refusal", r)
	}
	c.sendArgs("FUNCTION", "RESTORE", payload)
	r, _ := c.read(5e9)
	c.sendArgs("FCALL", "f", "0")
	r2, _ := c.read(5e9)
	if v, _ := uc.Get(ctx, "lockproxy:lock:x").Result(); v != "token" {
		t.Errorf("FUNCTION RESTORE: %s, FCALL f 0: %s; the lock key is now %q, want it untouched", r, r2, v)
	}
}
