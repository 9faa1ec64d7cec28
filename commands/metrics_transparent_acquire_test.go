package commands

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// acquireScriptNX is the acquisition script of test/transparent (a SET NX
// PX answering 1 or 0); acquireScriptNil is bsm/redislock's obtain, which
// answers nil when the key is held; acquireScriptTwo takes two keys or
// none, as node-redlock's acquire script does.
const (
	acquireScriptNX  = `if redis.call("set", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then return 1 end return 0`
	acquireScriptNil = `if redis.call("set", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then return redis.status_reply("OK") end`
	acquireScriptTwo = `for _, k in ipairs(KEYS) do if redis.call("exists", k) == 1 then return 0 end end ` +
		`for _, k in ipairs(KEYS) do redis.call("set", k, ARGV[1], "PX", ARGV[2]) end return #KEYS`
	acquireThenFail = `redis.call("set", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) return redis.error_reply("ERR failed after its write")`
)

// acquireCounts reads lockproxy_lock_acquire_total by result and the
// number of lockproxy_lock_acquire_duration_seconds observations.
func acquireCounts(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	out := map[string]float64{"duration": metricValue(t, reg, "lockproxy_lock_acquire_duration_seconds")}
	for _, r := range []string{"acquired", "not_acquired", "no_quorum", "error"} {
		out[r] = metricValue(t, reg, "lockproxy_lock_acquire_total", "result", r)
	}
	return out
}

