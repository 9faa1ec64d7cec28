package transparent

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
)

// TestRedisSemaphoreIORedis runs redis-semaphore's Mutex on ioredis (npm,
// RESP3 by default), unmodified, through transparent mode: acquire,
// contention, refresh past the lock timeout, release, expiry, blocking
// acquire, a shared counter under the lock, one node killed, a majority
// down.
func TestRedisSemaphoreIORedis(t *testing.T) {
	t.Parallel()
	harness.RequireBinary(t, "node", "nodejs")
	dir, err := filepath.Abs("node")
	if err != nil {
		t.Fatal(err)
	}
	installNodeModules(t, dir)
	e := start(t)
	up := func(skip int) string {
		var ps []string
		for _, n := range e.nodes[skip:] {
			ps = append(ps, fmt.Sprint(n.Port))
		}
		return strings.Join(ps, ",")
	}
	script := filepath.Join(dir, "semaphore_lock.js")
	runScript(t, 60*time.Second, "node", script, e.port(), up(0), "workflow")
	runScript(t, 60*time.Second, "node", script, e.port(), up(0), "counter")
	e.nodes[0].Kill()
	runScript(t, 60*time.Second, "node", script, e.port(), up(1), "one-down")
	e.nodes[1].Kill()
	runScript(t, 60*time.Second, "node", script, e.port(), up(2), "majority-down")
}

// installNodeModules runs npm ci in dir when its node_modules is missing
// (make test's install step normally did it already).
func installNodeModules(t *testing.T, dir string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "redis-semaphore")); err == nil {
		return
	}
	harness.RequireBinary(t, "npm", "npm")
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	p := harness.StartCmd(t, cmd)
	if code, err := p.Wait(3 * time.Minute); err != nil || code != 0 {
		t.Fatalf("npm ci in %s: exit %d, %v\n%s", dir, code, err, p.Output())
	}
}
