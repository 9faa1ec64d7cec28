package commands

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/conf"
	"github.com/lockproxy/lockproxy/relay"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestOneReplyCommandsRefused: a shared upstream connection carries many
// clients' commands, each answered by one reply, in order, with no state
// of one client's left for the next. REPLCONF (Redis never answers
// REPLCONF ACK from a connection that is no replica's), SYNC and PSYNC
// (which make the connection a replication stream) and SCRIPT DEBUG
// (which makes the next EVAL on the connection, any client's, open a Lua
// debugger that answers the others' commands as debugger commands) break
// that: they are refused, whatever upstream.deny_commands says, and the
// other clients get their own replies.
func TestOneReplyCommandsRefused(t *testing.T) {
	up := harness.StartRedis(t, harness.RedisOptions{})
	// An empty deny list: the refusal does not depend on it.
	rl := relay.New(relay.Config{Addr: up.Addr, PoolSize: 1, DialTimeout: time.Second,
		ReadTimeout: 10 * time.Second, Deny: []string{}, KeyPrefix: "lockproxy:"})
	addr := serveRelay(t, rl, nil)
	other := dialFrames(t, addr)
	if r := other.do("SET x val"); r != "+OK" {
		t.Fatalf("SET: %s", r)
	}
	for _, cmd := range []string{"REPLCONF ACK 0", "REPLCONF GETACK *", "SYNC", "PSYNC ? -1",
		"SCRIPT DEBUG SYNC", "SCRIPT DEBUG YES", "script debug no"} {
		t.Run(cmd, func(t *testing.T) {
			c := dialFrames(t, addr)
			c.send(cmd)
			// Another client's commands queue behind it on the shared
			// connection meanwhile.
			other.send("EVAL return'b' 0", "GET x")
			r, err := c.read(2 * time.Second)
			if err != nil || !strings.HasPrefix(r, "-ERR") || !strings.Contains(r, "lockproxy") {
				t.Errorf("%s: %q, %v; want lockproxy's refusal", cmd, r, err)
			}
			got := other.readAll(2, 2*time.Second)
			if got[0] != "$b" || len(got) < 2 || got[1] != "$val" {
				t.Errorf("the other client's EVAL and GET after %s: %q; want [$b $val]", cmd, got)
			}
			if r := c.do("PING"); r != "+PONG" {
				t.Errorf("PING after %s: %s", cmd, r)
			}
		})
	}
}

