package zk

import (
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestKeepaliveRefusedThroughOtherInstance: a reentry through an instance
// other than the one whose session holds the lock node promises nothing
// (validity_ms 1), and that instance cannot keep the lease alive either
// (its renewals promise nothing), so LOCK … TOKEN t KEEPALIVE there, or
// LOCK … TOKEN t without PX/EX, which implies KEEPALIVE, is refused with
// an error and leaves no hold. Before, it was granted with validity_ms 1,
// and the watchdog's first renewal, due at once with its deadline already
// past, failed: the client was told the lock was lost right after the
// grant, while the hold stayed in the node.
func TestKeepaliveRefusedThroughOtherInstance(t *testing.T) {
	// Parallel: it leaves the ensemble alone (a root and instances of
	// its own). Parallel tests start once every serial one has ended, so
	// never beside those that stop, kill or cut off servers.
	t.Parallel()
	root := newRoot(t)
	a := startInstance(t, zkServers(), root)
	b := startInstance(t, zkServers(), root)
	key := "ka-elsewhere-" + lockclient.RandID()
	const token = "T"

	ca := lc.DialRaw(t, a.addr)
	if r := ca.Do("LOCK", key, "PX", "30000", "TOKEN", token); r.Kind != '*' {
		t.Fatalf("LOCK through the first instance = %v", r)
	}
	cb := lc.DialRaw(t, b.addr)
	for _, args := range [][]string{
		{"LOCK", key, "TOKEN", token, "PX", "30000", "KEEPALIVE"},
		{"LOCK", key, "TOKEN", token}, // KEEPALIVE implied
	} {
		r := cb.Do(args...)
		if r.Kind != '-' || !strings.HasPrefix(r.Str, "ERR ") || !strings.Contains(r.Str, "KEEPALIVE") {
			time.Sleep(500 * time.Millisecond)
			next := cb.Do("RENEW", key, token, "PX", "30000")
			t.Fatalf("%v through the other instance = %v (then RENEW = %v); want -ERR refusing KEEPALIVE", args, r, next)
		}
		t.Logf("%v through the other instance = %v", args, r)
	}
	// The refusals left no hold: the token's one UNLOCK frees the key.
	if r := cb.Do("UNLOCK", key, token); r.Kind != ':' || r.Int != 1 {
		t.Fatalf("UNLOCK of the first grant = %v; want :1", r)
	}
	if r := ca.Do("LOCK", key, "PX", "5000", "TOKEN", "RIVAL"); r.Kind != '*' {
		t.Fatalf("a rival's LOCK after the only hold's UNLOCK = %v; want a grant", r)
	}
}
