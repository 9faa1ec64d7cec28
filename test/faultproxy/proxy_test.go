package faultproxy

import (
	"bufio"
	"errors"
	lpredis "github.com/lockproxy/lockproxy/backends/redis"
	"github.com/lockproxy/lockproxy/relay"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
)

// conn is a raw RESP connection for the tests.
type conn struct {
	c net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, addr string) *conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &conn{c: c, r: bufio.NewReader(c)}
}

// doArray sends args and reads an array reply of bulk strings.
func (c *conn) doArray(timeout time.Duration, args ...string) ([]string, error) {
	_ = c.c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.c.Write(relay.AppendCommand(nil, toBytes(args))); err != nil {
		return nil, err
	}
	line, err := c.r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(line, "*") {
		return nil, errors.New("not an array: " + line)
	}
	n, _ := strconv.Atoi(strings.TrimRight(line[1:], "\r\n"))
	out := make([]string, 0, n)
	for range n {
		hdr, err := c.r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		l, _ := strconv.Atoi(strings.TrimRight(hdr[1:], "\r\n"))
		b := make([]byte, l+2)
		if _, err := io.ReadFull(c.r, b); err != nil {
			return nil, err
		}
		out = append(out, string(b[:l]))
	}
	return out, nil
}

// do sends args and reads one reply (simple, error, integer or bulk
// string) within timeout.
func (c *conn) do(timeout time.Duration, args ...string) (string, error) {
	_ = c.c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.c.Write(relay.AppendCommand(nil, toBytes(args))); err != nil {
		return "", err
	}
	line, err := c.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	switch {
	case line == "":
		return "", errors.New("empty reply")
	case line[0] == '-':
		return "", errors.New(line[1:])
	case line[0] == '$':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return "", nil
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(c.r, b); err != nil {
			return "", err
		}
		return string(b[:n]), nil
	}
	return line[1:], nil
}