// TestWaitCountsOnlyTheClientsWrites: WAIT numreplicas timeout answers how
// many replicas have the client's own writes. Through lockproxy a write
// that went over a shared upstream connection is not seen by a WAIT on
// another connection, which would answer at once with every replica
// though none has it (here the replica is stopped): such a WAIT is
// refused. A client that sent WAIT keeps its upstream connection, so the
// writes after it are counted honestly, as directly on Redis.
func TestWaitCountsOnlyTheClientsWrites(t *testing.T) {
	// No delay before the replica's first sync.
	primary := harness.StartRedis(t, harness.RedisOptions{Args: []string{"--repl-diskless-sync-delay", "0"}})
	replica := harness.StartRedis(t, harness.RedisOptions{Args: []string{"--replicaof", "127.0.0.1", strconv.Itoa(primary.Port)}})
	pc := primary.Client(t)
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, _ := pc.Info(ctx, "replication").Result()
		if strings.Contains(info, "slave0:") && strings.Contains(info, "state=online") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica not online: %s", info)
		}
		time.Sleep(20 * time.Millisecond)
	}
	addr := defaultsProxy(t, primary, 2)
	// A client that read only: its WAIT is honest at once (no write to
	// wait for), as on Redis.
	if r := dialFrames(t, addr).do("WAIT 1 100"); r != ":1" {
		t.Errorf("WAIT with no write before, replica up: %s; want :1", r)
	}
	reader := dialFrames(t, addr)
	reader.do("GET w:r")
	if r := reader.do("WAIT 1 100"); r != ":1" {
		t.Errorf("WAIT after a GET only: %s; want :1", r)
	}

	replica.Pause()
	defer replica.Resume()
	for _, tc := range []struct {
		name, addr string
		cmds       []string
		// The replies; "-" any error, ":" any integer (WAIT 0 0 on a
		// connection that wrote nothing counts replicas that have what
		// the upstream connection carried before, for a client before).
		want []string
	}{
		{"direct", primary.Addr, []string{"SET w:d 1", "WAIT 1 200"}, []string{"+OK", ":0"}},
		{"write on a shared connection", addr, []string{"SET w:s 1", "WAIT 1 200", "WAIT 0 0"}, []string{"+OK", "-", "-"}},
		{"WAITAOF after a shared write", addr, []string{"SET w:a 1", "WAITAOF 0 1 200"}, []string{"+OK", "-"}},
		{"WAIT first, then writes", addr, []string{"WAIT 0 0", "SET w:f 1", "WAIT 1 200", "SET w:g 1", "WAIT 1 200"},
			[]string{":", "+OK", ":0", "+OK", ":0"}},
		{"WAIT inside MULTI after a shared write", addr, []string{"SET w:m 1", "MULTI", "WAIT 1 0", "EXEC"},
			[]string{"+OK", "+OK", "-", "-EXECABORT"}},
		{"writes in a transaction, then WAIT", addr, []string{"WAIT 0 0", "MULTI", "SET w:t 1", "EXEC", "WAIT 1 200"},
			[]string{":", "+OK", "+QUEUED", "*[+OK]", ":0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialFrames(t, tc.addr)
			for i, cmd := range tc.cmds {
				r := c.do(cmd)
				want := tc.want[i]
				ok := r == want || want == "-" && strings.HasPrefix(r, "-ERR") || want == ":" && strings.HasPrefix(r, ":") ||
					strings.HasPrefix(r, want+" ")
				if !ok {
					t.Errorf("%s: %s; want %s", cmd, r, want)
				}
			}
		})
	}
}

// TestKeylessCommandsCannotReachLockKeys: commands that name no lock key
// in a key position may still read or move the lock keys
// (redlock.key_prefix) of an upstream that is also a lock node, which
// keyspace isolation promises relayed commands never touch: SORT's BY and
// GET patterns (a token read lets another client UNLOCK), KEYS inside
// MULTI (EXEC's reply cannot be filtered), SWAPDB.
func TestKeylessCommandsCannotReachLockKeys(t *testing.T) {
	up := harness.StartRedis(t, harness.RedisOptions{})
	uc := up.Client(t)
	ctx := context.Background()
	addr := defaultsProxy(t, up, 1)
	c := dialFrames(t, addr)
	if r := c.do("RPUSH ids k"); r != ":1" {
		t.Fatalf("RPUSH: %s", r)
	}
	for _, tc := range []struct {
		name, cmd string
		allowed   bool // relayed: patterns that reach no lock key
	}{
		{name: "SORT GET pattern under the prefix", cmd: "SORT ids BY nosort GET lockproxy:*"},
		{name: "SORT GET * on a list of lock key names", cmd: "RPUSH names lockproxy:k|SORT names BY nosort GET *"},
		{name: "SORT BY pattern", cmd: "SORT ids BY lock*"},
		{name: "SORT_RO GET a hash field", cmd: "SORT_RO ids BY nosort GET lockproxy:*->f"},
		{name: "SORT GET after LIMIT", cmd: "SORT ids LIMIT 0 1 GET # GET lockp*"},
		{name: "KEYS inside MULTI", cmd: "MULTI|KEYS lockproxy:*|EXEC"},
		{name: "SCAN inside MULTI", cmd: "MULTI|SCAN 0|EXEC"},
		{name: "SWAPDB", cmd: "SWAPDB 0 1"},
		{name: "SORT with other patterns", cmd: "SORT ids BY weight_* GET # GET obj_*->f ALPHA", allowed: true},
		{name: "SORT BY nosort", cmd: "SORT ids BY nosort GET #", allowed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A lock held on the upstream as a lock node holds it.
			if err := uc.Set(ctx, "lockproxy:k", "tok-secret", time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			var r string
			for _, cmd := range strings.Split(tc.cmd, "|") {
				r = c.do(cmd)
			}
			t.Logf("%s → %s", tc.cmd, r)
			if strings.Contains(r, "tok-secret") || strings.Contains(r, "lockproxy:k") {
				t.Errorf("%s: the reply shows the lock: %s", tc.cmd, r)
			}
			if n, _ := uc.Exists(ctx, "lockproxy:k").Result(); n == 0 {
				t.Errorf("%s: lockproxy:k is gone from database 0", tc.cmd)
			}
			if refused := strings.HasPrefix(r, "-"); refused == tc.allowed {
				t.Errorf("%s: %s; want it %s", tc.cmd, r, map[bool]string{true: "relayed", false: "refused"}[tc.allowed])
			}
			c.do("DISCARD") // a transaction left by a refusal
		})
	}
}

