package commands

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/resp"
)

// TestTTLScriptRuleOnlyForTTLReplies: a script that returns a key's PTTL
// is agreed on by PTTL's rule (the largest t a majority has at least of),
// which takes every non-negative integer for a time left. A script that
// returns PTTL in one branch and a positive status in another ("1:
// extended, else how long the holder has left") had its status taken for
// a time too: with the extension made on one node only (1), another
// holder's key on one (7000) and none on the third (-2), the client was
// told 1, extended, where the nodes do not agree at all. Negative codes
// (bsm/redislock's -3), 0 and nil stay below or outside any time left and
// keep PTTL's rule.
//
// The rule also applies whichever way the script is run: one that may
// acquire (a string port of Redisson's tryLock: nil when it took the key,
// else the holder's PTTL), or one taken for such because a comment names
// redis, answered "no majority" whenever the key was held by another
// client, its nodes' PTTLs differing by milliseconds.
func TestTTLScriptRuleOnlyForTTLReplies(t *testing.T) {
	const extendOrPTTL = `if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('pexpire', KEYS[1], ARGV[2]) return 1 end return redis.call('pttl', KEYS[1])`
	const tryLock = `if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return nil end return redis.call('pttl', KEYS[1])`
	const bsmCommented = "-- the time left on the redis lock, -3 when not ours\n" +
		`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("pttl", KEYS[1]) else return -3 end`
	wrote := func(v any) backends.NodeReply {
		return backends.NodeReply{Val: v, Writes: []backends.KeyWrite{{Wrote: true, Exists: true, Value: "tok", PTTL: 10000}}}
	}
	held := func(ms int64) backends.NodeReply {
		return backends.NodeReply{Val: ms, Writes: []backends.KeyWrite{{Exists: true, Value: "other", PTTL: ms}}}
	}
	for _, c := range []struct {
		name, body string
		replies    []backends.NodeReply
		want       string // prefix of the reply
	}{
		{"extend-or-PTTL, extended on one node only", extendOrPTTL, replies(int64(1), int64(7000), int64(-2)), "-ERR no majority"},
		{"extend-or-PTTL, extended on a majority", extendOrPTTL, replies(int64(1), int64(1), int64(7000)), ":1\r\n"},
		{"tryLock, held by another on every node", tryLock,
			[]backends.NodeReply{held(4990), held(4980), held(5000)}, ":4990\r\n"},
		{"tryLock, taken on one node, held by another on two", tryLock,
			[]backends.NodeReply{wrote(nil), held(4990), held(5000)}, ":4990\r\n"},
		{"bsm TTL with a comment, nodes ms apart", bsmCommented, replies(int64(4990), int64(4980), int64(5000)), ":4990\r\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := serveEvalOnConn(t, c.replies, c.body, "1", "lock:a", "tok", "10000")
			if !strings.HasPrefix(got, c.want) {
				t.Errorf("EVAL = %q; want %q…", got, c.want)
			}
		})
	}
}

// serveEvalOnConn serves one EVAL with these arguments on a connection to
// a Handler whose nodes answer replies (a script that may acquire needs
// the session's context), and returns the first line of the reply.
func serveEvalOnConn(t *testing.T, replies []backends.NodeReply, args ...string) string {
	t.Helper()
	fan := &fanoutBackend{replies: replies}
	h := NewHandler(Options{Limits: testLimits, Backend: fan, LockPatterns: []string{"lock:*"}})
	srv := &resp.Server{Handler: h}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		h.Close()
	}()
	conn, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	args = append([]string{"EVAL"}, args...)
	req := fmt.Sprintf("*%d\r\n", len(args))
	for _, a := range args {
		req += fmt.Sprintf("$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	got, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the reply: %v", err)
	}
	return got
}
