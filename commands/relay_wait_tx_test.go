package commands

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/relay"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestFailedMultiQueuesNothingOnPinnedConnection: a WATCH that got no
// upstream connection fails the transaction after it. When a command
// between the WATCH and MULTI pins a connection (SELECT, WAIT, CLIENT
// TRACKING), MULTI is refused and never sent, so the commands queued
// after it must be refused too: relayed on the pinned connection they
// would run at once, outside any transaction, and EXEC must abort.
func TestFailedMultiQueuesNothingOnPinnedConnection(t *testing.T) {
	for _, tc := range []struct {
		name    string
		pinning string
		db      int
	}{
		{"SELECT", "SELECT 1", 1},
		{"WAIT", "WAIT 0 0", 0},
		{"TRACKING", "CLIENT TRACKING ON", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, other, uc := relayWithNoConnectionLeft(t)
			ctx := context.Background()
			c := dialFrames(t, addr)
			if r := c.do("WATCH debit"); !strings.HasPrefix(r, "-") {
				t.Fatalf("WATCH with no connection left: %s; want an error", r)
			}
			// The connection comes back to the pool (idle, clean).
			if r := other.do("UNWATCH"); r != "+OK" {
				t.Fatalf("UNWATCH: %s", r)
			}
			if r := c.do(tc.pinning); strings.HasPrefix(r, "-") {
				t.Fatalf("%s: %s", tc.pinning, r)
			}
			batch := []string{"MULTI", "INCR debit", "INCR credit", "EXEC"}
			c.send(batch...)
			got := c.readAll(len(batch), 3*time.Second)
			d, _ := uc.Do(ctx, "EVAL", "redis.call('SELECT', ARGV[1]) return redis.call('GET', 'debit')", 0, tc.db).Text()
			cr, _ := uc.Do(ctx, "EVAL", "redis.call('SELECT', ARGV[1]) return redis.call('GET', 'credit')", 0, tc.db).Text()
			if d != "" || cr != "" {
				t.Errorf("commands queued after a failed MULTI ran outside any transaction: debit=%q credit=%q (db %d); replies %q",
					d, cr, tc.db, got)
			}
			wantFailedTransaction(t, batch, got)
		})
	}
}

// TestWaiterSurvivesReadTimeout: a client that sent WAIT 0 0 (as README
// advises) keeps a pinned connection that holds only WAIT's count. A
// command that outlives the relay's read timeout loses that connection;
// the client must get the error and go on, as a client on the shared
// connection does, not be disconnected: no state of its was lost.
func TestWaiterSurvivesReadTimeout(t *testing.T) {
	up := harness.StartRedis(t, harness.RedisOptions{})
	rl := relay.New(relay.Config{Addr: up.Addr, PoolSize: 2, DialTimeout: time.Second, ReadTimeout: 300 * time.Millisecond})
	addr := serveRelay(t, rl, nil)
	for _, tc := range []struct {
		name string
		prep []string
	}{
		{"shared connection", nil},
		{"after WAIT 0 0", []string{"WAIT 0 0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialFrames(t, addr)
			for _, cmd := range tc.prep {
				if r := c.do(cmd); strings.HasPrefix(r, "-") {
					t.Fatalf("%s: %s", cmd, r)
				}
			}
			// A script busy for 0.8 s (DEBUG SLEEP is disabled by default).
			c.sendArgs("EVAL", "local t=redis.call('TIME') local s=t[1]*1000000+t[2] "+
				"repeat local u=redis.call('TIME') until (u[1]*1000000+u[2])-s > 800000 return 1", "0")
			if r, err := c.read(5 * time.Second); err != nil || !strings.HasPrefix(r, "-") {
				t.Errorf("busy EVAL: %q, %v; want an error (read timeout)", r, err)
			}
			time.Sleep(1200 * time.Millisecond) // the upstream is free again
			c.send("GET x")
			if r, err := c.read(3 * time.Second); err != nil || r != "_" {
				t.Errorf("GET after a timed-out command: %q, %v; want _ (the connection still served)", r, err)
			}
			if len(tc.prep) > 0 {
				// Its writes (the EVAL) went with the lost connection: a
				// WAIT on another cannot count them.
				if r := c.do("WAIT 0 0"); !strings.HasPrefix(r, "-ERR 'wait' through lockproxy cannot count") {
					t.Errorf("WAIT after the lost connection: %s; want the refusal", r)
				}
			}
		})
	}
}

// sendArgs writes one command given as its arguments.
func (c *frameConn) sendArgs(args ...string) {
	c.t.Helper()
	var a [][]byte
	for _, x := range args {
		a = append(a, []byte(x))
	}
	if _, err := c.nc.Write(relay.AppendCommand(nil, a)); err != nil {
		c.t.Fatal(err)
	}
}