func atoi(s string) int64 {
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

func toBytes(args []string) [][]byte {
	out := make([][]byte, len(args))
	for i, a := range args {
		out[i] = []byte(a)
	}
	return out
}

func newProxy(t *testing.T, upstream string) *Proxy {
	t.Helper()
	p, err := New(upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// TestProxy checks each mode against a real redis-server.
func TestProxy(t *testing.T) {
	harness.RequireBinary(t, "redis-server", "redis-server")
	node := harness.StartRedis(t, harness.RedisOptions{})
	direct := dial(t, node.Addr)

	tests := []struct {
		name string
		run  func(t *testing.T, p *Proxy)
	}{
		{"pass-through round trip", func(t *testing.T, p *Proxy) {
			c := dial(t, p.Addr())
			if v, err := c.do(time.Second, "SET", "pt", "hello\r\nworld"); err != nil || v != "OK" {
				t.Fatalf("SET = %q, %v", v, err)
			}
			if v, err := c.do(time.Second, "GET", "pt"); err != nil || v != "hello\r\nworld" {
				t.Fatalf("GET = %q, %v; want the value", v, err)
			}
			if v, err := direct.do(time.Second, "GET", "pt"); err != nil || v != "hello\r\nworld" {
				t.Fatalf("GET on the node = %q, %v", v, err)
			}
		}},
		{"latency adds at least the delay", func(t *testing.T, p *Proxy) {
			c := dial(t, p.Addr())
			if _, err := c.do(time.Second, "PING"); err != nil {
				t.Fatal(err)
			}
			const delay, jitter = 100 * time.Millisecond, 20 * time.Millisecond
			p.SetLatency(delay, jitter)
			for i := range 5 {
				start := time.Now()
				v, err := c.do(2*time.Second, "ECHO", strconv.Itoa(i))
				took := time.Since(start)
				if err != nil || v != strconv.Itoa(i) {
					t.Fatalf("ECHO %d = %q, %v (order kept?)", i, v, err)
				}
				// Both directions are delayed by delay ± jitter.
				if took < 2*(delay-jitter) {
					t.Errorf("ECHO took %v; want ≥ %v", took, 2*(delay-jitter))
				}
				t.Logf("round trip %d with %v ± %v each way: %v", i, delay, jitter, took)
			}
			p.PassThrough()
			start := time.Now()
			if _, err := c.do(time.Second, "PING"); err != nil || time.Since(start) > 50*time.Millisecond {
				t.Errorf("after PassThrough: PING took %v, %v", time.Since(start), err)
			}
		}},
		{"blackhole times out a PING, then heals", func(t *testing.T, p *Proxy) {
			c := dial(t, p.Addr())
			if _, err := c.do(time.Second, "PING"); err != nil {
				t.Fatal(err)
			}
			p.Blackhole()
			_, err := c.do(200*time.Millisecond, "PING")
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatalf("PING through a blackhole = %v; want a timeout", err)
			}
			fresh := dial(t, p.Addr()) // accepted, never answered
			if _, err := fresh.do(200*time.Millisecond, "PING"); !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatalf("PING on a new connection through a blackhole = %v; want a timeout", err)
			}
			p.PassThrough()
			// The old connections lost bytes: they are reset. New ones work.
			if _, err := c.do(time.Second, "PING"); err == nil {
				t.Errorf("PING on a connection that lost bytes succeeded; want it reset")
			}
			if v, err := dial(t, p.Addr()).do(time.Second, "PING"); err != nil || v != "PONG" {
				t.Errorf("PING after heal = %q, %v", v, err)
			}
		}},
		{"reset gives ECONNRESET or EOF", func(t *testing.T, p *Proxy) {
			c := dial(t, p.Addr())
			if _, err := c.do(time.Second, "PING"); err != nil {
				t.Fatal(err)
			}
			p.Reset()
			time.Sleep(20 * time.Millisecond)
			for _, name := range []string{"existing", "new"} {
				var err error
				if name == "existing" {
					_, err = c.do(time.Second, "PING")
				} else if nc, derr := net.DialTimeout("tcp", p.Addr(), time.Second); derr != nil {
					err = derr // reset during the handshake
				} else {
					_, err = (&conn{c: nc, r: bufio.NewReader(nc)}).do(time.Second, "PING")
					_ = nc.Close()
				}
				if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) && !errors.Is(err, syscall.EPIPE) {
					t.Errorf("%s connection: PING after Reset = %v; want ECONNRESET or EOF", name, err)
				} else {
					t.Logf("%s connection: %v", name, err)
				}
			}
			p.PassThrough()
			if v, err := dial(t, p.Addr()).do(time.Second, "PING"); err != nil || v != "PONG" {
				t.Errorf("PING after heal = %q, %v", v, err)
			}
		}},
		{"fast clock shortens TTLs", func(t *testing.T, p *Proxy) {
			const rate = 2.0
			c := dial(t, p.Addr())
			p.FastClock(rate)
			steps := []struct {
				args  []string
				key   string
				limit int64 // PTTL on the node must be ≤ this
			}{
				{[]string{"SET", "fc1", "v", "PX", "1000"}, "fc1", 500},
				{[]string{"SET", "fc2", "v", "NX", "px", "1000"}, "fc2", 500},
				{[]string{"SET", "fc3", "v", "EX", "10"}, "fc3", 5000},
				{[]string{"SET", "fc4", "tok", "NX", "PX", "100000"}, "fc4", 50000},
				{[]string{"PEXPIRE", "fc4", "8000"}, "fc4", 4000},
				{[]string{"EVAL", extend.Src, "4", "fc4", "m", "r", "rh", "tok", "6000", "marker"}, "fc4", 3000},
				{[]string{"SCRIPT", "LOAD", extend.Src}, "", 0},
				{[]string{"EVALSHA", extend.SHA, "4", "fc4", "m", "r", "rh", "tok", "2000", "marker"}, "fc4", 1000},
			}
			for _, s := range steps {
				if _, err := c.do(time.Second, s.args...); err != nil {
					t.Fatalf("%v: %v", s.args[0], err)
				}
				if s.key == "" {
					continue
				}
				v, err := direct.do(time.Second, "PTTL", s.key)
				pttl, _ := strconv.ParseInt(v, 10, 64)
				if err != nil || pttl <= 0 || pttl > s.limit {
					t.Errorf("%q: PTTL %s on the node = %q, %v; want in (0, %d]", s.args, s.key, v, err, s.limit)
				}
			}
			// TIME runs rate× fast since FastClock: after ~300 ms more, the
			// proxied clock is ahead of the node's by about that much again.
			time.Sleep(300 * time.Millisecond)
			viaProxy, err1 := c.doArray(time.Second, "TIME")
			atNode, err2 := direct.doArray(time.Second, "TIME")
			if err1 != nil || err2 != nil || len(viaProxy) != 2 || len(atNode) != 2 {
				t.Fatalf("TIME = %q, %v / %q, %v", viaProxy, err1, atNode, err2)
			}
			us := func(v []string) int64 { return atoi(v[0])*1_000_000 + atoi(v[1]) }
			if ahead := us(viaProxy) - us(atNode); ahead < 250_000 {
				t.Errorf("TIME through the fast-clock proxy is %d µs ahead of the node's; want ≥ 250 ms (rate 2 for 300+ ms)", ahead)
			}
			p.PassThrough()
			if _, err := c.do(time.Second, "SET", "fc5", "v", "PX", "1000"); err != nil {
				t.Fatal(err)
			}
			if v, _ := direct.do(time.Second, "PTTL", "fc5"); !(atoi(v) > 900) {
				t.Errorf("after PassThrough: PTTL = %s; want about 1000", v)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, newProxy(t, node.Addr))
		})
	}
}

