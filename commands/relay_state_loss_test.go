package commands

import (
	"bufio"
	"context"
	"fmt"
	goredis "github.com/redis/go-redis/v9"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/conf"
	"github.com/lockproxy/lockproxy/relay"
	"github.com/lockproxy/lockproxy/resp"
	"github.com/lockproxy/lockproxy/test/harness"
)

// defaultsProxy serves a Handler that relays to up as lockproxy is
// configured by default (the default deny list, the lock key prefix
// "lockproxy:", transparent mode on "lock:*") on a loopback port for the
// test's life, and returns its address.
func defaultsProxy(t *testing.T, up *harness.Redis, poolSize int) string {
	t.Helper()
	rl := relay.New(relay.Config{Addr: up.Addr, PoolSize: poolSize, DialTimeout: time.Second,
		ReadTimeout: 10 * time.Second, Deny: conf.DefaultDenyCommands, KeyPrefix: "lockproxy:"})
	return serveRelay(t, rl, []string{"lock:*"})
}

// serveRelay serves a Handler relaying with rl, for the test's life.
func serveRelay(t *testing.T, rl *relay.Relay, patterns []string) string {
	t.Helper()
	h := NewHandler(Options{Limits: testLimits, Backend: &fakeBackend{}, Relay: rl, LockPatterns: patterns})
	return serveRelayed(t, &resp.Server{Handler: h}, h, rl)
}

// frameConn is a client on a raw connection that reads whole replies of
// any type, rendered as text: "+OK", "-ERR …", ":1", "$v" (bulk), "_"
// (null), "*[a b]" (array; ">[…]" a push).
type frameConn struct {
	t  *testing.T
	nc net.Conn
	br *bufio.Reader
}

func dialFrames(t *testing.T, addr string) *frameConn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &frameConn{t: t, nc: nc, br: bufio.NewReaderSize(nc, 1<<16)}
}

// send writes the commands (words split on spaces) in one write.
func (c *frameConn) send(cmds ...string) {
	c.t.Helper()
	var b []byte
	for _, cmd := range cmds {
		b = relay.AppendCommand(b, words(cmd))
	}
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatal(err)
	}
}

// read reads one reply within d.
func (c *frameConn) read(d time.Duration) (string, error) {
	_ = c.nc.SetReadDeadline(time.Now().Add(d))
	return readTextFrame(c.br)
}

func (c *frameConn) do(cmd string) string {
	c.t.Helper()
	c.send(cmd)
	r, err := c.read(5 * time.Second)
	if err != nil {
		c.t.Fatalf("%s: %v", cmd, err)
	}
	return r
}

// readAll reads up to n replies, each within d, stopping at the first
// error, which ends the list as "<error text>".
func (c *frameConn) readAll(n int, d time.Duration) []string {
	var got []string
	for range n {
		r, err := c.read(d)
		if err != nil {
			return append(got, "<"+err.Error()+">")
		}
		got = append(got, r)
	}
	return got
}

func readTextFrame(br *bufio.Reader) (string, error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", fmt.Errorf("empty line")
	}
	switch line[0] {
	case '$', '=':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return "_", nil
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(br, b); err != nil {
			return "", err
		}
		return "$" + string(b[:n]), nil
	case '*', '>', '~', '%':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return "_", nil
		}
		if line[0] == '%' {
			n *= 2
		}
		var el []string
		for range n {
			e, err := readTextFrame(br)
			if err != nil {
				return "", err
			}
			el = append(el, e)
		}
		return string(line[0]) + "[" + strings.Join(el, " ") + "]", nil
	}
	return line, nil
}

