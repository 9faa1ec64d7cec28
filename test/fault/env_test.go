package fault

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

var soakFlag = flag.Bool("soak", false, "run the full sizes: 20 clients × 500 grants per fault, 20 × 10,000 without faults (also LOCKPROXY_SOAK=1)")

func init() {
	// Dial failures while an instance is down are counted by the workload;
	// go-redis's own log lines about them are noise.
	redis.SetLogger(quietLogger{})
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// soak reports whether the full (nightly) sizes were asked for.
func soak() bool { return *soakFlag || os.Getenv("LOCKPROXY_SOAK") == "1" }

// ---------------------------------------------------------------------------
// lockproxy instances

// proxy is one lockproxy instance on a fixed address; it can be killed and
// started again on the same address. Every process it ran is kept, so
// that all their output can be checked for panics.
type proxy struct {
	t    *testing.T
	addr string
	// admin is the HTTP admin listener (/metrics, /debug/pprof/), on
	// which the rows read goroutine counts and memory.
	admin string
	args  []string
	// environ, if set, is added to lockproxy's environment.
	environ []string

	mu    sync.Mutex
	procs []*harness.Proc
}

// startProxy starts lockproxy in front of nodes on a free port (admin
// listener on another, warnings only) and waits until it accepts
// connections; environ (LOCKPROXY_…=…) is added to its environment.
func startProxy(t *testing.T, nodes []string, environ ...string) *proxy {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	admin := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	p := &proxy{t: t, addr: addr, admin: admin, environ: environ, args: []string{
		"--listen", addr, "--admin", admin, "--nodes", strings.Join(nodes, ","), "--log-level", "warn",
	}}
	p.start()
	return p
}

func (p *proxy) start() {
	p.t.Helper()
	bin := harness.BuildLockproxy(p.t)
	cmd := exec.Command(bin, p.args...)
	if len(p.environ) > 0 {
		cmd.Env = append(os.Environ(), p.environ...)
	}
	proc := harness.StartCmd(p.t, cmd)
	p.mu.Lock()
	p.procs = append(p.procs, proc)
	p.mu.Unlock()
	for _, addr := range []string{p.addr, p.admin} {
		if err := harness.WaitTCP(addr, 15*time.Second); err != nil {
			p.t.Fatalf("lockproxy %v did not listen on %s: %v\noutput:\n%s", p.args, addr, err, proc.Output())
		}
	}
}

// kill SIGKILLs the running instance and returns 1 if it is gone.
func (p *proxy) kill() int {
	p.mu.Lock()
	cur := p.procs[len(p.procs)-1]
	p.mu.Unlock()
	cur.Kill()
	if !cur.Exited() {
		p.t.Errorf("lockproxy %s (pid %d) still running after SIGKILL", p.addr, cur.PID())
		return 0
	}
	return 1
}

// restart starts the instance again on the same address.
func (p *proxy) restart() { p.start() }

// output is everything every incarnation wrote.
func (p *proxy) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	for _, proc := range p.procs {
		b.WriteString(proc.Output())
	}
	return b.String()
}

// checkNoPanic fails the test if lockproxy's output shows a panic, a Go
// runtime fatal error or a data race.
func (p *proxy) checkNoPanic(t *testing.T) {
	t.Helper()
	out := p.output()
	for _, bad := range []string{"panic:", "fatal error:", "DATA RACE"} {
		if strings.Contains(out, bad) {
			t.Errorf("lockproxy %s output contains %q:\n%s", p.addr, bad, out)
		}
	}
}

// ---------------------------------------------------------------------------
// Clients

// newClient is a go-redis client of lockproxy speaking RESP2, with one
// connection, no retries, and a read timeout that leaves room for WAIT.
func newClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:            addr,
		Protocol:        2,
		MaxRetries:      -1,
		DialTimeout:     2 * time.Second,
		ReadTimeout:     10 * time.Second,
		WriteTimeout:    5 * time.Second,
		PoolSize:        1,
		DisableIdentity: true,
		MaintNotificationsConfig: &maintnotifications.Config{
			Mode: maintnotifications.ModeDisabled,
		},
	})
}

// nodeStates reads each node's state (ok, quarantined, down, clock) from
// the instance's INFO lines lockproxy_node<i>:addr=…,state=…, in the order
// of --nodes.
func (p *proxy) nodeStates(ctx context.Context) ([]string, error) {
	cl := newClient(p.addr)
	defer func() { _ = cl.Close() }()
	info, err := cl.Do(ctx, "INFO").Text()
	if err != nil {
		return nil, fmt.Errorf("INFO from %s: %w", p.addr, err)
	}
	var states []string
	for _, line := range strings.Split(info, "\n") {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "lockproxy_node") || strings.HasPrefix(name, "lockproxy_nodes") ||
			strings.HasPrefix(name, "lockproxy_node_") {
			continue
		}
		st := "?"
		for _, kv := range strings.Split(fields, ",") {
			if v, ok := strings.CutPrefix(kv, "state="); ok {
				st = v
			}
		}
		states = append(states, st)
	}
	return states, nil
}

// waitNodeStates polls every instance's INFO until each node listed in want
// shows the wanted state, or the timeout passes; it returns how long that
// took, or an error describing the states last seen.
func waitNodeStates(e *env, want map[int]string, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	var last [][]string
	for {
		last = last[:0]
		all := true
		for _, p := range e.proxies {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			states, err := p.nodeStates(ctx)
			cancel()
			if err != nil {
				return 0, err
			}
			last = append(last, states)
			for i, st := range want {
				if i >= len(states) || states[i] != st {
					all = false
				}
			}
		}
		if all {
			return time.Since(start), nil
		}
		if time.Since(start) > timeout {
			return 0, fmt.Errorf("node states %v after %v; want %v", last, timeout, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// setupLock is tryLock for a scenario's own setup LOCK, which a busy host
// can make miss the quorum (each node gets 5 % of the TTL to answer): a
// NOQUORUM is tried again, a few times, 100 ms apart. The scenarios test
// what happens after the grant.
func setupLock(t testing.TB, c *redis.Client, key string, args ...any) (lockclient.Grant, bool, error) {
	t.Helper()
	r, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 10*time.Second), c, key, args...)
	for try := 0; try < 5 && lockclient.IsNoQuorum(err); try++ {
		time.Sleep(100 * time.Millisecond)
		r, ok, err = lockclient.TryLock(lockclient.CtxFor(t, 10*time.Second), c, key, args...)
	}
	return r, ok, err
}

// setupLockRaw is setupLock on a raw connection; it returns the grant or
// the error (an error reply included).
func setupLockRaw(c *rawConn, timeout time.Duration, args ...string) (lockclient.Grant, error) {
	try := func() (lockclient.Grant, error) {
		v, _, err := c.do(timeout, append([]string{"LOCK"}, args...)...)
		if err != nil {
			return lockclient.Grant{}, err
		}
		return rawGrant(v)
	}
	r, err := try()
	for n := 0; n < 5 && lockclient.IsNoQuorum(err); n++ {
		time.Sleep(100 * time.Millisecond)
		r, err = try()
	}
	return r, err
}