// TestFramer feeds commands to the RESP framer split at every byte and
// checks what comes out.
func TestFramer(t *testing.T) {
	cmd := func(args ...string) string { return string(relay.AppendCommand(nil, toBytes(args))) }
	tests := []struct {
		name string
		in   string
		rate float64
		want string
	}{
		{"untouched without rate", cmd("SET", "k", "v", "PX", "1000"), 0, cmd("SET", "k", "v", "PX", "1000")},
		{"SET PX", cmd("SET", "k", "v", "NX", "PX", "1500"), 1.5, cmd("SET", "k", "v", "NX", "PX", "1000")},
		{"SET EX", cmd("SET", "k", "v", "EX", "3"), 1.5, cmd("SET", "k", "v", "PX", "2000")},
		{"PEXPIRE", cmd("pexpire", "k", "3000"), 1.5, cmd("pexpire", "k", "2000")},
		{"extend EVALSHA", cmd("EVALSHA", extend.SHA, "1", "k", "tok", "2000"), 2, cmd("EVALSHA", extend.SHA, "1", "k", "tok", "1000")},
		{"extend EVAL, more keys", cmd("EVAL", extend.Src, "3", "a", "b", "c", "tok", "2000", "m"), 2, cmd("EVAL", extend.Src, "3", "a", "b", "c", "tok", "1000", "m")},
		{"other EVALSHA", cmd("EVALSHA", strings.Repeat("a", 40), "1", "k", "tok", "2000"), 2, cmd("EVALSHA", strings.Repeat("a", 40), "1", "k", "tok", "2000")},
		{"HINCRBY untouched", cmd("HINCRBY", "f", "12", "1"), 2, cmd("HINCRBY", "f", "12", "1")},
		{"pipeline and inline", "PING\r\n" + cmd("SET", "a", "b", "PX", "10") + cmd("GET", "a"), 2,
			"PING\r\n" + cmd("SET", "a", "b", "PX", "5") + cmd("GET", "a")},
		{"not RESP passes through", "*x\r\n$3\r\nfoo", 2, "*x\r\n$3\r\nfoo"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, step := range []int{len(tc.in), 1, 3} {
				f := &respFramer{}
				var out []byte
				for i := 0; i < len(tc.in); i += step {
					out = append(out, f.feed([]byte(tc.in[i:min(i+step, len(tc.in))]), tc.rate)...)
				}
				if string(out) != tc.want {
					t.Errorf("fed %d bytes at a time: got %q; want %q", step, out, tc.want)
				}
			}
		})
	}
}

// extend is lockproxy's extend script (LeaseScripts' order: acquire,
// read, extend), whose ARGV[2] is a lease.
var extend = lpredis.LeaseScripts()[2]
