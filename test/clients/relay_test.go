package clients

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/harness"
)

func proxyClient(t *testing.T, e *env, proto int) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: e.proxy, Protocol: proto, MaxRetries: -1,
		DialTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, PoolSize: 2})
	t.Cleanup(func() { c.Close() })
	return c
}

// TestRelayRefusals: keyspace isolation (single and multi-key commands,
// container subcommands, scripts, KEYS and SCAN results) and denied
// commands, with the connection working after each refusal.
func TestRelayRefusals(t *testing.T) {
	e := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	up := e.up.Client(t)
	if err := up.MSet(ctx, "lockproxy:secret", "1", "plain", "2").Err(); err != nil {
		t.Fatal(err)
	}
	for _, proto := range []int{2, 3} {
		c := proxyClient(t, e, proto)
		for _, tc := range []struct {
			args []any
			want string // in the error; "" = relayed
		}{
			{[]any{"GET", "lockproxy:secret"}, "reserved for lockproxy's locks"},
			{[]any{"MSET", "a", "1", "lockproxy:b", "2"}, "reserved"},
			{[]any{"DEL", "x", "lockproxy:y"}, "reserved"},
			{[]any{"RENAME", "plain", "lockproxy:z"}, "reserved"},
			{[]any{"OBJECT", "ENCODING", "lockproxy:secret"}, "reserved"},
			{[]any{"EVAL", "return 1", 2, "a", "lockproxy:k"}, "reserved"},
			{[]any{"EVAL", "return redis.call('get', 'lockproxy:secret')", 0}, "script names the key prefix"},
			{[]any{"ZUNIONSTORE", "dst", 2, "a", "lockproxy:z"}, "reserved"},
			{[]any{"XREAD", "COUNT", 1, "STREAMS", "s", "lockproxy:s", "0", "0"}, "reserved"},
			{[]any{"SET", "plain", "lockproxy:value"}, ""}, // a value is not a key
			{[]any{"CONFIG", "GET", "maxmemory"}, "'config' is denied"},
			{[]any{"FLUSHDB"}, "'flushdb' is denied"},
			{[]any{"CLIENT", "KILL", "ID", "1"}, "'client|kill' is denied"},
			{[]any{"SCRIPT", "FLUSH"}, "'script|flush' is denied"},
			{[]any{"SHUTDOWN"}, "'shutdown' is denied"},
			{[]any{"CLIENT", "REPLY", "OFF"}, "CLIENT REPLY is not supported"},
		} {
			err := c.Do(ctx, tc.args...).Err()
			if errors.Is(err, redis.Nil) {
				err = nil
			}
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("RESP%d %v = %v; want it relayed", proto, tc.args, err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("RESP%d %v = %v; want an error with %q", proto, tc.args, err, tc.want)
			}
		}
		keys, err := c.Keys(ctx, "*").Result()
		if err != nil || len(keys) != 1 || keys[0] != "plain" {
			t.Errorf("RESP%d KEYS * = %q, %v; want only [plain]", proto, keys, err)
		}
		scanned, _, err := c.Scan(ctx, 0, "*", 100).Result()
		if err != nil || len(scanned) != 1 || scanned[0] != "plain" {
			t.Errorf("RESP%d SCAN 0 = %q, %v; want only [plain]", proto, scanned, err)
		}
		if v, err := up.Get(ctx, "lockproxy:secret").Result(); err != nil || v != "1" {
			t.Errorf("the reserved key upstream = %q, %v; want it untouched", v, err)
		}
	}
}

