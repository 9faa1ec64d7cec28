package commands

import (
	"strings"
	"testing"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/resp"
)

// TestScriptReturningPTTLAgreedLikePTTL: a lock script that returns its
// key's PTTL (bsm/redislock's Lock.TTL) gets a slightly different number
// from each node; under the plain majority rule it always failed with "no
// majority". It gets PTTL's rule: the time the key stays on a majority.
// Scripts that only call PTTL or TTL on the way to a status code keep
// the plain rule: python-redis-lock's extend answers 0 for done and 1 for
// not held, and a 0 from one node with a 1 from another is no majority.
func TestScriptReturningPTTLAgreedLikePTTL(t *testing.T) {
	const bsmPTTL = `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("pttl", KEYS[1]) else return -3 end`
	const prlExtend = `if redis.call("get", KEYS[1]) ~= ARGV[1] then return 1 elseif redis.call("ttl", KEYS[1]) < 0 then return 2 else redis.call("expire", KEYS[1], ARGV[2]) return 0 end`
	for _, c := range []struct {
		name, body string
		replies    []backends.NodeReply
		want       string // prefix of the reply
	}{
		{"bsm TTL, nodes ms apart", bsmPTTL, replies(int64(4990), int64(4980), int64(5000)), ":4990\r\n"},
		{"bsm TTL, one node not holding", bsmPTTL, replies(int64(4990), int64(-3), int64(5000)), ":4990\r\n"},
		{"bsm TTL, held on one node only", bsmPTTL, replies(int64(4990), int64(-3), int64(-3)), ":-3\r\n"},
		{"bsm TTL, a majority down", bsmPTTL, replies(int64(4990), errDown, errDown), "-NOQUORUM"},
		{"python-redis-lock extend, split", prlExtend, replies(int64(0), int64(1), errDown), "-ERR no majority"},
		{"python-redis-lock extend, done", prlExtend, replies(int64(0), int64(0), int64(1)), ":0\r\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			fan := &fanoutBackend{replies: c.replies}
			h := NewHandler(Options{Limits: testLimits, Backend: fan, LockPatterns: []string{"lock:*"}})
			defer h.Close()
			s := &resp.Session{W: resp.NewWriter()}
			h.ServeRESP(s, [][]byte{[]byte("EVAL"), []byte(c.body), []byte("1"), []byte("lock:a"), []byte("tok")})
			if got := string(s.W.Bytes()); !strings.HasPrefix(got, c.want) {
				t.Errorf("EVAL = %q; want %q…", got, c.want)
			}
		})
	}
}

// TestScriptMayAcquireNotFooledByHiddenCalls: a script classified as one
// that cannot acquire runs as a plain EVAL per node under the majority
// rule, without the acquisition rule: a grant it makes on a minority is
// not rolled back, one on a majority gets no validity check and no fence.
// The classification read the first string after each call as the
// command, and counted calls by the word "call": a command built from
// pieces ('get' .. 'set' is GETSET) or redis reached by an index
// (redis['c' .. 'all']) passed as a plain read.
func TestScriptMayAcquireNotFooledByHiddenCalls(t *testing.T) {
	for _, c := range []struct {
		name, body string
		want       bool
	}{
		{"command name built from pieces", `return redis.call('get' .. 'set', KEYS[1], ARGV[1])`, true},
		{"call reached by an index", `local f = redis['c' .. 'all'] return f('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])`, true},
		{"redis in a variable", `local r = redis return r['pc' .. 'all']('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])`, true},
		{"through _G", `return _G['re' .. 'dis']['c' .. 'all']('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])`, true},
		// The lock libraries' own non-acquiring scripts stay plain EVALs.
		{"seed compare-and-delete", `if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end`, false},
		{"redsync delete", "local val = redis.call(\"GET\", KEYS[1])\nif val == ARGV[1] then\n\treturn redis.call(\"DEL\", KEYS[1])\nelseif val == false then\n\treturn -1\nelse\n\treturn 0\nend", false},
		{"bsm pttl", `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("pttl", KEYS[1]) else return -3 end`, false},
		{"status reply and sha1hex", `if redis.call('get', KEYS[1]) == redis.sha1hex(ARGV[1]) then return redis.status_reply('OK') end return redis.error_reply('no')`, false},
	} {
		if got := scriptMayAcquire(c.body); got != c.want {
			t.Errorf("%s: scriptMayAcquire = %v; want %v", c.name, got, c.want)
		}
	}
}