// TestWaitAfterReadsBeforeCommandTable: with no key prefix reserved,
// nothing read the upstream's COMMAND table before the first command was
// relayed; taken for a write then, a GET got the client's WAIT refused.
func TestWaitAfterReadsBeforeCommandTable(t *testing.T) {
	addr, _ := proxyWithUpstream(t, Options{})
	for _, name := range []string{"first client, on a fresh proxy", "second client"} {
		c := dialFrames(t, addr)
		if r := c.do("GET x"); r != "_" {
			t.Fatalf("%s: GET: %s", name, r)
		}
		if r := c.do("WAIT 0 0"); r != ":0" {
			t.Errorf("%s: WAIT 0 0 after a GET only (no replica): %s; want :0, as Redis answers", name, r)
		}
	}
}

// TestWaitAfterWritesOnOwnConnection: writes that went only over a
// connection of the client's own (a transaction, SELECT n), never over a
// shared one, can be waited for: redis-py's default pipeline() is a
// MULTI/EXEC, and a WAIT after it must count its writes. The connection is
// kept for that until the client's next write, which goes over a shared
// connection: a WAIT after it is refused.
func TestWaitAfterWritesOnOwnConnection(t *testing.T) {
	up := harness.StartRedis(t, harness.RedisOptions{})
	addr := defaultsProxy(t, up, 2)
	refused := "-ERR 'wait' through lockproxy cannot count"
	for _, tc := range []struct {
		name string
		cmds []string
		want []string
	}{
		{"transaction", []string{"MULTI", "SET w:t 1", "EXEC", "WAIT 0 0"}, []string{"+OK", "+QUEUED", "*[+OK]", ":0"}},
		{"watched transaction", []string{"WATCH w:u", "MULTI", "SET w:u 1", "EXEC", "WAIT 0 0"}, []string{"+OK", "+OK", "+QUEUED", "*[+OK]", ":0"}},
		{"database 1", []string{"SELECT 1", "SET w:d 1", "SELECT 0", "WAIT 0 0"}, []string{"+OK", "+OK", "+OK", ":0"}},
		{"reads after the transaction", []string{"MULTI", "SET w:r 1", "EXEC", "GET w:r", "WAIT 0 0"}, []string{"+OK", "+QUEUED", "*[+OK]", "$1", ":0"}},
		{"a script over a shared connection", []string{"EVAL redis.call('SET',KEYS[1],'1') 1 w:e", "WAIT 0 0"}, []string{"_", refused}},
		{"a write after the transaction", []string{"MULTI", "SET w:s 1", "EXEC", "SET w:s 2", "WAIT 0 0"}, []string{"+OK", "+QUEUED", "*[+OK]", "+OK", refused}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialFrames(t, addr)
			for i, cmd := range tc.cmds {
				r := c.do(cmd)
				if tc.want[i] == refused && !strings.HasPrefix(r, refused) || tc.want[i] != refused && r != tc.want[i] {
					t.Errorf("%s: %s; want %s", cmd, r, tc.want[i])
				}
			}
		})
	}
}

// TestKeysInMultiWithPatternOutsidePrefix: inside MULTI, KEYS and SCAN
// are refused when a key prefix is set (always, deployed) because EXEC's
// reply cannot be filtered of lock keys; a pattern that cannot match a key
// under the prefix needs no filtering and runs (redis-py's pipeline() is a
// MULTI/EXEC by default). One that can, or SCAN without MATCH, is still
// refused.
func TestKeysInMultiWithPatternOutsidePrefix(t *testing.T) {
	up := harness.StartRedis(t, harness.RedisOptions{})
	addr := defaultsProxy(t, up, 2)
	for _, tc := range []struct {
		name string
		cmds []string
		want []string
	}{
		{"KEYS", []string{"SET user:1 a", "MULTI", "KEYS user:*", "EXEC"}, []string{"+OK", "+OK", "+QUEUED", "*[*[$user:1]]"}},
		{"SCAN MATCH", []string{"SET user:2 a", "MULTI", "SCAN 0 MATCH user:2", "EXEC"}, []string{"+OK", "+OK", "+QUEUED", "*[*[$0 *[$user:2]]]"}},
		{"KEYS that may reach the prefix", []string{"MULTI", "KEYS *:1", "EXEC"}, []string{"+OK", "-ERR 'keys' is not allowed inside MULTI", "-EXECABORT"}},
		{"SCAN without MATCH", []string{"MULTI", "SCAN 0", "EXEC"}, []string{"+OK", "-ERR 'scan' is not allowed inside MULTI", "-EXECABORT"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialFrames(t, addr)
			for i, cmd := range tc.cmds {
				r := c.do(cmd)
				if strings.HasPrefix(tc.want[i], "-") && !strings.HasPrefix(r, tc.want[i]) || !strings.HasPrefix(tc.want[i], "-") && r != tc.want[i] {
					t.Errorf("%s: %s; want %s", cmd, r, tc.want[i])
				}
			}
		})
	}
}