// TestLockPatternKeysNeverRelayed: no command that names a key of
// transparent mode's lock_patterns ("lock:*") reaches the upstream,
// whatever the key's position, outside or inside MULTI, SORT's patterns
// included. The upstream's MONITOR shows what arrives.
func TestLockPatternKeysNeverRelayed(t *testing.T) {
	up := harness.StartRedis(t, harness.RedisOptions{})
	rl := relay.New(relay.Config{Addr: up.Addr, PoolSize: 1, DialTimeout: time.Second,
		ReadTimeout: 10 * time.Second, Deny: conf.DefaultDenyCommands, KeyPrefix: "lockproxy:"})
	addr := serveRelay(t, rl, []string{"lock:*"})
	mon := dialFrames(t, up.Addr)
	if r := mon.do("MONITOR"); r != "+OK" {
		t.Fatal(r)
	}
	cmds := []string{
		"SORT x BY nosort GET lock:*", "SORT x BY lo*", "SORT_RO x GET *->f", "SORT x STORE lock:a",
		"OBJECT ENCODING lock:a", "COPY x lock:a", "MSET x 1 lock:a 2", "FCALL f 1 lock:a",
	}
	for _, multi := range []bool{false, true} {
		c := dialFrames(t, addr)
		if multi {
			c.do("MULTI")
		}
		for _, cmd := range cmds {
			c.send(cmd, "PING")
			c.readAll(2, 3*time.Second)
		}
		if multi {
			c.do("DISCARD")
		}
	}
	// A marker, then everything MONITOR saw up to it.
	dialFrames(t, up.Addr).do("ECHO end-of-test")
	for {
		line, err := mon.read(3 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, "end-of-test") {
			break
		}
		if strings.Contains(line, "lock:") || strings.Contains(line, "\"lo*\"") || strings.Contains(line, "\"*->f\"") {
			t.Errorf("relayed to the upstream: %s", line)
		}
	}
}

// TestReplicationStreamIsNoReply: what SYNC would have the upstream send
// (bare newlines as keepalives while it makes the RDB) is no RESP reply:
// the relay's framer reports a broken stream, so that the connection is
// dropped, instead of crashing on an empty line or waiting for ever for
// a line end that came without its CR.
func TestReplicationStreamIsNoReply(t *testing.T) {
	for _, b := range []string{"\r\n", "\n", "\n+OK\r\n", "+OK\n", "*1\r\n\r\n"} {
		if n, err := relay.FrameEnd([]byte(b)); err == nil {
			t.Errorf("FrameEnd(%q) = %d, nil; want an error", b, n)
		}
	}
	if n, err := relay.FrameEnd([]byte("+OK\r\n\n")); n != 5 || err != nil {
		t.Errorf("FrameEnd of a reply followed by a newline = %d, %v; want 5, nil", n, err)
	}
}
