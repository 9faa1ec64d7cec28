package commands

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/resp"
)

func TestGlobMatch(t *testing.T) {
	for _, c := range []struct {
		pattern, key string
		want         bool
	}{
		{"lock:*", "lock:a", true},
		{"lock:*", "lock:a/b/c", true}, // '*' crosses '/', as in Redis
		{"lock:*", "lock:", true},
		{"lock:*", "xlock:a", false},
		{"*:lock:*", "svc:lock:42", true},
		{"*:lock:*", "svc:lok:42", false},
		{"l?ck", "lock", true},
		{"l?ck", "lck", false},
		{"[ab]:*", "a:1", true},
		{"[ab]:*", "c:1", false},
		{"[^ab]:*", "c:1", true},
		{"[a-c]x", "bx", true},
		{"[a-c]x", "dx", false},
		{`a\*b`, "a*b", true},
		{`a\*b`, "axb", false},
		{"*", "", true},
		{"a*b*c", "aXXbYYc", true},
		{"a*b*c", "aXXbYY", false},
	} {
		if got := globMatch(c.pattern, []byte(c.key)); got != c.want {
			t.Errorf("globMatch(%q, %q) = %v; want %v", c.pattern, c.key, got, c.want)
		}
	}
}

func replies(vals ...any) []backends.NodeReply {
	out := make([]backends.NodeReply, len(vals))
	for i, v := range vals {
		if err, ok := v.(error); ok {
			if _, reply := v.(backends.ReplyError); !reply {
				out[i] = backends.NodeReply{Node: "n", Err: err}
				continue
			}
		}
		out[i] = backends.NodeReply{Val: v}
	}
	return out
}

var errDown = errors.New("connection refused")

func TestAgree(t *testing.T) {
	for _, c := range []struct {
		name    string
		rs      []backends.NodeReply
		ttl     bool
		want    any
		wantErr string // "noquorum", "nomajority" or ""
	}{
		{"all agree", replies("tok", "tok", "tok"), false, "tok", ""},
		{"majority", replies("tok", "tok", nil), false, "tok", ""},
		{"nil majority", replies(nil, nil, "tok"), false, nil, ""},
		{"one down", replies(int64(1), errDown, int64(1)), false, int64(1), ""},
		{"split", replies(int64(1), int64(0), errDown), false, nil, "nomajority"},
		{"three ways", replies("a", "b", "c"), false, nil, "nomajority"},
		{"majority down", replies("tok", errDown, errDown), false, nil, "noquorum"},
		{"error replies agree", replies(backends.ReplyError("WRONGTYPE x"), backends.ReplyError("WRONGTYPE x"), "v"), false, backends.ReplyError("WRONGTYPE x"), ""},
		{"arrays", replies([]any{int64(1), nil}, []any{int64(1), nil}, []any{int64(1)}), false, []any{int64(1), nil}, ""},
		{"ttl smallest of majority", replies(int64(5000), int64(4990), int64(10)), true, int64(4990), ""},
		{"ttl two of three", replies(int64(5000), int64(-2), int64(4000)), true, int64(4000), ""},
		{"ttl gone on majority", replies(int64(-2), int64(-2), int64(4000)), true, int64(-2), ""},
		{"ttl split", replies(int64(-2), int64(-1), int64(4000)), true, nil, "nomajority"},
		{"ttl majority down", replies(int64(100), errDown, errDown), true, nil, "noquorum"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got any
			var err error
			if c.ttl {
				got, err = agreeTTL(c.rs, 3)
			} else {
				got, err = agree(c.rs, 3)
			}
			var nm *noMajorityError
			var nq *quorum.NoQuorumError
			switch c.wantErr {
			case "nomajority":
				if !errors.As(err, &nm) {
					t.Fatalf("agree = %v, %v; want no majority", got, err)
				}
			case "noquorum":
				if !errors.As(err, &nq) {
					t.Fatalf("agree = %v, %v; want NOQUORUM", got, err)
				}
			default:
				if err != nil || string(valueKey(nil, got)) != string(valueKey(nil, c.want)) {
					t.Fatalf("agree = %v, %v; want %v", got, err, c.want)
				}
			}
		})
	}
}