// TestRelayOrder: replies keep the order of the commands when a pipeline
// mixes relayed commands, lockproxy's own and refusals; COMMAND merges the
// upstream's table with lockproxy's.
func TestRelayOrder(t *testing.T) {
	e := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, proto := range []int{2, 3} {
		c := proxyClient(t, e, proto)
		checkCommandTable(ctx, t, c)
		for round := range 20 {
			p := c.Pipeline()
			var cmds []*redis.Cmd
			var want []string
			for i := range 12 {
				k := fmt.Sprintf("o%d", i)
				switch i % 4 {
				case 0:
					cmds = append(cmds, p.Do(ctx, "SET", k, fmt.Sprint(round*100+i)))
					want = append(want, "OK")
				case 1:
					cmds = append(cmds, p.Do(ctx, "ECHO", k)) // lockproxy's own
					want = append(want, k)
				case 2:
					cmds = append(cmds, p.Do(ctx, "GET", fmt.Sprintf("o%d", i-2)))
					want = append(want, fmt.Sprint(round*100+i-2))
				case 3:
					cmds = append(cmds, p.Do(ctx, "GET", "lockproxy:x")) // refused
					want = append(want, "ERR")
				}
			}
			_, _ = p.Exec(ctx)
			for i, cmd := range cmds {
				got := fmt.Sprint(cmd.Val())
				if cmd.Err() != nil {
					got = cmd.Err().Error()
				}
				if !strings.HasPrefix(got, want[i]) {
					t.Fatalf("RESP%d round %d: reply %d = %q; want %q", proto, round, i, got, want[i])
				}
			}
		}
	}
}

