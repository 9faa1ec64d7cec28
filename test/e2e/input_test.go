package e2e

import (
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// badInput are commands lockproxy must refuse with an error reply, leaving
// the connection usable.
var badInput = []struct {
	name  string
	args  []string
	want  string // the whole error text, or a prefix when prefix is set
	exact bool
}{
	{"LOCK without key", []string{"LOCK"}, "ERR wrong number of arguments for 'lock' command", true},
	{"lowercase lock without key", []string{"lock"}, "ERR wrong number of arguments for 'lock' command", true},
	{"PX not an integer", []string{"LOCK", "k", "PX", "abc"}, "ERR value is not an integer or out of range", true},
	{"PX overflows int64", []string{"LOCK", "k", "PX", "99999999999999999999"}, "ERR value is not an integer or out of range", true},
	{"EX not an integer", []string{"LOCK", "k", "EX", "1.5"}, "ERR value is not an integer or out of range", true},
	{"WAIT not an integer", []string{"LOCK", "k", "PX", "1000", "WAIT", "soon"}, "ERR value is not an integer or out of range", true},
	{"PX 0", []string{"LOCK", "k", "PX", "0"}, "ERR ", false},
	{"PX negative", []string{"LOCK", "k", "PX", "-5"}, "ERR ", false},
	{"EX 0", []string{"LOCK", "k", "EX", "0"}, "ERR ", false},
	{"PX and EX", []string{"LOCK", "k", "PX", "1", "EX", "1"}, "ERR syntax error", true},
	{"PX twice", []string{"LOCK", "k", "PX", "1000", "PX", "1000"}, "ERR syntax error", true},
	{"unknown option", []string{"LOCK", "k", "NOSUCH", "1"}, "ERR syntax error", true},
	{"option without value", []string{"LOCK", "k", "PX"}, "ERR syntax error", true},
	{"TOKEN without value", []string{"LOCK", "k", "PX", "1000", "TOKEN"}, "ERR syntax error", true},
	{"TTL above max", []string{"LOCK", "k", "PX", "600001"}, "ERR ", false},
	{"EX above max", []string{"LOCK", "k", "EX", "601"}, "ERR ", false},
	{"TTL below min", []string{"LOCK", "k", "PX", "1"}, "ERR ", false},
	{"WAIT negative", []string{"LOCK", "k", "PX", "1000", "WAIT", "-1"}, "ERR ", false},
	{"empty key", []string{"LOCK", "", "PX", "1000"}, "ERR ", false},
	{"empty TOKEN", []string{"LOCK", "k", "PX", "1000", "TOKEN", ""}, "ERR ", false},
	{"UNLOCK without token", []string{"UNLOCK", "k"}, "ERR wrong number of arguments for 'unlock' command", true},
	{"UNLOCK extra argument", []string{"UNLOCK", "k", "t", "x"}, "ERR wrong number of arguments for 'unlock' command", true},
	{"UNLOCK empty key", []string{"UNLOCK", "", "t"}, "ERR ", false},
	{"RENEW without TTL", []string{"RENEW", "k", "t"}, "ERR wrong number of arguments for 'renew' command", true},
	{"RENEW PX not an integer", []string{"RENEW", "k", "t", "PX", "abc"}, "ERR value is not an integer or out of range", true},
	{"RENEW unknown unit", []string{"RENEW", "k", "t", "XX", "1000"}, "ERR syntax error", true},
	{"RENEW PX 0", []string{"RENEW", "k", "t", "PX", "0"}, "ERR ", false},
	{"RENEW TTL above max", []string{"RENEW", "k", "t", "PX", "600001"}, "ERR ", false},
	{"unknown command", []string{"NOSUCHCOMMAND", "a"}, "ERR unknown command", false},
}

func checkBadReply(t *testing.T, via string, args []string, got, want string, exact bool) {
	t.Helper()
	if exact && got != want || !exact && !strings.HasPrefix(got, want) {
		w := "= " + want
		if !exact {
			w = "starting with " + want
		}
		t.Errorf("%s %q = %q; want an error %s", via, args, got, w)
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	eachSize(t, func(t *testing.T, n int) {
		cl := startCluster(t, n)
		addr, _ := startProxy(t, cl.addrs())

		t.Run("raw", func(t *testing.T) {
			rc := lc.DialRaw(t, addr)
			for _, tc := range badInput {
				r := rc.Do(tc.args...)
				if r.Kind != '-' {
					t.Errorf("%s: raw %q = %v; want an error reply", tc.name, tc.args, r)
				} else {
					checkBadReply(t, tc.name+": raw", tc.args, r.Str, tc.want, tc.exact)
				}
				if p := rc.Do("PING"); p.Kind != '+' || p.Str != "PONG" {
					t.Fatalf("%s: PING on the same connection = %v; want +PONG", tc.name, p)
				}
			}
		})

		t.Run("go-redis", func(t *testing.T) {
			for _, proto := range []int{2, 3} {
				c := lc.NewClient(t, addr, proto)
				conn := c.Conn()
				t.Cleanup(func() { _ = conn.Close() })
				ctx := lockclient.CtxFor(t, 30*time.Second)
				id, err := conn.Do(ctx, "CLIENT", "ID").Int64()
				if err != nil {
					t.Fatalf("RESP%d: CLIENT ID: %v", proto, err)
				}
				for _, tc := range badInput {
					args := make([]any, len(tc.args))
					for i, a := range tc.args {
						args[i] = a
					}
					err := conn.Do(ctx, args...).Err()
					if err == nil {
						t.Errorf("%s: RESP%d %q: no error", tc.name, proto, tc.args)
					} else {
						checkBadReply(t, tc.name+": go-redis", tc.args, err.Error(), tc.want, tc.exact)
					}
					if p, err := conn.Ping(ctx).Result(); err != nil || p != "PONG" {
						t.Fatalf("%s: RESP%d PING after the error = %q, %v; want PONG", tc.name, proto, p, err)
					}
				}
				if id2, err := conn.Do(ctx, "CLIENT", "ID").Int64(); err != nil || id2 != id {
					t.Errorf("RESP%d: CLIENT ID after the errors = %d, %v; want %d (the same connection)", proto, id2, err, id)
				}
			}
		})

		// None of the refused commands took a lock.
		c := lc.NewClient(t, addr, 2)
		g := lc.MustLock(t, c, "k", "PX", 10000)
		if got := lc.Unlock(t, c, "k", g.Token); got != 1 {
			t.Errorf("UNLOCK k = %d; want 1", got)
		}
	})
}

func TestGarbageRESP(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		input string
		// before are the replies expected ahead of the protocol error.
		before []string
	}{
		{name: "bad bulk length", input: "*2\r\n$x\r\n"},
		{name: "bad multibulk length", input: "*abc\r\n"},
		{name: "integer inside a command", input: "*1\r\n:1\r\n"},
		{name: "bulk longer than its length", input: "*1\r\n$3\r\nabcdef\r\n"},
		{name: "unbalanced quotes inline", input: "\"PING\r\n"},
		{name: "after a valid command in the same write", input: "PING\r\n*2\r\n$x\r\n", before: []string{"+PONG"}},
	}
	eachSize(t, func(t *testing.T, n int) {
		cl := startCluster(t, n)
		addr, _ := startProxy(t, cl.addrs())
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				rc := lc.DialRaw(t, addr)
				rc.Write(tc.input)
				for _, b := range tc.before {
					r, err := rc.Read()
					if err != nil || string(r.Kind)+r.Str != b {
						t.Fatalf("%q: reply = %v, %v; want %s", tc.input, r, err, b)
					}
				}
				r, err := rc.Read()
				if err != nil {
					t.Fatalf("%q: reading the reply: %v; want -ERR Protocol error", tc.input, err)
				}
				if r.Kind != '-' || !strings.HasPrefix(r.Str, "ERR Protocol error") {
					t.Fatalf("%q: reply %v; want -ERR Protocol error…", tc.input, r)
				}
				// Then the server closes the connection.
				_ = rc.Conn.SetReadDeadline(time.Now().Add(5 * time.Second))
				extra, err := rc.BR.ReadByte()
				var ne net.Error
				switch {
				case errors.Is(err, io.EOF):
				case errors.As(err, &ne) && ne.Timeout():
					t.Errorf("%q: connection still open 5 s after the protocol error", tc.input)
				case err == nil:
					t.Errorf("%q: more data after the protocol error: %q", tc.input, extra)
				}
				// And still serves new connections.
				if p := lc.DialRaw(t, addr).Do("PING"); p.Kind != '+' || p.Str != "PONG" {
					t.Errorf("PING on a new connection = %v; want +PONG", p)
				}
			})
		}
	})
}