// scriptReply is one node's answer to a script that may have written the
// single key.
func scriptReply(val any, wrote bool, value string, pttl int64) backends.NodeReply {
	return backends.NodeReply{Val: val, Writes: []backends.KeyWrite{{Wrote: wrote, Exists: value != "", Value: value, PTTL: pttl}}}
}

func TestDecideScript(t *testing.T) {
	noDrift := func(time.Duration) time.Duration { return 2 * time.Millisecond }
	down := backends.NodeReply{Node: "n3", Err: errDown}
	for _, c := range []struct {
		name      string
		rs        []backends.NodeReply
		elapsed   time.Duration
		want      any
		wantErr   bool
		wantUndos int
	}{
		{"no write: plain majority", []backends.NodeReply{scriptReply(int64(1), false, "", -2), scriptReply(int64(1), false, "", -2), scriptReply(int64(0), false, "x", 100)}, 0, int64(1), false, 0},
		{"acquired everywhere", []backends.NodeReply{scriptReply("OK", true, "t", 1000), scriptReply("OK", true, "t", 1000), scriptReply("OK", true, "t", 999)}, time.Millisecond, "OK", false, 0},
		{"acquired on a majority", []backends.NodeReply{scriptReply("OK", true, "t", 1000), scriptReply(nil, false, "other", 500), scriptReply("OK", true, "t", 1000)}, time.Millisecond, "OK", false, 0},
		{"minority rolled back", []backends.NodeReply{scriptReply("OK", true, "t", 1000), scriptReply(nil, false, "other", 500), scriptReply(nil, false, "other", 500)}, time.Millisecond, nil, false, 1},
		{"validity ran out", []backends.NodeReply{scriptReply("OK", true, "t", 30), scriptReply("OK", true, "t", 30), scriptReply(nil, false, "other", 500)}, 40 * time.Millisecond, nil, false, 2},
		{"validity ran out everywhere", []backends.NodeReply{scriptReply("OK", true, "t", 30), scriptReply("OK", true, "t", 30), scriptReply("OK", true, "t", 30)}, 40 * time.Millisecond, nil, true, 3},
		{"majority down", []backends.NodeReply{scriptReply("OK", true, "t", 1000), down, down}, 0, nil, true, 3},
		{"one down, one acquired", []backends.NodeReply{scriptReply(int64(1), true, "t", 1000), down, scriptReply(int64(0), false, "o", 1000)}, 0, int64(0), false, 2},
		{"one down, two acquired", []backends.NodeReply{scriptReply(int64(1), true, "t", 1000), down, scriptReply(int64(1), true, "t", 1000)}, 0, int64(1), false, 0},
		{"holders disagree", []backends.NodeReply{scriptReply(int64(1), true, "t", 1000), scriptReply(int64(0), false, "t", 1000), scriptReply(nil, false, "o", 1000)}, 0, nil, true, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := decideScript(c.rs, 3, c.elapsed, noDrift, 0, false)
			if (d.err != nil) != c.wantErr || string(valueKey(nil, d.reply)) != string(valueKey(nil, c.want)) || len(d.undo) != c.wantUndos {
				t.Fatalf("decideScript = %v, %v, %d undos; want %v, error %v, %d undos", d.reply, d.err, len(d.undo), c.want, c.wantErr, c.wantUndos)
			}
		})
	}
}

// fanoutBackend is a fakeBackend whose nodes answer Run with replies and
// record what they were sent.
type fanoutBackend struct {
	fakeBackend
	replies  []backends.NodeReply
	args     []string
	keys     []int
	fenceErr error          // Fence's answer
	undone   map[int]string // node: the values Undo was sent there
	mu       sync.Mutex
}