// TestTransparentAcquisitionsCounted: every transparent acquisition
// attempt counts in lockproxy_lock_acquire_total{result}, with LOCK's
// meanings, and in lockproxy_lock_acquire_duration_seconds (once per
// attempt): a SET … NX PX|EX granted is acquired, refused (nil) is
// not_acquired, without a majority of the nodes (2 of 3 stopped) is
// no_quorum; an acquiring script counts once per lock key it tried to
// acquire: acquired, its "not acquired" (0 or nil) not_acquired, rolled
// back for an error reply error, for too few nodes no_quorum. A
// compare-and-delete script, a SET XX PX renewal of the key's value and a
// SET NX queued after WATCH of lock keys (refused, so EXEC aborts and
// nothing reaches the nodes) are no attempt. lockproxy_commands_total
// counts each command once, as before. Before, only LOCK and RLOCK were
// counted, so LockproxyNoQuorum never saw a transparent client's
// -NOQUORUM.
func TestTransparentAcquisitionsCounted(t *testing.T) {
	reg, do, nodes := serveTransparentNodes(t)
	type cmds = [][]string
	cases := []struct {
		name string
		// down: run with 2 of the 3 nodes stopped (after the others).
		down bool
		// setup runs before any case, uncounted; run is measured. In
		// both, $k and $k2 stand for the case's keys.
		setup, run cmds
		want       string // the last command's reply (a prefix, for errors and arrays)
		result     string // the acquire result counted, "" for none
		n          float64
		// cmd and cmdResult: lockproxy_commands_total{cmd, result} of run's
		// last command, counted once ("" for none checked).
		cmd, cmdResult string
	}{
		{name: "SET NX PX granted", run: cmds{{"SET", "$k", "t1", "NX", "PX", "20000"}},
			want: "+OK\r\n", result: "acquired", n: 1, cmd: "transparent_set", cmdResult: "ok"},
		{name: "SET NX EX refused", setup: cmds{{"SET", "$k", "other", "NX", "PX", "20000"}}, run: cmds{{"SET", "$k", "t1", "NX", "EX", "20"}},
			want: "$-1\r\n", result: "not_acquired", n: 1, cmd: "transparent_set", cmdResult: "ok"},
		{name: "SET NX PX by LOCK's holder refused", setup: cmds{{"LOCK", "$k", "TOKEN", "t1", "PX", "20000"}}, run: cmds{{"SET", "$k", "t1", "NX", "PX", "20000"}},
			want: "$-1\r\n", result: "not_acquired", n: 1, cmd: "transparent_set", cmdResult: "ok"},
		{name: "script granted", run: cmds{{"EVAL", acquireScriptNX, "1", "$k", "t1", "20000"}},
			want: ":1\r\n", result: "acquired", n: 1, cmd: "transparent_eval", cmdResult: "ok"},
		{name: "script refused with 0", setup: cmds{{"SET", "$k", "other", "NX", "PX", "20000"}}, run: cmds{{"EVAL", acquireScriptNX, "1", "$k", "t1", "20000"}},
			want: ":0\r\n", result: "not_acquired", n: 1, cmd: "transparent_eval", cmdResult: "ok"},
		{name: "script refused with nil", setup: cmds{{"SET", "$k", "other", "NX", "PX", "20000"}}, run: cmds{{"EVAL", acquireScriptNil, "1", "$k", "t1", "20000"}},
			want: "$-1\r\n", result: "not_acquired", n: 1, cmd: "transparent_eval", cmdResult: "ok"},
		{name: "script of two keys granted", run: cmds{{"EVAL", acquireScriptTwo, "2", "$k", "$k2", "t1", "20000"}},
			want: ":2\r\n", result: "acquired", n: 2, cmd: "transparent_eval", cmdResult: "ok"},
		{name: "script of two keys refused", setup: cmds{{"SET", "$k2", "other", "NX", "PX", "20000"}}, run: cmds{{"EVAL", acquireScriptTwo, "2", "$k", "$k2", "t1", "20000"}},
			want: ":0\r\n", result: "not_acquired", n: 2, cmd: "transparent_eval", cmdResult: "ok"},
		{name: "script failing after its write", run: cmds{{"EVAL", acquireThenFail, "1", "$k", "t1", "20000"}},
			want: "-ERR failed after its write", result: "error", n: 1, cmd: "transparent_eval", cmdResult: "error"},
		{name: "SET PX without NX of a new value", run: cmds{{"SET", "$k", "t1", "PX", "20000"}},
			want: "+OK\r\n", result: "acquired", n: 1, cmd: "transparent_set", cmdResult: "ok"},
		{name: "SET XX PX renewal: no attempt", setup: cmds{{"SET", "$k", "t1", "NX", "PX", "20000"}}, run: cmds{{"SET", "$k", "t1", "XX", "PX", "20000"}},
			want: "+OK\r\n", cmd: "transparent_set", cmdResult: "ok"},
		{name: "compare-and-delete: no attempt", setup: cmds{{"SET", "$k", "t1", "NX", "PX", "20000"}}, run: cmds{{"EVAL", compareAndDelete, "1", "$k", "t1"}},
			want: ":1\r\n", cmd: "transparent_eval", cmdResult: "ok"},
		{name: "SET NX in WATCH MULTI EXEC: refused, no attempt",
			run:  cmds{{"WATCH", "$k"}, {"MULTI"}, {"SET", "$k", "t1", "NX", "PX", "20000"}, {"EXEC"}},
			want: "-EXECABORT"},
		{name: "SET NX in MULTI EXEC without WATCH: refused, no attempt",
			run:  cmds{{"MULTI"}, {"SET", "$k", "t1", "NX", "PX", "20000"}, {"EXEC"}},
			want: "-EXECABORT"},
		{name: "LOCK granted", run: cmds{{"LOCK", "$k", "TOKEN", "t1", "PX", "20000"}},
			want: "*", result: "acquired", n: 1, cmd: "lock", cmdResult: "ok"},
		{name: "SET NX PX without quorum", down: true, run: cmds{{"SET", "$k", "t1", "NX", "PX", "20000"}},
			want: "-NOQUORUM", result: "no_quorum", n: 1, cmd: "transparent_set", cmdResult: "error"},
		{name: "SET NX EX without quorum", down: true, run: cmds{{"SET", "$k", "t1", "NX", "EX", "20"}},
			want: "-NOQUORUM", result: "no_quorum", n: 1, cmd: "transparent_set", cmdResult: "error"},
		{name: "script without quorum", down: true, run: cmds{{"EVAL", acquireScriptNX, "1", "$k", "t1", "20000"}},
			want: "-NOQUORUM", result: "no_quorum", n: 1, cmd: "transparent_eval", cmdResult: "error"},
		{name: "script refused without quorum", down: true, setup: cmds{{"SET", "$k", "other", "NX", "PX", "20000"}},
			run:  cmds{{"EVAL", acquireScriptNil, "1", "$k", "t1", "20000"}},
			want: "-NOQUORUM", result: "no_quorum", n: 1, cmd: "transparent_eval", cmdResult: "error"},
		{name: "LOCK without quorum", down: true, run: cmds{{"LOCK", "$k", "TOKEN", "t1", "PX", "20000"}},
			want: "-NOQUORUM", result: "no_quorum", n: 1, cmd: "lock", cmdResult: "error"},
	}
	subst := func(i int, c []string) []string {
		out := make([]string, len(c))
		for j, a := range c {
			a = strings.ReplaceAll(a, "$k2", "lock:acq-"+strconv.Itoa(i)+"-b")
			out[j] = strings.ReplaceAll(a, "$k", "lock:acq-"+strconv.Itoa(i))
		}
		return out
	}
	for i, tc := range cases {
		for _, c := range tc.setup {
			if r := do(subst(i, c)...); r[0] == '-' || r == "$-1\r\n" {
				t.Fatalf("%s: setup %v = %q", tc.name, c, r)
			}
		}
	}
	for _, down := range []bool{false, true} {
		if down {
			nodes[1].Stop()
			nodes[2].Stop()
		}
		for i, tc := range cases {
			if tc.down != down {
				continue
			}
			t.Run(tc.name, func(t *testing.T) {
				before := acquireCounts(t, reg)
				var cmd0 float64
				if tc.cmd != "" {
					cmd0 = commandsTotal(t, reg, tc.cmd, tc.cmdResult)
				}
				var r string
				for _, c := range tc.run {
					r = do(subst(i, c)...)
				}
				if !strings.HasPrefix(r, tc.want) {
					t.Fatalf("reply = %q; want %q", r, tc.want)
				}
				after := acquireCounts(t, reg)
				for _, res := range []string{"acquired", "not_acquired", "no_quorum", "error"} {
					want := 0.0
					if res == tc.result {
						want = tc.n
					}
					if got := after[res] - before[res]; got != want {
						t.Errorf("lockproxy_lock_acquire_total{result=%q} rose by %v; want %v", res, got, want)
					}
				}
				want := 0.0
				if tc.result != "" {
					want = tc.n
				}
				if got := after["duration"] - before["duration"]; got != want {
					t.Errorf("lockproxy_lock_acquire_duration_seconds observed %v times; want %v", got, want)
				}
				if tc.cmd != "" {
					if got := commandsTotal(t, reg, tc.cmd, tc.cmdResult) - cmd0; got != 1 {
						t.Errorf("lockproxy_commands_total{cmd=%q,result=%q} rose by %v; want 1", tc.cmd, tc.cmdResult, got)
					}
				}
			})
		}
	}
}