// TestRelayUpstreamDown: with the upstream gone, relayed commands get a
// clear error at once, a subscriber's connection is closed, and lock
// commands keep working; once it is back, relaying resumes.
func TestRelayUpstreamDown(t *testing.T) {
	e := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := proxyClient(t, e, 2)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// A subscriber: its connection is closed when the upstream one that
	// holds its subscription is lost, so its library can subscribe again.
	sub, err := net.DialTimeout("tcp", e.proxy, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	_ = sub.SetDeadline(time.Now().Add(15 * time.Second))
	if _, err := sub.Write([]byte("SUBSCRIBE ch\r\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 256)
	if n, err := sub.Read(buf); err != nil || !strings.Contains(string(buf[:n]), "subscribe") {
		t.Fatalf("SUBSCRIBE ch = %q, %v", buf[:n], err)
	}
	e.up.Kill()
	if n, err := sub.Read(buf); err == nil {
		t.Errorf("subscriber read %q after the upstream died; want its connection closed", buf[:n])
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Errorf("subscriber connection still open 15 s after the upstream died")
	}
	start := time.Now()
	err = c.Get(ctx, "k").Err()
	if err == nil || !strings.Contains(err.Error(), "upstream unavailable") {
		t.Fatalf("GET with the upstream down = %v; want upstream unavailable", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("GET with the upstream down took %v", d)
	}
	if _, err := c.Do(ctx, "LOCK", "down", "PX", 2000).Result(); err != nil {
		t.Fatalf("LOCK with the upstream down = %v; want granted", err)
	}
	e.up.Restart()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := c.Set(ctx, "k2", "v2", 0).Err()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("SET after the upstream came back: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRelaySelectAndTransactions: SELECT pins the client to its own
// connection on that database; a transaction with a refused command aborts
// as Redis's does.
func TestRelaySelectAndTransactions(t *testing.T) {
	e := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := proxyClient(t, e, 3)
	conn := c.Conn()
	defer conn.Close()
	if err := conn.Select(ctx, 3).Err(); err != nil {
		t.Fatalf("SELECT 3: %v", err)
	}
	if err := conn.Set(ctx, "in3", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	up := e.up.Client(t)
	if n, _ := up.Exists(ctx, "in3").Result(); n != 0 {
		t.Errorf("key set after SELECT 3 is in database 0")
	}
	up3 := redis.NewClient(&redis.Options{Addr: e.up.Addr, DB: 3})
	defer up3.Close()
	if v, err := up3.Get(ctx, "in3").Result(); err != nil || v != "x" {
		t.Errorf("database 3 GET in3 = %q, %v; want x", v, err)
	}
	if err := conn.Select(ctx, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, _ := conn.Exists(ctx, "in3").Result(); n != 0 {
		t.Errorf("after SELECT 0 the key of database 3 is still seen")
	}

	cmds, err := conn.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, "t1", "1", 0)
		p.Get(ctx, "lockproxy:x")
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "EXECABORT") {
		t.Errorf("transaction with a refused command = %v; want EXECABORT", err)
	}
	if len(cmds) == 2 && (cmds[1].Err() == nil || !strings.Contains(cmds[1].Err().Error(), "reserved")) {
		t.Errorf("refused command in MULTI = %v; want the refusal", cmds[1].Err())
	}
	if n, _ := up.Exists(ctx, "t1").Result(); n != 0 {
		t.Errorf("the aborted transaction's SET ran")
	}
	if err := conn.Ping(ctx).Err(); err != nil {
		t.Errorf("PING after the aborted transaction: %v", err)
	}
}

// TestRelayStateChangeInMulti: a command that would change the pinned
// upstream connection's state at EXEC (database, protocol, user, name,
// reply mode, subscriptions) is refused inside MULTI and aborts the EXEC,
// so that no such state reaches the connection, which goes back to the
// shared pool after EXEC: transactions of other clients afterwards still
// run in database 0 and get RESP2 replies.
func TestRelayStateChangeInMulti(t *testing.T) {
	e := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := proxyClient(t, e, 2)
	for _, args := range [][]any{
		{"SELECT", 5},
		{"HELLO", 3},
		{"AUTH", "default", "x"},
		{"SUBSCRIBE", "ch"},
		{"PSUBSCRIBE", "c*"},
		{"CLIENT", "REPLY", "OFF"},
		{"CLIENT", "TRACKING", "ON"},
		{"CLIENT", "SETNAME", "other"},
		{"client", "no-evict", "on"},
	} {
		conn := c.Conn()
		if err := conn.Do(ctx, "MULTI").Err(); err != nil {
			t.Fatalf("MULTI: %v", err)
		}
		if err := conn.Do(ctx, args...).Err(); err == nil || !strings.Contains(err.Error(), "not allowed inside MULTI") {
			t.Errorf("%v inside MULTI = %v; want the refusal", args, err)
		}
		if err := conn.Do(ctx, "EXEC").Err(); err == nil || !strings.Contains(err.Error(), "EXECABORT") {
			t.Errorf("EXEC after %v = %v; want EXECABORT", args, err)
		}
		if err := conn.Ping(ctx).Err(); err != nil {
			t.Errorf("PING after %v: %v", args, err)
		}
		conn.Close()
	}
	// Another client's transaction, on whichever pooled connection it gets.
	other := proxyClient(t, e, 2)
	for i := range 3 {
		conn := other.Conn()
		_, err := conn.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, "victim", i, 0)
			p.HSet(ctx, "victimh", "f", "v")
			p.HGetAll(ctx, "victimh")
			return nil
		})
		if err != nil {
			t.Errorf("transaction %d: %v", i, err)
		}
		conn.Close()
	}
	up := e.up.Client(t)
	if v, err := up.Get(ctx, "victim").Result(); err != nil || v != "2" {
		t.Errorf("database 0 victim = %q, %v; want 2 (the transactions ran elsewhere)", v, err)
	}
	if name, err := up.Do(ctx, "CLIENT", "LIST").Text(); err == nil && strings.Contains(name, "name=other") {
		t.Errorf("an upstream connection was named by a refused CLIENT SETNAME:\n%s", name)
	}
}

// checkCommandTable: COMMAND merges the upstream's table with lockproxy's.
func checkCommandTable(ctx context.Context, t *testing.T, c *redis.Client) {
	t.Helper()
	n, err := c.Do(ctx, "COMMAND", "COUNT").Int64()
	if err != nil || n < 200 {
		t.Errorf("COMMAND COUNT = %d, %v; want the upstream's commands and lockproxy's", n, err)
	}
	info, err := c.Do(ctx, "COMMAND", "INFO", "get", "lock").Slice()
	if err != nil || len(info) != 2 || info[0] == nil || info[1] == nil {
		t.Errorf("COMMAND INFO get lock = %v, %v; want both", info, err)
	}
	docs, err := c.Do(ctx, "COMMAND", "DOCS").Result()
	text := fmt.Sprint(docs)
	if err != nil || !strings.Contains(text, "lock") || !strings.Contains(text, "hset") {
		t.Errorf("COMMAND DOCS: %v; want lock and hset among them", err)
	}
	keys, err := c.Do(ctx, "COMMAND", "GETKEYS", "MSET", "a", "1", "b", "2").StringSlice()
	if err != nil || len(keys) != 2 {
		t.Errorf("COMMAND GETKEYS MSET a 1 b 2 = %v, %v; want [a b]", keys, err)
	}
}

// TestRelayUpstreamAuth: lockproxy authenticates to a password-protected
// upstream with upstream.password; a wrong one is reported per command.
func TestRelayUpstreamAuth(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name, password, want string
	}{
		{"right password", "s3cret", ""},
		{"wrong password", "nope", "upstream unavailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startWith(t, harness.RedisOptions{Password: "s3cret"}, []string{"LOCKPROXY_UPSTREAM_PASSWORD=" + tc.password})
			for _, proto := range []int{2, 3} {
				c := proxyClient(t, e, proto)
				err := c.Set(ctx, "k", "v", 0).Err()
				switch {
				case tc.want == "" && err != nil:
					t.Errorf("RESP%d SET through lockproxy: %v", proto, err)
				case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
					t.Errorf("RESP%d SET with a wrong upstream password = %v; want %q", proto, err, tc.want)
				}
			}
			if strings.Contains(e.lp.Output(), tc.password) {
				t.Errorf("lockproxy logged the upstream password")
			}
		})
	}
}

// TestRelayBlockingClientGone: a client that disconnects while its BLPOP
// waits does not leave the BLPOP behind to take the next element.
func TestRelayBlockingClientGone(t *testing.T) {
	e := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nc, err := net.DialTimeout("tcp", e.proxy, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Write([]byte("*3\r\n$5\r\nBLPOP\r\n$2\r\nbq\r\n$1\r\n0\r\n")); err != nil {
		t.Fatal(err)
	}
	up := e.up.Client(t)
	// Wait until the BLPOP blocks upstream, then leave.
	for deadline := time.Now().Add(10 * time.Second); ; {
		info, _ := up.Info(ctx, "clients").Result()
		if strings.Contains(info, "blocked_clients:1") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the BLPOP never blocked upstream:\n%s", info)
		}
		time.Sleep(50 * time.Millisecond)
	}
	nc.Close()
	// Wait until the upstream shows no blocked client, then push.
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, _ := up.Info(ctx, "clients").Result()
		if strings.Contains(info, "blocked_clients:0") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the upstream still has a blocked client after the client left:\n%s", info)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := up.RPush(ctx, "bq", "x").Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if n, err := up.LLen(ctx, "bq").Result(); err != nil || n != 1 {
		t.Errorf("LLEN bq after the push = %d, %v; want 1 (the element kept)", n, err)
	}
	// The proxy still relays blocking commands for others.
	c2 := proxyClient(t, e, 2)
	if v, err := c2.BLPop(ctx, time.Second, "bq").Result(); err != nil || len(v) != 2 || v[1] != "x" {
		t.Errorf("BLPOP bq = %v, %v; want [bq x]", v, err)
	}
}

