package commands

import (
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/conf"
	"github.com/lockproxy/lockproxy/relay"
	"github.com/lockproxy/lockproxy/resp"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestTxArityRefusalsPipelined: MULTI, EXEC, DISCARD and UNWATCH that
// lockproxy refuses for their arity answer in their place among relayed
// commands sent in the same write, on a shared connection, on one pinned
// for WAIT, in RESP3 and on the event loop, and the state they leave is
// Redis's: a DISCARD refused inside MULTI leaves the transaction open
// (the next DISCARD answers +OK, an EXEC aborts), and the commands after
// run as Redis would run them.
func TestTxArityRefusalsPipelined(t *testing.T) {
	up := harness.StartRedis(t, harness.RedisOptions{})
	arity := func(n string) string { return "-ERR wrong number of arguments for '" + n + "' command" }
	for _, loop := range []bool{false, true} {
		rl := relay.New(relay.Config{Addr: up.Addr, PoolSize: 2, DialTimeout: time.Second,
			ReadTimeout: 10 * time.Second, Deny: conf.DefaultDenyCommands, KeyPrefix: "lockproxy:"})
		h := NewHandler(Options{Limits: testLimits, Backend: &fakeBackend{}, Relay: rl, LockPatterns: []string{"lock:*"}})
		addr := serveRelayed(t, &resp.Server{Handler: h, EventLoop: loop}, h, rl)
		for _, tc := range []struct {
			name string
			prep []string // sent one by one first
			cmds []string // sent in one write
			want []string // prefixes for errors
		}{
			{"MULTI x among relayed", nil,
				[]string{"SET o:1 1", "MULTI x", "GET o:1", "EXEC", "PING"},
				[]string{"+OK", arity("multi"), "$1", "-ERR EXEC without MULTI", "+PONG"}},
			{"MULTI x among relayed, pinned for WAIT", []string{"WAIT 0 0"},
				[]string{"SET o:2 1", "MULTI x", "GET o:2", "EXEC", "WAIT 0 0"},
				[]string{"+OK", arity("multi"), "$1", "-ERR EXEC without MULTI", ":0"}},
			{"DISCARD x then DISCARD", nil,
				[]string{"MULTI", "SET o:3 1", "DISCARD x", "GET o:3", "DISCARD", "GET o:3", "PING"},
				[]string{"+OK", "+QUEUED", arity("discard"), "+QUEUED", "+OK", "_", "+PONG"}},
			{"DISCARD x then EXEC", nil,
				[]string{"MULTI", "SET o:4 1", "DISCARD x", "EXEC", "GET o:4", "SET o:4 2", "GET o:4"},
				[]string{"+OK", "+QUEUED", arity("discard"), "-EXECABORT", "_", "+OK", "$2"}},
			{"DISCARD x then EXEC, RESP3", []string{"HELLO 3"},
				[]string{"MULTI", "SET o:5 1", "DISCARD x", "EXEC", "GET o:5", "SET o:5 2", "GET o:5"},
				[]string{"+OK", "+QUEUED", arity("discard"), "-EXECABORT", "_", "+OK", "$2"}},
			{"EXEC x in MULTI", nil,
				[]string{"MULTI", "SET o:6 1", "EXEC x", "GET o:6", "EXEC"},
				[]string{"+OK", "+QUEUED", "-EXECABORT", "_", "-ERR EXEC without MULTI"}},
			{"UNWATCH x among relayed", nil,
				[]string{"WATCH o:7", "UNWATCH x", "GET o:7", "UNWATCH", "GET o:7", "MULTI", "SET o:7 1", "EXEC"},
				[]string{"+OK", arity("unwatch"), "_", "+OK", "_", "+OK", "+QUEUED", "*[+OK]"}},
			{"DISCARD x outside MULTI among relayed", nil,
				[]string{"SET o:8 1", "DISCARD x", "GET o:8", "EXEC x", "GET o:8"},
				// redis-server 7.0.15 answers an EXEC with arguments as an
				// aborted transaction, with or without MULTI.
				[]string{"+OK", arity("discard"), "$1", "-EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' command", "$1"}},
		} {
			name := tc.name
			if loop {
				name += ", event loop"
			}
			t.Run(name, func(t *testing.T) {
				c := dialFrames(t, addr)
				for _, cmd := range tc.prep {
					if r := c.do(cmd); strings.HasPrefix(r, "-") {
						t.Fatalf("%s: %s", cmd, r)
					}
				}
				cmds := tc.cmds
				if loop {
					// Keys of their own: the upstream is the first pass's.
					cmds = make([]string, len(tc.cmds))
					for i, cmd := range tc.cmds {
						cmds[i] = strings.ReplaceAll(cmd, "o:", "l:")
					}
				}
				c.send(cmds...)
				got := c.readAll(len(tc.cmds), 5*time.Second)
				for i, w := range tc.want {
					r := ""
					if i < len(got) {
						r = got[i]
					}
					if strings.HasPrefix(w, "-") && !strings.HasPrefix(r, w) || !strings.HasPrefix(w, "-") && r != w {
						t.Errorf("%s: %s; want %s (all: %q)", cmds[i], r, w, got)
					}
				}
			})
		}
	}
}