// upstreamClientID waits for the upstream connection running cmd (as
// CLIENT LIST names it, "blpop") and returns its id.
func upstreamClientID(t *testing.T, up *harness.Redis, cmd string) string {
	t.Helper()
	uc := up.Client(t)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		list, _ := uc.ClientList(context.Background()).Result()
		for _, l := range strings.Split(list, "\n") {
			if strings.Contains(l, "cmd="+cmd+" ") {
				return strings.TrimPrefix(strings.Fields(l)[0], "id=")
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no upstream connection runs %s", cmd)
	return ""
}

// TestLostPinnedConnectionStopsTheClient: a client's pinned upstream
// connection holds state the commands it pipelined after depend on (a
// WATCH, a database). When the upstream drops it while a command waits,
// none of the commands behind may run elsewhere: MULTI would take a clean
// connection without the WATCH and EXEC commit over the change the WATCH
// was there to catch; a write meant for database 3 would land in 0. Each
// later command gets an error, nothing more is relayed, and the client's
// connection is closed, as Redis closing it would.
func TestLostPinnedConnectionStopsTheClient(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup []string // each sent and answered first
		batch []string // pipelined; its first command blocks
		// check tells what went wrong on the upstream, or "".
		check func(ctx context.Context, up *harness.Redis) string
	}{
		{name: "WATCH lost: EXEC must not commit", setup: []string{"SET k orig"},
			batch: []string{"WATCH k", "BLPOP q 5", "MULTI", "SET k mine", "EXEC"},
			check: func(ctx context.Context, up *harness.Redis) string {
				if v, _ := up.Client(t).Get(ctx, "k").Result(); v != "theirs" {
					return fmt.Sprintf("k = %q: the transaction committed over the change to the watched key", v)
				}
				return ""
			}},
		{name: "database lost: no write to database 0", setup: []string{"SELECT 3"},
			batch: []string{"BLPOP q 5", "SET dbk mine"},
			check: func(ctx context.Context, up *harness.Redis) string {
				if n, _ := up.Client(t).Exists(ctx, "dbk").Result(); n != 0 {
					return "the SET sent in database 3 was written to database 0"
				}
				return ""
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := harness.StartRedis(t, harness.RedisOptions{})
			uc := up.Client(t)
			ctx := context.Background()
			addr := defaultsProxy(t, up, 2)
			// Two clean connections in the idle list, as busy servers
			// have: MULTI after the loss would get one at once.
			c2, c3 := dialFrames(t, addr), dialFrames(t, addr)
			c2.do("WATCH x")
			c3.do("WATCH y")
			c2.do("UNWATCH")
			c3.do("UNWATCH")

			c := dialFrames(t, addr)
			for _, cmd := range tc.setup {
				if r := c.do(cmd); r != "+OK" {
					t.Fatalf("%s: %s", cmd, r)
				}
			}
			c.send(tc.batch...)
			id := upstreamClientID(t, up, "blpop")
			// Another client changes the watched key.
			if err := uc.Set(ctx, "k", "theirs", 0).Err(); err != nil {
				t.Fatal(err)
			}
			// The upstream drops the pinned connection (a restart, a
			// timeout…).
			if err := uc.Do(ctx, "CLIENT", "KILL", "ID", id).Err(); err != nil {
				t.Fatal(err)
			}
			got := c.readAll(len(tc.batch)+1, 2*time.Second)
			t.Logf("client got %q", got)
			if what := tc.check(ctx, up); what != "" {
				t.Error(what)
			}
			for i, r := range got {
				if i < len(tc.batch) && strings.HasPrefix(r, "<") && !strings.Contains(r, "EOF") && !strings.Contains(r, "reset") {
					t.Errorf("reply %d: %s; want an error reply or the connection closed", i, r)
				}
				if i > 0 && i < len(tc.batch) && !strings.HasPrefix(r, "-") && !strings.HasPrefix(r, "<") {
					t.Errorf("reply %d (%s) after the loss: %s; want an error", i, tc.batch[i], r)
				}
			}
			if last := got[len(got)-1]; !strings.Contains(last, "EOF") && !strings.Contains(last, "reset") {
				t.Errorf("the client's connection is still open after its pinned one was lost (last: %s)", last)
			}
		})
	}
}

// TestMultiWithoutPinnedConnection: a pipelined transaction whose MULTI
// cannot get a pinned connection (the upstream refuses a new one: max
// clients reached) must not run the commands queued after it one by one
// on the shared connection: directly on Redis nothing sent inside MULTI
// runs outside the transaction. They are refused and EXEC answers
// EXECABORT.
func TestMultiWithoutPinnedConnection(t *testing.T) {
	addr, _, uc := relayWithNoConnectionLeft(t) // its WATCH holds the last connection
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		batch []string
	}{
		{"MULTI", []string{"MULTI", "INCR debit", "INCR credit", "EXEC"}},
		{"WATCH", []string{"WATCH debit", "MULTI", "INCR debit", "INCR credit", "EXEC"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialFrames(t, addr)
			c.send(tc.batch...)
			got := c.readAll(len(tc.batch), 3*time.Second)
			d, _ := uc.Get(ctx, "debit").Result()
			cr, _ := uc.Get(ctx, "credit").Result()
			t.Logf("replies %q; debit=%q credit=%q", got, d, cr)
			if d != "" || cr != "" {
				t.Errorf("commands sent inside MULTI ran outside any transaction")
			}
			wantFailedTransaction(t, tc.batch, got)
			// The connection is usable afterwards, out of the transaction.
			if r := c.do("PING"); r != "+PONG" {
				t.Errorf("PING after: %s", r)
			}
		})
	}
}