// TestRelayTrackingAndStreams: CLIENT TRACKING under RESP3 pins the client,
// which then gets the upstream's invalidation pushes; XREAD … BLOCK waits
// on a connection of the client's own.
func TestRelayTrackingAndStreams(t *testing.T) {
	e := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nc, err := net.DialTimeout("tcp", e.proxy, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	send := func(args ...string) {
		b := fmt.Sprintf("*%d\r\n", len(args))
		for _, a := range args {
			b += fmt.Sprintf("$%d\r\n%s\r\n", len(a), a)
		}
		if _, err := nc.Write([]byte(b)); err != nil {
			t.Fatal(err)
		}
	}
	var got strings.Builder
	readUntil := func(want string) {
		buf := make([]byte, 4096)
		for !strings.Contains(got.String(), want) {
			n, err := nc.Read(buf)
			if err != nil {
				t.Fatalf("waiting for %q: %v; got %q", want, err, got.String())
			}
			got.Write(buf[:n])
		}
	}
	send("HELLO", "3")
	readUntil("proto")
	send("CLIENT", "TRACKING", "ON")
	send("GET", "tracked")
	send("PING", "ready")
	readUntil("ready")
	other := proxyClient(t, e, 2)
	if err := other.Set(ctx, "tracked", "changed", 0).Err(); err != nil {
		t.Fatal(err)
	}
	readUntil("invalidate")
	if !strings.Contains(got.String(), ">2\r\n$10\r\ninvalidate\r\n") {
		t.Errorf("tracking connection got %q; want an invalidate push", got.String())
	}

	c := proxyClient(t, e, 3)
	start := time.Now()
	res, err := c.XRead(ctx, &redis.XReadArgs{Streams: []string{"st", "$"}, Block: 300 * time.Millisecond}).Result()
	if !errors.Is(err, redis.Nil) || len(res) != 0 {
		t.Errorf("XREAD BLOCK 300 on an idle stream = %v, %v; want nil", res, err)
	}
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Errorf("XREAD BLOCK 300 returned after %v; want it to wait", d)
	}
	// The XADD comes once the XREAD blocks upstream: "$" reads only what
	// is added after the XREAD began, and a loaded machine may take
	// longer than any fixed while to relay it.
	up := e.up.Client(t)
	added := make(chan error, 1)
	go func() {
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			info, _ := up.Info(ctx, "clients").Result()
			if strings.Contains(info, "blocked_clients:1") {
				break
			}
			if time.Now().After(deadline) {
				added <- fmt.Errorf("the XREAD never blocked upstream:\n%s", info)
				return
			}
		}
		added <- other.XAdd(ctx, &redis.XAddArgs{Stream: "st", Values: []string{"f", "v"}}).Err()
	}()
	res, err = c.XRead(ctx, &redis.XReadArgs{Streams: []string{"st", "$"}, Block: 5 * time.Second}).Result()
	if aerr := <-added; aerr != nil {
		t.Fatalf("XADD: %v", aerr)
	}
	if err != nil || len(res) != 1 || len(res[0].Messages) != 1 {
		t.Errorf("XREAD BLOCK woken by XADD = %v, %v; want one message", res, err)
	}
}

