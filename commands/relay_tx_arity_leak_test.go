package commands

import (
	"strings"
	"testing"

	"github.com/lockproxy/lockproxy/test/harness"
)

// TestTxCommandsWithWrongArityKeepUpstreamState: MULTI, EXEC, DISCARD and
// UNWATCH with extra arguments are refused by Redis for their arity, and
// the connection's state stays as it was: an EXEC or DISCARD refused so
// inside MULTI leaves the transaction open (flagged, EXEC aborts), an
// UNWATCH refused so leaves the keys watched, a MULTI refused so opens no
// transaction. lockproxy must track that state as Redis keeps it: taken
// for the end of the transaction or the watch, the pinned connection went
// back to the idle list still inside MULTI (or watching), and the next
// client that pinned it had its commands queued instead of run.
func TestTxCommandsWithWrongArityKeepUpstreamState(t *testing.T) {
	for _, tc := range []struct {
		name string
		cmds []string // client A's, on its own connection
		want []string // Redis's replies (prefixes for errors)
	}{
		{"DISCARD x in MULTI", []string{"MULTI", "DISCARD x", "SET a:1 1", "EXEC"},
			[]string{"+OK", "-ERR wrong number of arguments", "+QUEUED", "-EXECABORT"}},
		// Redis 7 aborts the transaction for an EXEC it refuses, and says
		// why, also when a queuing error flagged it before.
		{"EXEC x in MULTI", []string{"MULTI", "SET a:2 1", "EXEC x", "SET a:2 2", "EXEC"},
			[]string{"+OK", "+QUEUED", execArityAbort, "+OK", "-ERR EXEC without MULTI"}},
		{"EXEC x in a flagged MULTI", []string{"MULTI", "SET a:5", "EXEC x", "SET a:5 2", "EXEC"},
			[]string{"+OK", "-ERR wrong number of arguments", execArityAbort, "+OK", "-ERR EXEC without MULTI"}},
		{"MULTI x", []string{"MULTI x", "SET a:3 1", "EXEC"},
			[]string{"-ERR wrong number of arguments", "+OK", "-ERR EXEC without MULTI"}},
		{"MULTI x then a refused command", []string{"MULTI x", "SET a:4 1", "SET lockproxy:x 1", "EXEC", "PING"},
			[]string{"-ERR wrong number of arguments", "+OK", "-ERR key 'lockproxy:x' is reserved", "-ERR EXEC without MULTI", "+PONG"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := harness.StartRedis(t, harness.RedisOptions{})
			addr := defaultsProxy(t, up, 1)
			a := dialFrames(t, addr)
			for i, cmd := range tc.cmds {
				r := a.do(cmd)
				if w := tc.want[i]; strings.HasPrefix(w, "-") && !strings.HasPrefix(r, w) || !strings.HasPrefix(w, "-") && r != w {
					t.Errorf("A: %s: %s; want %s", cmd, r, w)
				}
			}
			a.nc.Close()
			// B pins a connection (the idle one, if A's went back).
			b := dialFrames(t, addr)
			for _, step := range [][2]string{{"WAIT 0 0", ":0"}, {"SET b 1", "+OK"}, {"GET b", "$1"}} {
				if r := b.do(step[0]); r != step[1] {
					t.Errorf("B: %s: %s; want %s (another client's state on the pinned connection)", step[0], r, step[1])
				}
			}
		})
	}
}

// TestUnwatchWithWrongArityKeepsTheWatch: an UNWATCH Redis refused for its
// arity leaves the keys watched; the connection must not go back to the
// idle list with the watch on it, where the next client's transaction
// would abort for a key it never watched.
func TestUnwatchWithWrongArityKeepsTheWatch(t *testing.T) {
	up := harness.StartRedis(t, harness.RedisOptions{})
	addr := defaultsProxy(t, up, 1)
	a := dialFrames(t, addr)
	for _, step := range [][2]string{{"WATCH w", "+OK"}, {"UNWATCH x", "-ERR wrong number of arguments for 'unwatch' command"}} {
		if r := a.do(step[0]); r != step[1] {
			t.Errorf("A: %s: %s; want %s", step[0], r, step[1])
		}
	}
	// w changes after A's WATCH: a transaction on the connection that
	// watches it aborts.
	if r := a.do("SET w changed"); r != "+OK" {
		t.Fatalf("A: SET w: %s", r)
	}
	b := dialFrames(t, addr)
	if r := b.do("MULTI"); r != "+OK" {
		t.Fatalf("B: MULTI: %s", r)
	}
	if r := b.do("SET b 1"); r != "+QUEUED" {
		t.Fatalf("B: SET: %s", r)
	}
	if r := b.do("EXEC"); r != "*[+OK]" {
		t.Errorf("B: EXEC of a transaction that watched nothing: %s; want *[+OK] (A's WATCH left on the connection B got)", r)
	}
}

// execArityAbort is Redis's reply to an EXEC with arguments inside MULTI.
const execArityAbort = "-EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' command"
