package commands

import (
	"context"
	"strings"
	"testing"

	"github.com/lockproxy/lockproxy/test/harness"
)

// TestLua51AnyEscapeCannotHidePrefix: Redis runs Lua 5.1, whose lexer
// reads a backslash before any character other than a digit, a line break
// or one of abfnrtv as that character: 'lockproxy\:lock:x' and
// 'lockprox\y:lock:x' are both "lockproxy:lock:x". A body that spells the
// prefix so must be refused as one that spells it '\58' is, or a script
// with no key at all overwrites a lock key.
func TestLua51AnyEscapeCannotHidePrefix(t *testing.T) {
	up := harness.StartRedis(t, harness.RedisOptions{})
	uc := up.Client(t)
	ctx := context.Background()
	addr := defaultsProxy(t, up, 2)
	for _, tc := range []struct {
		name string
		cmds [][]string // the first must be refused; the rest use what it would have loaded
	}{
		{"EVAL, backslash colon", [][]string{{"EVAL", `return redis.call('SET', 'lockproxy\:lock:x', 'stolen')`, "0"}}},
		{"EVAL, backslash letter", [][]string{{"EVAL", `return redis.call('SET', "lockprox\y:lock:x", 'stolen')`, "0"}}},
		{"EVAL_RO, backslash colon", [][]string{{"EVAL_RO", `return redis.call('GET', 'lockproxy\:lock:x')`, "0"}}},
		{"FUNCTION LOAD, then FCALL", [][]string{
			{"FUNCTION", "LOAD", "#!lua name=esc\nredis.register_function('esc', function() return redis.call('SET', 'lockproxy\\:lock:x', 'stolen') end)"},
			{"FCALL", "esc", "0"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := uc.Set(ctx, "lockproxy:lock:x", "token", 0).Err(); err != nil {
				t.Fatal(err)
			}
			c := dialFrames(t, addr)
			var got []string
			for _, cmd := range tc.cmds {
				c.sendArgs(cmd...)
				r, err := c.read(5e9)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, r)
			}
			if !strings.HasPrefix(got[0], "-ERR") || !strings.Contains(got[0], "reserved") {
				t.Errorf("%q: %s; want the reserved-prefix refusal", tc.cmds[0], got[0])
			}
			if v, _ := uc.Get(ctx, "lockproxy:lock:x").Result(); v != "token" {
				t.Errorf("replies %q: the lock key is now %q; want it untouched", got, v)
			}
		})
	}
}

// TestLuaEscapesNotSpellingPrefixRelayed: the escapes the check decodes
// must not make it refuse bodies that do not name the prefix, nor must a
// script argument that merely contains the prefix be refused. Each body
// is answered as Redis answers it.
func TestLuaEscapesNotSpellingPrefixRelayed(t *testing.T) {
	up := harness.StartRedis(t, harness.RedisOptions{})
	uc := up.Client(t)
	ctx := context.Background()
	addr := defaultsProxy(t, up, 2)
	for _, args := range [][]string{
		{"EVAL", `return 'lockproxy\n'`, "0"},
		{"EVAL", `return 'lockproxy\x3a'`, "0"},   // 5.1: "lockproxyx3a"
		{"EVAL", `return 'lockproxy\z:'`, "0"},    // 5.1: "lockproxyz:"
		{"EVAL", `return 'lockproxy\u{3a}'`, "0"}, // 5.1: "lockproxyu{3a}"
		{"EVAL", `return 'lockproxy\\58'`, "0"},   // a backslash, then 58
		{"EVAL", `return ARGV[1]`, "0", "app:lockproxy:x"},
	} {
		t.Run(args[1], func(t *testing.T) {
			a := make([]any, len(args))
			for i, x := range args {
				a[i] = x
			}
			want, err := uc.Do(ctx, a...).Text()
			if err != nil {
				t.Fatalf("upstream: %v", err)
			}
			c := dialFrames(t, addr)
			c.sendArgs(args...)
			r, err := c.read(5e9)
			if err != nil {
				t.Fatal(err)
			}
			if r != "$"+want {
				t.Errorf("%q: %s; want $%s, as Redis answers", args, r, want)
			}
		})
	}
}