// TestRelayUnsubscribeUnsubscribed: UNSUBSCRIBE on a connection with no
// subscription answers as Redis does (one frame per channel) and leaves
// the shared upstream connection in step.
func TestRelayUnsubscribeUnsubscribed(t *testing.T) {
	e := start(t)
	raw := func(addr string, proto int) string {
		nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		_ = nc.SetDeadline(time.Now().Add(15 * time.Second))
		req := "SET k v\r\nUNSUBSCRIBE a b\r\nPUNSUBSCRIBE\r\nGET k\r\nPING done\r\n"
		if proto == 3 {
			req = "HELLO 3\r\n" + req
		}
		if _, err := nc.Write([]byte(req)); err != nil {
			t.Fatal(err)
		}
		var got []byte
		buf := make([]byte, 4096)
		for !strings.Contains(string(got), "done\r\n") {
			n, err := nc.Read(buf)
			if err != nil {
				t.Fatalf("%s: %v after %q", addr, err, got)
			}
			got = append(got, buf[:n]...)
		}
		s := string(got)
		if proto == 3 {
			s = s[strings.Index(s, "+OK"):] // HELLO's reply differs (server, version, id)
		}
		return s
	}
	for _, proto := range []int{2, 3} {
		direct, proxied := raw(e.up.Addr, proto), raw(e.proxy, proto)
		if direct != proxied {
			t.Errorf("RESP%d: directly %q; through lockproxy %q", proto, direct, proxied)
		}
	}
}