// TestRefusedSubscribeKeepsNormalMode: a SUBSCRIBE the upstream refuses
// (for its arity, or its ACL on channels), or a MONITOR (its ACL on
// commands), leaves the connection as it was, as on Redis: the commands
// after it are served normally, not refused as "not allowed in pub/sub
// mode".
func TestRefusedSubscribeKeepsNormalMode(t *testing.T) {
	up := harness.StartRedis(t, harness.RedisOptions{})
	addr := defaultsProxy(t, up, 1)
	// lockproxy's upstream user may use the channels ok* only, and not
	// MONITOR.
	if err := up.Client(t).Do(context.Background(), "ACL", "SETUSER", "app", "on", ">pw", "~*", "resetchannels", "&ok*", "+@all", "-monitor").Err(); err != nil {
		t.Fatal(err)
	}
	limited := serveRelay(t, relay.New(relay.Config{Addr: up.Addr, Username: "app", Password: "pw", PoolSize: 1,
		DialTimeout: time.Second, ReadTimeout: 10 * time.Second, KeyPrefix: "lockproxy:"}), nil)
	for _, tc := range []struct{ name, addr, cmd, want string }{
		{"direct", up.Addr, "SUBSCRIBE", "-ERR wrong number of arguments"},
		{"direct", up.Addr, "PSUBSCRIBE", "-ERR wrong number of arguments"},
		{"direct", up.Addr, "SSUBSCRIBE", "-ERR wrong number of arguments"},
		{"through lockproxy", addr, "SUBSCRIBE", "-ERR wrong number of arguments"},
		{"through lockproxy", addr, "PSUBSCRIBE", "-ERR wrong number of arguments"},
		{"through lockproxy", addr, "SSUBSCRIBE", "-ERR wrong number of arguments"},
		{"upstream ACL", limited, "SUBSCRIBE secret", "-NOPERM"},
		{"upstream ACL", limited, "PSUBSCRIBE sec*", "-NOPERM"},
		{"upstream ACL", limited, "MONITOR", "-NOPERM"},
	} {
		t.Run(tc.name+" "+tc.cmd, func(t *testing.T) {
			c := dialFrames(t, tc.addr)
			r1 := c.do(tc.cmd)
			r2 := c.do("MULTI")
			if !strings.HasPrefix(r1, tc.want) {
				t.Errorf("%s: %s; want %s…", tc.cmd, r1, tc.want)
			}
			if r2 != "+OK" {
				t.Errorf("MULTI after a refused %s: %s; want +OK", tc.cmd, r2)
			}
		})
	}
}

// TestTunnelPermissionRefusalAfterEarlierReplies: on a subscribed RESP3
// connection (whose replies come from the upstream as they arrive), a
// command auth.permissions refuses is answered after the replies to the
// commands sent before it, as every other refusal there: written at once
// it would overtake them, and the client's library would take -NOPERM for
// the reply to its PING.
func TestTunnelPermissionRefusalAfterEarlierReplies(t *testing.T) {
	proxy, _ := proxyWithUpstream(t, Options{Password: "pw",
		Permissions: map[string]Permission{"default": {Commands: []string{"+@all", "-get"}}}})
	got := subscribedExchange(t, proxy, "HELLO 3 AUTH default pw\r\n", "PING a\r\nGET x\r\nPING b\r\n")
	want := "$1\r\na\r\n-NOPERM"
	if !strings.HasPrefix(got, want) || !strings.HasSuffix(got, "$1\r\nb\r\n") {
		t.Errorf("after SUBSCRIBE ch, PING a, GET x (refused), PING b: %q; want %q…, then PING b's reply", got, want)
	}
}

// relayWithNoConnectionLeft serves a relay to an upstream that accepts
// three clients and has them all taken: the test's own (uc, returned),
// the relay's shared connection, and one pinned by other's WATCH. The
// next pin fails until other lets its connection go (UNWATCH).
func relayWithNoConnectionLeft(t *testing.T) (addr string, other *frameConn, uc *goredis.Client) {
	t.Helper()
	up := harness.StartRedis(t, harness.RedisOptions{Password: "pw", Args: []string{"--maxclients", "3"}})
	uc = up.Client(t)
	if err := uc.Ping(context.Background()).Err(); err != nil { // connection 1
		t.Fatal(err)
	}
	rl := relay.New(relay.Config{Addr: up.Addr, Password: "pw", PoolSize: 1, DialTimeout: time.Second,
		ReadTimeout: 10 * time.Second, Deny: conf.DefaultDenyCommands, KeyPrefix: "lockproxy:"})
	addr = serveRelay(t, rl, nil)
	other = dialFrames(t, addr)
	if r := other.do("GET x"); r != "_" { // the shared connection: 2
		t.Fatalf("GET: %s", r)
	}
	if r := other.do("WATCH x"); r != "+OK" { // a pinned one: 3, the last
		t.Fatalf("WATCH: %s", r)
	}
	return addr, other, uc
}

// wantFailedTransaction checks the replies to a batch sent as a failed
// transaction: every one an error, EXEC's -EXECABORT.
func wantFailedTransaction(t *testing.T, batch, got []string) {
	t.Helper()
	for i, r := range got {
		if !strings.HasPrefix(r, "-") {
			t.Errorf("reply %d (%s): %s; want an error", i, batch[i], r)
		}
	}
	if last := got[len(got)-1]; !strings.HasPrefix(last, "-EXECABORT") {
		t.Errorf("EXEC: %s; want EXECABORT", last)
	}
}