func (b *fanoutBackend) NodeCount() int { return len(b.replies) }
func (b *fanoutBackend) Run(_ context.Context, args []string, keys []int, _ bool) []backends.NodeReply {
	b.args, b.keys = args, keys
	return b.replies
}
func (b *fanoutBackend) RunEach(ctx context.Context, name string, keys []string, readOnly bool) []backends.NodeReply {
	out := make([]backends.NodeReply, len(b.replies))
	for _, k := range keys {
		for i, r := range b.Run(ctx, []string{name, k}, []int{1}, readOnly) {
			if out[i].Err != nil {
				continue
			}
			if out[i].Err = r.Err; r.Err == nil {
				vs, _ := out[i].Val.([]any)
				out[i].Val = append(vs, r.Val)
			}
		}
	}
	return out
}
func (b *fanoutBackend) RunScript(_ context.Context, body string, keys, argv []string) []backends.NodeReply {
	return b.replies
}
func (b *fanoutBackend) Undo(_ context.Context, node int, _, values []string, _ bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.undone == nil {
		b.undone = map[int]string{}
	}
	b.undone[node] = strings.Join(values, ",")
	return nil
}
func (b *fanoutBackend) Fence(context.Context, []int, string, string) (uint64, error) {
	if b.fenceErr != nil {
		return 0, b.fenceErr
	}
	return 1, nil
}
func (b *fanoutBackend) Drift(time.Duration) time.Duration { return 0 }

// TestScriptAcquisitionRolledBackWhenFenceFails: a script acquisition
// that stood on the nodes but whose fence reached no majority is rolled
// back on its holders and answered with the failure, as a LOCK whose fence
// cannot be settled is: its fence would not be above the next grant's.
// Before, the failure was logged and the client told it acquired.
//
// The -NOQUORUM k/n counts the nodes that answered (also one that refused
// the script's write) less the holders whose fence failed, and names
// those and the nodes the script failed on, as PROTOCOL.md has it. Fence
// counts and names only the holders: before, a refusing node was in
// neither ("1/3 nodes: n2 …" with n1 at the fence and n3's refusal heard)
// and a node the script failed on was not named.
func TestScriptAcquisitionRolledBackWhenFenceFails(t *testing.T) {
	held := func(node string) backends.NodeReply {
		r := scriptReply(int64(1), true, "tok", 1000)
		r.Node = node
		return r
	}
	refused := scriptReply(int64(0), false, "other", 1000)
	refused.Node = "n3"
	down := backends.NodeReply{Node: "n3", Err: errDown}
	lost := quorum.NodeError{Node: "n2", Err: errors.New("hold lost")}
	for _, tc := range []struct {
		name    string
		replies []backends.NodeReply
		holders []int
		// fenceErr is Fence's: over the holders only.
		fenceErr error
		want     string
	}{
		{"three holders, two not raised", []backends.NodeReply{held("n1"), held("n2"), held("n3")}, []int{0, 1, 2},
			&quorum.NoQuorumError{OK: 1, Total: 3, Failures: []quorum.NodeError{{Node: "n1", Err: errDown}, {Node: "n2", Err: errDown}}},
			"-NOQUORUM 1/3 nodes: n1 connection refused, n2 connection refused\r\n"},
		{"two holders, one not raised, one refusal", []backends.NodeReply{held("n1"), held("n2"), refused}, []int{0, 1},
			&quorum.NoQuorumError{OK: 1, Total: 3, Failures: []quorum.NodeError{lost}},
			"-NOQUORUM 2/3 nodes: n2 error: hold lost\r\n"},
		{"two holders, one not raised, the script failed on one", []backends.NodeReply{held("n1"), held("n2"), down}, []int{0, 1},
			&quorum.NoQuorumError{OK: 1, Total: 3, Failures: []quorum.NodeError{lost}},
			"-NOQUORUM 1/3 nodes: n2 error: hold lost, n3 connection refused\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fan := &fanoutBackend{replies: tc.replies, fenceErr: tc.fenceErr}
			h := NewHandler(Options{Limits: testLimits, Backend: fan, LockPatterns: []string{"lock:*"}})
			conn := dialTest(t, serveOn(t, &resp.Server{Handler: h}))
			body := `return redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', 1000) and 1 or 0`
			fmt.Fprintf(conn, "*5\r\n$4\r\nEVAL\r\n$%d\r\n%s\r\n$1\r\n1\r\n$6\r\nlock:a\r\n$3\r\ntok\r\n", len(body), body)
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			got, err := bufio.NewReader(conn).ReadString('\n')
			if err != nil || got != tc.want {
				t.Errorf("EVAL whose acquisition's fence reached too few holders = %q, %v; want %q", got, err, tc.want)
			}
			fan.mu.Lock()
			defer fan.mu.Unlock()
			for _, n := range tc.holders {
				if fan.undone[n] != "tok" {
					t.Errorf("undo on node %d: %q; want the acquisition's value rolled back (all undos: %v)", n, fan.undone[n], fan.undone)
				}
			}
		})
	}
}

