package clients

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
)

// env is one upstream redis-server and one lockproxy relaying to it.
type env struct {
	up    *harness.Redis
	proxy string // lockproxy's address
	lp    *harness.Proc
}

func start(t *testing.T, extra ...string) *env {
	t.Helper()
	return startWith(t, harness.RedisOptions{}, nil, extra...)
}

// startWith starts the upstream with opts and lockproxy with environ added
// to its environment.
func startWith(t *testing.T, opts harness.RedisOptions, environ []string, extra ...string) *env {
	t.Helper()
	harness.RequireBinary(t, "redis-server", "redis-server")
	up := harness.StartRedis(t, opts)
	bin := harness.BuildLockproxy(t)
	addr := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	args := append([]string{"--dev", "--listen", addr, "--admin", "", "--upstream", up.Addr}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), environ...)
	p := harness.StartCmd(t, cmd)
	if err := harness.WaitTCP(addr, 20*time.Second); err != nil {
		t.Fatalf("lockproxy did not listen: %v\n%s", err, p.Output())
	}
	return &env{up: up, proxy: addr, lp: p}
}

func (e *env) flush(t *testing.T) {
	t.Helper()
	c := e.up.Client(t)
	if err := c.FlushAll(context.Background()).Err(); err != nil {
		t.Fatalf("FLUSHALL on the upstream: %v", err)
	}
}

// results are a client's workload results, as JSON.
type results map[string]any

func parse(t *testing.T, what string, out []byte) results {
	t.Helper()
	var r results
	if err := json.Unmarshal(bytes.TrimSpace(lastLine(out)), &r); err != nil {
		t.Fatalf("%s: output is not JSON: %v\n%s", what, err, out)
	}
	return r
}

func lastLine(b []byte) []byte {
	b = bytes.TrimRight(b, "\n")
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		return b[i+1:]
	}
	return b
}

// runner runs the workload ("workload" or "lock") of one client against addr.
type runner func(t *testing.T, addr, mode string) results

func external(name string, args ...string) runner {
	return func(t *testing.T, addr, mode string) results {
		t.Helper()
		host, port, _ := strings.Cut(addr, ":")
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		full := append(append([]string{}, args...), host, port, mode)
		cmd := exec.CommandContext(ctx, name, full...)
		cmd.WaitDelay = 5 * time.Second
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(full, " "), err, out)
		}
		return parse(t, name, out)
	}
}

func here() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(file)
}

var npmOnce sync.Once
var npmErr error

// nodeReady installs the npm packages when node_modules is missing.
func nodeReady(t *testing.T) {
	t.Helper()
	harness.RequireBinary(t, "node", "nodejs")
	dir := filepath.Join(here(), "node")
	npmOnce.Do(func() {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", "ioredis")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "node_modules", "redis")); err == nil {
				return
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			npmErr = fmt.Errorf("npm ci in %s: %v\n%s", dir, err, out)
		}
	})
	if npmErr != nil {
		t.Fatal(npmErr)
	}
}

func pythonReady(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("/usr/bin/python3", "-c", "import redis").CombinedOutput(); err != nil {
		t.Fatalf("redis-py missing: install Debian's python3-redis (apt-get install python3-redis): %v\n%s", err, out)
	}
}

// TestClients runs each client's workload directly and through lockproxy
// and compares the results, then the lock commands and refusals.
func TestClients(t *testing.T) {
	e := start(t)
	node := filepath.Join(here(), "node", "workload.mjs")
	for _, tc := range []struct {
		name  string
		ready func(t *testing.T)
		run   runner
	}{
		{"go-redis/resp2", nil, goRedis(2)},
		{"go-redis/resp3", nil, goRedis(3)},
		{"redis-cli/resp2", nil, redisCLI(2)},
		{"redis-cli/resp3", nil, redisCLI(3)},
		{"redis-py/resp2", pythonReady, external("/usr/bin/python3", filepath.Join(here(), "py", "workload.py"))},
		{"ioredis/resp2", nodeReady, external("node", node, "ioredis", "2")},
		{"ioredis/resp3", nodeReady, external("node", node, "ioredis", "3")},
		{"node-redis/resp2", nodeReady, external("node", node, "node-redis", "2")},
		{"node-redis/resp3", nodeReady, external("node", node, "node-redis", "3")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.ready != nil {
				tc.ready(t)
			}
			e.flush(t)
			direct := tc.run(t, e.up.Addr, "workload")
			e.flush(t)
			proxied := tc.run(t, e.proxy, "workload")
			if !reflect.DeepEqual(direct, proxied) {
				for _, k := range keys(direct, proxied) {
					if !reflect.DeepEqual(direct[k], proxied[k]) {
						t.Errorf("%s: directly %v; through lockproxy %v", k, direct[k], proxied[k])
					}
				}
			}
			if len(direct) == 0 {
				t.Errorf("workload gave only %d results: %v", len(direct), direct)
			}
			lock := tc.run(t, e.proxy, "lock")
			checkLock(t, lock)
		})
	}
}

func keys(a, b results) []string {
	m := map[string]bool{}
	for k := range a {
		m[k] = true
	}
	for k := range b {
		m[k] = true
	}
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// checkLock checks the lock-mode results every client reports.
func checkLock(t *testing.T, r results) {
	t.Helper()
	want := map[string]func(any) bool{
		"locked":     func(v any) bool { return v == true },
		"held_again": func(v any) bool { return v == nil },
		"unlock":     func(v any) bool { return v == float64(1) },
		"reserved":   func(v any) bool { s, _ := v.(string); return strings.Contains(s, "reserved for lockproxy's locks") },
		"denied":     func(v any) bool { s, _ := v.(string); return strings.Contains(s, "'flushall' is denied") },
	}
	for k, ok := range want {
		if v, has := r[k]; !has || !ok(v) {
			t.Errorf("lock mode: %s = %v (present %v)", k, v, has)
		}
	}
	if v, has := r["lock_in_multi"]; has {
		if s, _ := v.(string); !strings.Contains(s, "not allowed inside MULTI") {
			t.Errorf("LOCK inside MULTI: %v; want the refusal", v)
		}
	}
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }
