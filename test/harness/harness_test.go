package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func ping(t *testing.T, c *redis.Client, d time.Duration) error {
	t.Helper()
	return c.Ping(ctxTimeout(t, d)).Err()
}

// gone reports whether pid no longer exists (it was reaped).
func gone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

func TestRedisNodesSetGet(t *testing.T) {
	t.Parallel()
	nodes := StartRedisN(t, 3, RedisOptions{})

	addrs := Addrs(nodes)
	seen := map[string]bool{}
	for i, a := range addrs {
		if a != fmt.Sprintf("127.0.0.1:%d", nodes[i].Port) || a != nodes[i].Addr {
			t.Errorf("Addrs[%d] = %q, node Addr %q, Port %d", i, a, nodes[i].Addr, nodes[i].Port)
		}
		if seen[a] {
			t.Errorf("duplicate address %s", a)
		}
		seen[a] = true
	}

	for i, n := range nodes {
		t.Run(fmt.Sprintf("node%d", i), func(t *testing.T) {
			if !n.Running() || n.PID() <= 0 {
				t.Fatalf("Running=%v PID=%d", n.Running(), n.PID())
			}
			c := n.Client(t)
			ctx := ctxTimeout(t, 5*time.Second)
			val := fmt.Sprintf("value-%d", i)
			if err := c.Set(ctx, "k", val, 0).Err(); err != nil {
				t.Fatalf("SET: %v", err)
			}
			got, err := c.Get(ctx, "k").Result()
			if err != nil || got != val {
				t.Fatalf("GET = %q, %v; want %q", got, err, val)
			}
			// The harness defaults are in effect.
			cfg, err := c.ConfigGet(ctx, "save").Result()
			if err != nil || cfg["save"] != "" {
				t.Errorf("CONFIG GET save = %v, %v; want empty", cfg, err)
			}
			if !strings.Contains(n.LogTail(0), "Ready to accept connections") {
				t.Errorf("log does not say ready:\n%s", n.LogTail(10))
			}
		})
	}
}

func TestRedisKillRestartPauseResume(t *testing.T) {
	t.Parallel()
	n := StartRedis(t, RedisOptions{})
	c := n.Client(t)
	port := n.Port
	pid1 := n.PID()

	if err := c.Set(ctxTimeout(t, 5*time.Second), "key", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}

	// Kill: PING fails, the process is reaped; Kill is idempotent.
	n.Kill()
	n.Kill()
	if n.Running() {
		t.Fatal("Running after Kill")
	}
	if !gone(pid1) {
		t.Errorf("pid %d still exists after Kill", pid1)
	}
	if err := ping(t, c, 2*time.Second); err == nil {
		t.Fatal("PING succeeded after Kill")
	}

	// Restart: same port, new process, empty dataset.
	n.Restart()
	if n.Port != port || !n.Running() || n.PID() == pid1 {
		t.Fatalf("after Restart: Port=%d (was %d) Running=%v PID=%d (was %d)", n.Port, port, n.Running(), n.PID(), pid1)
	}
	if err := ping(t, c, 5*time.Second); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
	if err := c.Get(ctxTimeout(t, 5*time.Second), "key").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET key after Restart: err = %v; want redis.Nil", err)
	}

	// Pause: a PING with a 200ms context times out, promptly.
	n.Pause()
	start := time.Now()
	err := ping(t, c, 200*time.Millisecond)
	if err == nil || !isTimeout(err) {
		t.Fatalf("PING while paused: err = %v; want timeout", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("PING while paused took %v", d)
	}
	if !n.Running() {
		t.Error("paused node reported not running")
	}

	// Resume: PING works again.
	n.Resume()
	if err := ping(t, c, 5*time.Second); err != nil {
		t.Fatalf("PING after Resume: %v", err)
	}

	// Stop on a paused node still exits gracefully and quickly.
	pid2 := n.PID()
	n.Pause()
	start = time.Now()
	n.Stop()
	if n.Running() || !gone(pid2) {
		t.Fatalf("after Stop: Running=%v gone=%v", n.Running(), gone(pid2))
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("Stop of paused node took %v (fell back to SIGKILL?)", d)
	}
	if !strings.Contains(n.LogTail(0), "ready to exit, bye bye") {
		t.Errorf("Stop did not shut down gracefully; log:\n%s", n.LogTail(10))
	}
	n.Stop() // idempotent

	// Restart after Stop, Kill while paused.
	n.Restart()
	if err := ping(t, c, 5*time.Second); err != nil {
		t.Fatalf("PING after second Restart: %v", err)
	}
	pid3 := n.PID()
	n.Pause()
	n.Kill()
	if n.Running() || !gone(pid3) {
		t.Fatalf("Kill of paused node: Running=%v gone=%v", n.Running(), gone(pid3))
	}
}

func TestRedisRestartRetriesBusyPort(t *testing.T) {
	t.Parallel()
	n := StartRedis(t, RedisOptions{})
	c := n.Client(t)
	n.Kill()
	// Someone else briefly holds the port; Restart must wait for it.
	l, err := net.Listen("tcp", n.Addr)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(500 * time.Millisecond)
		l.Close()
	}()
	n.Restart()
	if err := ping(t, c, 5*time.Second); err != nil {
		t.Fatalf("PING after Restart on busy port: %v", err)
	}
}

func TestRedisPassword(t *testing.T) {
	t.Parallel()
	n := StartRedis(t, RedisOptions{Password: "s3cret", Args: []string{"--maxmemory", "10mb"}})
	ctx := ctxTimeout(t, 5*time.Second)
	c := n.Client(t)
	if err := c.Set(ctx, "a", "b", 0).Err(); err != nil {
		t.Fatalf("SET with password: %v", err)
	}
	if cfg, err := c.ConfigGet(ctx, "maxmemory").Result(); err != nil || cfg["maxmemory"] != "10485760" {
		t.Errorf("maxmemory = %v, %v", cfg, err)
	}
	anon := redis.NewClient(&redis.Options{Addr: n.Addr, DisableIdentity: true, MaxRetries: -1})
	defer anon.Close()
	if err := anon.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Errorf("unauthenticated PING: err = %v; want NOAUTH", err)
	}
}

// fatalTB captures Fatalf instead of failing the real test.
type fatalTB struct {
	testing.TB
	mu  sync.Mutex
	msg string
}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.msg = fmt.Sprintf(format, args...)
	f.mu.Unlock()
	runtime.Goexit()
}

func TestStartRedisFailsWithLogTail(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"bad option", []string{"--no-such-option", "x"}, []string{"exited during startup", "no-such-option"}},
		{"bad value", []string{"--maxmemory-policy", "bogus"}, []string{"exited during startup", "maxmemory-policy"}},
		{"port override", []string{"--port", "1234"}, []string{"must not contain --port"}},
		{"daemonize override", []string{"--daemonize", "yes"}, []string{"must not contain --daemonize"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := &fatalTB{TB: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				StartRedis(f, RedisOptions{Args: tc.args})
			}()
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				t.Fatal("StartRedis did not return")
			}
			if f.msg == "" {
				t.Fatal("StartRedis did not fail")
			}
			for _, w := range tc.want {
				if !strings.Contains(f.msg, w) {
					t.Errorf("failure message lacks %q:\n%s", w, f.msg)
				}
			}
		})
	}
}

func TestFreePortUnique(t *testing.T) {
	t.Parallel()
	const n = 300
	seen := map[int]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range n / 4 {
				p := FreePort(t)
				mu.Lock()
				if seen[p] {
					t.Errorf("port %d returned twice", p)
				}
				if p <= 0 || p > 65535 || reservedPort(p) {
					t.Errorf("bad port %d", p)
				}
				// Below the ephemeral range, where nothing but FreePort
				// takes a port between its check and the server's bind.
				if lo, hi, ok := pickRange(); ok && (p < lo || p > hi) {
					t.Errorf("port %d outside %d-%d", p, lo, hi)
				}
				seen[p] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(seen) != n {
		t.Errorf("got %d distinct ports, want %d", len(seen), n)
	}
}

func TestStartProc(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		script   string
		signal   syscall.Signal // sent once the process is running; 0 = none
		kill     bool
		wantOut  string
		wantCode int
	}{
		{name: "echo", script: "echo hi", wantOut: "hi\n", wantCode: 0},
		{name: "stderr and exit code", script: "echo out; echo err >&2; exit 3", wantOut: "out\nerr\n", wantCode: 3},
		{name: "SIGTERM", script: "echo started; exec sleep 100", signal: syscall.SIGTERM, wantOut: "started\n", wantCode: -1},
		{name: "Kill", script: "echo started; sleep 100", kill: true, wantOut: "started\n", wantCode: -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := StartProc(t, "sh", "-c", tc.script)
			if tc.signal != 0 || tc.kill {
				deadline := time.Now().Add(5 * time.Second)
				for !strings.Contains(p.Output(), "started") && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
			}
			if tc.signal != 0 {
				if err := p.Signal(tc.signal); err != nil {
					t.Fatalf("Signal: %v", err)
				}
			}
			if tc.kill {
				p.Kill()
				p.Kill() // idempotent
			}
			code, err := p.Wait(10 * time.Second)
			if err != nil {
				t.Fatalf("Wait: %v", err)
			}
			if code != tc.wantCode {
				t.Errorf("exit code = %d; want %d", code, tc.wantCode)
			}
			if got := p.Output(); got != tc.wantOut {
				t.Errorf("output = %q; want %q", got, tc.wantOut)
			}
			if !p.Exited() || !gone(p.PID()) {
				t.Errorf("process %d not reaped", p.PID())
			}
			if err := p.Signal(syscall.SIGTERM); !errors.Is(err, os.ErrProcessDone) {
				t.Errorf("Signal after exit: %v; want os.ErrProcessDone", err)
			}
		})
	}
}

func TestProcWaitTimeoutAndGroupKill(t *testing.T) {
	t.Parallel()
	// The background sleep is a second member of the process group and
	// holds the output pipe open; Kill must take it down too.
	p := StartProc(t, "sh", "-c", "sleep 100 & echo $!; wait")
	if _, err := p.Wait(100 * time.Millisecond); err == nil {
		t.Fatal("Wait returned before the process exited")
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.HasSuffix(p.Output(), "\n") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	var grandchild int
	if _, err := fmt.Sscan(p.Output(), &grandchild); err != nil {
		t.Fatalf("parse grandchild pid from %q: %v", p.Output(), err)
	}
	start := time.Now()
	p.Kill()
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Kill took %v", d)
	}
	if !p.Exited() {
		t.Fatal("not exited after Kill")
	}
	// The grandchild was SIGKILLed with the group and, orphaned to this
	// (subreaper) process, reaped: it must not even linger as a zombie.
	if !gone(grandchild) {
		st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", grandchild))
		t.Errorf("grandchild %d survived the group kill: %s", grandchild, st)
	}
}

func TestWaitTCP(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	tests := []struct {
		name    string
		addr    string
		wantErr bool
	}{
		{"listening", l.Addr().String(), false},
		{"nothing listening", RefusedAddr(t), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := WaitTCP(tc.addr, 300*time.Millisecond)
			if (err != nil) != tc.wantErr {
				t.Errorf("WaitTCP(%s) = %v; wantErr %v", tc.addr, err, tc.wantErr)
			}
		})
	}
}

func TestRequireBinaryAndModuleRoot(t *testing.T) {
	t.Parallel()
	RequireBinary(t, "redis-server", "redis-server")
	RequireBinary(t, "sh", "dash")

	f := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		RequireBinary(f, "no-such-binary-lockproxy", "some-package")
	}()
	<-done
	if !strings.Contains(f.msg, "no-such-binary-lockproxy") || !strings.Contains(f.msg, "some-package") {
		t.Errorf("RequireBinary message = %q", f.msg)
	}

	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !strings.Contains(string(mod), "module github.com/lockproxy/lockproxy") {
		t.Errorf("moduleRoot = %s; go.mod: %v", root, err)
	}
}

// TestRedisTLS: a node started with TLS answers over TLS with a
// certificate the test CA signed, and not in plain text.
func TestRedisTLS(t *testing.T) {
	ca := NewTestCA(t)
	r := StartRedis(t, RedisOptions{TLS: ca})
	if err := r.Client(t).Ping(context.Background()).Err(); err != nil {
		t.Fatalf("PING over TLS: %v", err)
	}
	c, err := net.DialTimeout("tcp", r.Addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	_, _ = c.Write([]byte("PING\r\n"))
	if b, err := bufio.NewReader(c).ReadString('\n'); err == nil && strings.HasPrefix(b, "+PONG") {
		t.Fatal("the TLS port answered a plain-text PING")
	}
}