// TestTransparentDispatch: which commands transparent mode takes, what
// it sends to the nodes, and what a backend without nodes answers.
func TestTransparentDispatch(t *testing.T) {
	fan := &fanoutBackend{replies: replies("tok", "tok", nil)}
	for _, tc := range []struct {
		name    string
		backend backends.Backend
		cmd     string
		want    string // prefix of the reply
	}{
		{"SET NX PX is a LOCK", &fakeBackend{}, "SET lock:a tok NX PX 1000", "+OK\r\n"},
		{"no fan-out: GET refused", &fakeBackend{}, "GET lock:a", "-ERR transparent mode: this lock backend serves only SET"},
		{"not a lock key", &fakeBackend{}, "GET other", "-ERR unknown command 'GET'"},
		{"unsupported on a lock key", &fakeBackend{}, "INCR lock:a", "-ERR transparent mode: 'incr' is not supported"},
		{"GET majority", fan, "GET lock:a", "$3\r\ntok\r\n"},
		{"wrong arity", fan, "GET lock:a b", "-ERR wrong number of arguments for 'get' command"},
		{"EVALSHA unknown", fan, "EVALSHA 0123 1 lock:a", "-NOSCRIPT"},
		{"SCRIPT EXISTS", fan, "SCRIPT EXISTS 0123", "*1\r\n:0\r\n"},
		{"EVAL without keys is not transparent", fan, "EVAL x 0", "-ERR unknown command 'EVAL'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHandler(Options{Limits: testLimits, Backend: tc.backend, LockPatterns: []string{"lock:*"}})
			defer h.Close()
			s := &resp.Session{W: resp.NewWriter()}
			h.ServeRESP(s, words(tc.cmd))
			if got := string(s.W.Bytes()); !strings.HasPrefix(got, tc.want) {
				t.Errorf("%s = %q; want %q…", tc.cmd, got, tc.want)
			}
		})
	}
	if want := []string{"GET", "lock:a"}; len(fan.args) != 2 || fan.args[1] != want[1] || len(fan.keys) != 1 || fan.keys[0] != 1 {
		t.Errorf("nodes were sent %q with keys at %v; want %q with the key at 1", fan.args, fan.keys, want)
	}
}

func TestScriptMayAcquire(t *testing.T) {
	for _, c := range []struct {
		name, body string
		want       bool
	}{
		{"compare-and-delete", `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`, false},
		{"compare-and-expire, single quotes", `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0`, false},
		{"redis-py extend", "local token = redis.call('get', KEYS[1])\nlocal expiration = redis.call('pttl', KEYS[1])\nredis.call('pexpire', KEYS[1], ARGV[2])\nreturn 1", false},
		{"set nx", `if redis.call("set", KEYS[1], ARGV[1], "NX", "PX", ARGV[3]) then return 1 end`, true},
		{"pcall set", `return redis.pcall('SET', KEYS[1], ARGV[1])`, true},
		{"name in a variable", `local c = "get" return redis.call(c, KEYS[1])`, true},
		{"aliased call", `local call = redis.call return call("set", KEYS[1], "x")`, true},
		{"no call at all", `return 1`, false},
	} {
		if got := scriptMayAcquire(c.body); got != c.want {
			t.Errorf("%s: scriptMayAcquire = %v; want %v", c.name, got, c.want)
		}
	}
}
