package transparent

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRedisPyLock runs redis-py's Lock from Debian's python3-redis,
// unmodified, through transparent mode: acquire, contention, extend,
// reacquire, release, locked/owned, expiry, blocking acquire, a shared
// counter under the lock, one node killed, a majority down.
func TestRedisPyLock(t *testing.T) {
	t.Parallel()
	py := python(t)
	script, err := filepath.Abs("python/redispy_lock.py")
	if err != nil {
		t.Fatal(err)
	}
	e := start(t)
	up := func(skip int) string {
		var ps []string
		for _, n := range e.nodes[skip:] {
			ps = append(ps, fmt.Sprint(n.Port))
		}
		return strings.Join(ps, ",")
	}
	runScript(t, 60*time.Second, py, script, e.port(), up(0), "workflow")
	runScript(t, 60*time.Second, py, script, e.port(), up(0), "counter")
	e.nodes[0].Kill()
	runScript(t, 60*time.Second, py, script, e.port(), up(1), "one-down")
	e.nodes[1].Kill()
	runScript(t, 60*time.Second, py, script, e.port(), up(2), "majority-down")
}