// TestRelayInteractiveCLI: an interactive redis-cli through the relay reads
// the merged COMMAND DOCS at start, so help and hints cover the upstream's
// commands and lockproxy's, and both kinds run.
func TestRelayInteractiveCLI(t *testing.T) {
	e := start(t)
	_, port, _ := strings.Cut(e.proxy, ":")
	for _, proto := range []string{"2", "3"} {
		t.Run("RESP"+proto, func(t *testing.T) {
			p := harness.StartProc(t, "/usr/bin/python3", filepath.Join(here(), "py", "drive_redis_cli.py"), port, proto,
				"help SET", "help LOCK", "SET cli v", "GET cli", "quit")
			code, err := p.Wait(30 * time.Second)
			out := p.Output()
			if err != nil || code != 0 {
				t.Fatalf("pty driver: exit %d, %v; output:\n%s", code, err, out)
			}
			plain := ansiEscape.ReplaceAllString(out, "")
			for _, want := range []string{"SET key value", "group: string", "LOCK key [PX milliseconds|EX seconds]", "group: lock", "OK", "\"v\"", "REDIS-CLI EXIT 0"} {
				if !strings.Contains(plain, want) {
					t.Errorf("interactive redis-cli -%s output lacks %q:\n%s", proto, want, plain)
				}
			}
		})
	}
}