// TestScriptAttempts: how a script's decision (decideScript over its
// nodes' replies) counts in lockproxy_lock_acquire_total, for the outcomes
// real nodes do not produce on demand: a fence that reached no majority,
// a write that outlives locks.max_ttl, nodes that disagree, a script that
// returns a time left, and runs that wrote nothing and are no attempt.
func TestScriptAttempts(t *testing.T) {
	m := newMetrics(prometheus.NewRegistry())
	noDrift := func(time.Duration) time.Duration { return 2 * time.Millisecond }
	down := backends.NodeReply{Node: "n3", Err: errDown}
	wrote := func(v any) backends.NodeReply { return scriptReply(v, true, "t", 1000) }
	held := func(v any) backends.NodeReply { return scriptReply(v, false, "other", 1000) }
	for _, c := range []struct {
		name                string
		rs                  []backends.NodeReply
		fenceErr            error
		refusable, ttlReply bool
		want                prometheus.Counter
		n                   int
	}{
		{"acquired", []backends.NodeReply{wrote("OK"), wrote("OK"), held(nil)}, nil, true, false, m.acquired, 1},
		{"acquired, fence without quorum", []backends.NodeReply{wrote("OK"), wrote("OK"), held(nil)}, &quorum.NoQuorumError{OK: 1, Total: 3}, true, false, m.noQuorum, 1},
		{"acquired, fence failed otherwise", []backends.NodeReply{wrote("OK"), wrote("OK"), held(nil)}, errors.New("fence: bad reply"), true, false, m.acquireErr, 1},
		{"minority rolled back", []backends.NodeReply{wrote("OK"), held(nil), held(nil)}, nil, true, false, m.notAcquired, 1},
		{"written without expiry", []backends.NodeReply{scriptReply("OK", true, "t", -1), scriptReply("OK", true, "t", -1), held(nil)}, nil, true, false, m.acquireErr, 1},
		{"holders disagree", []backends.NodeReply{wrote(int64(1)), scriptReply(int64(0), false, "t", 1000), held(nil)}, nil, true, false, m.acquireErr, 1},
		{"majority down after a write", []backends.NodeReply{wrote("OK"), down, down}, nil, true, false, m.noQuorum, 1},
		{"SET without NX rolled back", []backends.NodeReply{wrote("OK"), held(nil), held(nil)}, nil, false, false, m.notAcquired, 1},
		{"no write: nil", []backends.NodeReply{held(nil), held(nil), held(nil)}, nil, true, false, m.notAcquired, 1},
		{"no write: 0", []backends.NodeReply{held(int64(0)), held(int64(0)), down}, nil, true, false, m.notAcquired, 1},
		{"no write: time left", []backends.NodeReply{held(int64(900)), held(int64(899)), held(int64(901))}, nil, true, true, m.notAcquired, 1},
		{"no write: majority down", []backends.NodeReply{held(nil), down, down}, nil, true, false, m.noQuorum, 1},
		{"no write: nodes disagree", []backends.NodeReply{held(nil), held(int64(0)), held(int64(1))}, nil, true, false, m.acquireErr, 1},
		{"no write: error reply", []backends.NodeReply{held(backends.ReplyError("ERR x")), held(backends.ReplyError("ERR x")), held(nil)}, nil, true, false, m.acquireErr, 1},
		{"no write: OK, a renewal", []backends.NodeReply{held("OK"), held("OK"), held("OK")}, nil, true, false, nil, 0},
		{"no write: 1", []backends.NodeReply{held(int64(1)), held(int64(1)), held(int64(1))}, nil, true, false, nil, 0},
		{"no write, not refusable: nil", []backends.NodeReply{held(nil), held(nil), held(nil)}, nil, false, false, nil, 0},
		{"no write, not refusable: majority down", []backends.NodeReply{held(nil), down, down}, nil, false, false, nil, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := decideScript(c.rs, 3, time.Millisecond, noDrift, time.Minute, c.ttlReply)
			got, n := m.scriptAttempts(d, c.fenceErr, 1, c.refusable, c.ttlReply)
			if got != c.want || n != c.n {
				t.Fatalf("scriptAttempts = %s × %d; want %s × %d", counterName(m, got), n, counterName(m, c.want), c.n)
			}
		})
	}
}

// counterName names one of m's acquire counters.
func counterName(m *metrics, c prometheus.Counter) string {
	switch c {
	case nil:
		return "none"
	case m.acquired:
		return "acquired"
	case m.notAcquired:
		return "not_acquired"
	case m.noQuorum:
		return "no_quorum"
	case m.acquireErr:
		return "error"
	}
	return "another counter"
}
