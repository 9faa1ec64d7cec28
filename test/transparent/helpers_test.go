package transparent

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// keyPrefix is lockproxy's default key prefix on the nodes: the lock key of
// client key k is keyPrefix+"lock:"+k.
const keyPrefix = "lockproxy:"

// patterns are the lock patterns every test's lockproxy runs with.
// redis-semaphore prefixes its keys with "mutex:".
var patterns = []string{"lock:*", "mutex:*"}

// env is three real redis-server nodes and one lockproxy in front of them
// with lock patterns configured.
type env struct {
	nodes  []*harness.Redis
	direct []*redis.Client // one per node, straight to it
	addr   string          // lockproxy's RESP listener
	proc   *harness.Proc
}

func start(t testing.TB, extraArgs ...string) *env {
	t.Helper()
	e := &env{nodes: harness.StartRedisN(t, 3, harness.RedisOptions{})}
	for _, n := range e.nodes {
		e.direct = append(e.direct, n.Client(t))
	}
	bin := harness.BuildLockproxy(t)
	e.addr = fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	args := []string{"--listen", e.addr, "--admin", "", "--nodes", strings.Join(harness.Addrs(e.nodes), ",")}
	for _, p := range patterns {
		args = append(args, "--lock-pattern", p)
	}
	args = append(args, extraArgs...)
	cmd := exec.Command(bin, args...)
	// Node timeouts of up to 1 s (default: TTL × 0.05, at most 250 ms): the
	// test machine has two shared cores, often at a load average above
	// 20, and a node that answers late turns an acquisition into NOQUORUM.
	// Dead nodes still fail at once (connection refused).
	cmd.Env = append(os.Environ(),
		"LOCKPROXY_REDLOCK_NODE_TIMEOUT_FACTOR=0.2",
		"LOCKPROXY_REDLOCK_NODE_TIMEOUT_MAX=1s",
	)
	e.proc = harness.StartCmd(t, cmd)
	if err := harness.WaitTCP(e.addr, 15*time.Second); err != nil {
		t.Fatalf("lockproxy did not listen on %s: %v\n%s", e.addr, err, e.proc.Output())
	}
	return e
}

// port is lockproxy's port, for the clients in other languages.
func (e *env) port() string { return e.addr[strings.LastIndexByte(e.addr, ':')+1:] }

// nodePorts lists the nodes' ports, comma-separated.
func (e *env) nodePorts() string {
	var ps []string
	for _, n := range e.nodes {
		ps = append(ps, fmt.Sprint(n.Port))
	}
	return strings.Join(ps, ",")
}

// client is a go-redis client of lockproxy with the library's defaults
// but for a pool large enough for the concurrency tests.
func (e *env) client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: e.addr, PoolSize: 16})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// holding counts the running nodes whose lock key for key holds value.
func (e *env) holding(t *testing.T, key, value string) int {
	t.Helper()
	n := 0
	for i, c := range e.direct {
		if !e.nodes[i].Running() {
			continue
		}
		v, err := c.Get(lockclient.CtxFor(t, 5*time.Second), keyPrefix+"lock:"+key).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatalf("node %d: GET: %v", i, err)
		}
		if err == nil && v == value {
			n++
		}
	}
	return n
}

// present counts the running nodes on which key's lock key exists.
func (e *env) present(t *testing.T, key string) int {
	t.Helper()
	n := 0
	for i, c := range e.direct {
		if !e.nodes[i].Running() {
			continue
		}
		k, err := c.Exists(lockclient.CtxFor(t, 5*time.Second), keyPrefix+"lock:"+key).Result()
		if err != nil {
			t.Fatalf("node %d: EXISTS: %v", i, err)
		}
		n += int(k)
	}
	return n
}

// requireHeld fails unless a majority of the nodes hold key with value.
func (e *env) requireHeld(t *testing.T, what, key, value string) {
	t.Helper()
	if n := e.holding(t, key, value); n < len(e.nodes)/2+1 {
		t.Fatalf("%s: lock key of %q holds the holder's value on %d of %d nodes; want a majority", what, key, n, len(e.nodes))
	}
}

// requireOnEveryNode waits up to 2 s for key's lock key to be on every
// node: a SET NX PX is answered once a majority granted it, and the last
// node's acquire may land after the reply. A test of what a later command
// does to the key starts from it everywhere.
func (e *env) requireOnEveryNode(t *testing.T, what, key string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		n := e.present(t, key)
		if n == len(e.nodes) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: lock key of %q on %d of %d nodes 2 s after its grant; want all", what, key, n, len(e.nodes))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// requireGone fails unless key's lock key is on no node (a roll-back or a
// release to a node sent while it was slow may land a moment later, so it
// polls for up to 2 s).
func (e *env) requireGone(t *testing.T, what, key string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		n := e.present(t, key)
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: lock key of %q still on %d node(s); want none", what, key, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// python is Debian's python3, which has python3-redis; a python3 earlier
// on PATH (pyenv, a venv) may not.
func python(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3"
	}
	harness.RequireBinary(t, "python3", "python3-redis")
	return "python3"
}

// runScript runs a client script in another language and fails the test
// with its output unless it exits 0 within the timeout.
func runScript(t *testing.T, timeout time.Duration, name string, args ...string) string {
	t.Helper()
	start := time.Now()
	p := harness.StartProc(t, name, args...)
	code, err := p.Wait(timeout)
	if err != nil || code != 0 {
		t.Fatalf("%s %v: exit %d, %v\n%s", name, args, code, err, p.Output())
	}
	t.Logf("%s %s: %v", filepath.Base(name), args[len(args)-1], time.Since(start).Round(time.Millisecond))
	return p.Output()
}

// withAndWithoutUpstream runs f as two parallel subtests, "no upstream"
// (lockproxy serving lock keys alone) and "upstream" (lockproxy in front
// of an upstream Redis as well), each on an env of its own; withUp says
// which.
func withAndWithoutUpstream(t *testing.T, f func(t *testing.T, e *env, withUp bool)) {
	t.Helper()
	for _, withUp := range []bool{false, true} {
		t.Run(map[bool]string{false: "no upstream", true: "upstream"}[withUp], func(t *testing.T) {
			t.Parallel()
			var e *env
			if withUp {
				e, _, _ = startWithUpstream(t)
			} else {
				e = start(t)
			}
			f(t, e, withUp)
		})
	}
}