// ansiEscape matches terminal escape sequences.
var ansiEscape = regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]`)

// TestRelayEventLoop: plain relayed traffic is served on the event loop.
// A pipeline far bigger than the socket buffers, sent while the upstream
// is stopped, gets every reply in order once it runs again (the loop's
// upstream write goes on from a goroutine); a pipeline longer than one
// relayed batch may be moves the connection to a goroutine of its own, as
// does a lock command, whose connection comes back after 16 plain batches;
// INFO counts all three.
func TestRelayEventLoop(t *testing.T) {
	e := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dial := func() (net.Conn, *bufioReader) {
		c, err := net.DialTimeout("tcp", e.proxy, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(60 * time.Second))
		return c, newBufioReader(c)
	}
	loopStats := func() (on, off, back int) {
		t.Helper()
		info, err := proxyClient(t, e, 2).Info(ctx, "lockproxy").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []struct {
			name string
			v    *int
		}{{"lockproxy_event_loop_clients:", &on}, {"lockproxy_event_loop_handoffs:", &off}, {"lockproxy_event_loop_returns:", &back}} {
			i := strings.Index(info, f.name)
			if i < 0 {
				t.Fatalf("INFO lockproxy has no %s\n%s", f.name, info)
			}
			_, _ = fmt.Sscanf(info[i+len(f.name):], "%d", f.v)
		}
		return on, off, back
	}

	// The upstream stops reading while 16 MB of SETs come in.
	big, bigRd := dial()
	value := strings.Repeat("v", 256<<10)
	var req []byte
	for i := range 64 {
		req = fmt.Appendf(req, "*3\r\n$3\r\nSET\r\n$%d\r\nloop%d\r\n$%d\r\n%s\r\n", len(fmt.Sprint("loop", i)), i, len(value), value)
	}
	e.up.Pause()
	wrote := make(chan error, 1)
	go func() { _, err := big.Write(req); wrote <- err }()
	time.Sleep(300 * time.Millisecond)
	e.up.Resume()
	if err := <-wrote; err != nil {
		t.Fatalf("writing the pipeline: %v", err)
	}
	for i := range 64 {
		if line, err := bigRd.line(); err != nil || line != "+OK" {
			t.Fatalf("SET %d = %q, %v", i, line, err)
		}
	}
	// Replies in order on the same connection, still on the loop.
	if _, err := big.Write([]byte("*2\r\n$3\r\nGET\r\n$6\r\nloop63\r\n*2\r\n$6\r\nSTRLEN\r\n$5\r\nloop0\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := bigRd.line(); err != nil || line != fmt.Sprintf("$%d", len(value)) {
		t.Fatalf("GET loop63 = %q, %v", line, err)
	}
	if line, err := bigRd.line(); err != nil || line != value {
		t.Fatalf("GET loop63: a value of %d bytes, %v", len(line), err)
	}
	if line, err := bigRd.line(); err != nil || line != fmt.Sprintf(":%d", len(value)) {
		t.Fatalf("STRLEN loop0 = %q, %v", line, err)
	}
	on, off, _ := loopStats()
	if on < 1 {
		t.Errorf("event_loop_clients = %d with a plain relaying client open; want it on the loop", on)
	}

	// 5,000 GETs in one write: more than the loop relays in one batch.
	long, longRd := dial()
	var gets []byte
	for range 5000 {
		gets = append(gets, "*2\r\n$3\r\nGET\r\n$6\r\nnokey1\r\n"...)
	}
	if _, err := long.Write(gets); err != nil {
		t.Fatal(err)
	}
	for i := range 5000 {
		if line, err := longRd.line(); err != nil || line != "$-1" {
			t.Fatalf("GET %d = %q, %v", i, line, err)
		}
	}

	// A lock command moves its connection.
	lk, lkRd := dial()
	if _, err := lk.Write([]byte("*4\r\n$4\r\nLOCK\r\n$2\r\nlk\r\n$2\r\nPX\r\n$4\r\n5000\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := lkRd.line(); err != nil || line != "*6" {
		t.Fatalf("LOCK = %q, %v", line, err)
	}
	for range 10 { // token, validity_ms and fence: three bulk names, a bulk token, two integers
		if _, err := lkRd.line(); err != nil {
			t.Fatal(err)
		}
	}
	_, off2, _ := loopStats()
	if off2 < off+2 {
		t.Errorf("event_loop_handoffs went from %d to %d; want the long pipeline and the lock command moved", off, off2)
	}

	// Its ordinary traffic afterwards brings it back to the loop.
	for i := range 20 {
		if _, err := lk.Write([]byte("*2\r\n$3\r\nGET\r\n$6\r\nnokey2\r\n")); err != nil {
			t.Fatal(err)
		}
		if line, err := lkRd.line(); err != nil || line != "$-1" {
			t.Fatalf("GET %d after the lock = %q, %v", i, line, err)
		}
	}
	if _, _, back := loopStats(); back < 1 {
		t.Errorf("event_loop_returns = %d after 20 plain batches; want the lock's connection back on the loop", back)
	}
}

// bufioReader reads RESP lines.
type bufioReader struct{ r *bufio.Reader }

func newBufioReader(c net.Conn) *bufioReader { return &bufioReader{bufio.NewReaderSize(c, 1<<20)} }

func (b *bufioReader) line() (string, error) {
	s, err := b.r.ReadString('\n')
	return strings.TrimSuffix(s, "\r\n"), err
}

// TestRelayEventLoopChurn: connections come and go on the event loop in
// every way — relaying and leaving, leaving with replies in flight,
// leaving in the middle of a command, moving to a goroutine for a lock
// command — and afterwards lockproxy holds no more file descriptors or
// goroutines than before.
func TestRelayEventLoopChurn(t *testing.T) {
	admin := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	e := start(t, "--admin", admin)
	if err := harness.WaitTCP(admin, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	fds := func() int {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", e.lp.PID()))
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	goroutines := func() int {
		resp, err := http.Get("http://" + admin + "/debug/pprof/goroutine?debug=1")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		first, err := bufio.NewReader(resp.Body).ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(first, "goroutine profile: total ")))
		if err != nil {
			t.Fatalf("goroutine profile header %q: %v", first, err)
		}
		return n
	}
	// Warm up: the shared upstream connections, and the lock nodes'
	// connections that as many concurrent lock commands open, exist
	// before the baseline.
	warm := redis.NewClient(&redis.Options{Addr: e.proxy, Protocol: 2, PoolSize: 16, MaxRetries: -1})
	if err := warm.Set(context.Background(), "warm", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	var warmWG sync.WaitGroup
	for i := range 16 {
		warmWG.Add(1)
		go func() {
			defer warmWG.Done()
			for j := range 5 {
				_ = warm.Do(context.Background(), "LOCK", fmt.Sprintf("warm:%d:%d", i, j), "PX", 500).Err()
			}
		}()
	}
	warmWG.Wait()
	_ = warm.Close()
	// Connections on goroutines relay on every shared connection of the
	// pool (a mixed batch moves a connection off the loop).
	for range 8 {
		c, err := net.DialTimeout("tcp", e.proxy, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n*3\r\n$3\r\nSET\r\n$4\r\nwarm\r\n$1\r\n2\r\n")); err != nil {
			t.Fatal(err)
		}
		rd := bufio.NewReader(c)
		for range 2 {
			if _, err := rd.ReadString('\n'); err != nil {
				t.Fatal(err)
			}
		}
		_ = c.Close()
	}
	time.Sleep(200 * time.Millisecond)
	baseFDs, baseG := fds(), goroutines()

	const workers, rounds = 16, 25
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				c, err := net.DialTimeout("tcp", e.proxy, 5*time.Second)
				if err != nil {
					errs <- err
					return
				}
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				rd := bufio.NewReader(c)
				key := fmt.Sprintf("churn:%d:%d", w, r)
				set := fmt.Sprintf("*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$1\r\nv\r\n", len(key), key)
				switch (w + r) % 4 {
				case 0: // relays and reads every reply
					if _, err := c.Write([]byte(set + set + "*1\r\n$4\r\nPING\r\n")); err != nil {
						errs <- err
					}
					for range 3 {
						if _, err := rd.ReadString('\n'); err != nil {
							errs <- fmt.Errorf("worker %d round %d: %w", w, r, err)
							break
						}
					}
				case 1: // leaves with replies in flight
					_, _ = c.Write([]byte(set + set + set))
				case 2: // leaves in the middle of a command
					_, _ = c.Write([]byte(set + "*3\r\n$3\r\nSET\r\n$5\r\nchu"))
				case 3: // moves to a goroutine for a lock command, then relays
					// PX 5000: a node timeout of 250 ms, which the first
					// LOCK's connection set-up meets on a loaded host.
					lock := fmt.Sprintf("*4\r\n$4\r\nLOCK\r\n$%d\r\n%s\r\n$2\r\nPX\r\n$4\r\n5000\r\n", len(key), key)
					if _, err := c.Write([]byte(lock)); err != nil {
						errs <- err
					}
					if line, err := rd.ReadString('\n'); err != nil || !strings.HasPrefix(line, "*6") {
						errs <- fmt.Errorf("LOCK = %q, %v", line, err)
					}
				}
				_ = c.Close()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	// Every connection gone: descriptors and goroutines back near where
	// they were (a few may be an idle pinned upstream connection and
	// their readers, and the admin request's).
	deadline := time.Now().Add(20 * time.Second)
	for {
		f, g := fds(), goroutines()
		if f <= baseFDs+2 && g <= baseG+4 {
			break
		}
		if time.Now().After(deadline) {
			resp, err := http.Get("http://" + admin + "/debug/pprof/goroutine?debug=1")
			var stacks []byte
			if err == nil {
				stacks, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			t.Fatalf("after the churn: %d file descriptors (%d before), %d goroutines (%d before)\n%s", f, baseFDs, g, baseG, stacks)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
