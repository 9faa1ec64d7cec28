package e2e

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestLostNoticeLeavesUnlockOfAnotherToken proves that the lost-lock
// notice of one token does not answer (and swallow) an UNLOCK of the same
// key with another token. A client's pool: connection A held key with
// KEEPALIVE (token t1) and lost it (idle; under RESP2 no push is seen).
// The client takes key again through connection B with KEEPALIVE (token
// t2) and releases it through A: UNLOCK key t2 must run and answer 1, and
// the key be free although B lives on; A's notice is still given to A's
// UNLOCK key t1. Before, the notice was kept by key: UNLOCK key t2 answered
// -LOCKLOST for t1's loss and was not run, and t2's lock stayed, renewed
// by B's watchdog for as long as B lived.
func TestLostNoticeLeavesUnlockOfAnotherToken(t *testing.T) {
	cl := startCluster(t, 3)
	in := startInstanceEnv(t, cl.addrs(), []string{"LOCKPROXY_LOCKS_KEEPALIVE_IDLE=300ms", slowHostNodeTimeout})
	key := "notice-token-" + lockclient.RandID()
	a := lc.DialRaw(t, in.addr)
	t1 := rawGrant(t, a, key, "PX", "600", "KEEPALIVE")
	time.Sleep(1500 * time.Millisecond) // A silent: lost (idle), its lease runs out
	b := lc.DialRaw(t, in.addr)
	t2 := rawGrant(t, b, key, "PX", "600", "KEEPALIVE", "WAIT", "3000")
	if r := a.Do("UNLOCK", key, t2); r.Kind != ':' || r.Int != 1 {
		t.Errorf("UNLOCK %s t2 through A = %v; want :1 (t2's hold, not the lock A lost)", key, r)
	}
	for i := 0; i < 15; i++ {
		if p := b.Do("PING"); p.Str != "PONG" {
			t.Fatalf("PING on B = %v", p)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := cl.holders(t, key, t2); n >= 2 {
		t.Errorf("1.5 s after its holder sent UNLOCK %s t2, t2 still holds it on %d of 3 nodes (kept by B's watchdog while B lives)", key, n)
	}
	if r := a.Do("UNLOCK", key, t1); r.Kind != '-' || len(r.Str) < 8 || r.Str[:8] != "LOCKLOST" {
		t.Errorf("UNLOCK %s t1 through A = %v; want -LOCKLOST (t1's notice, kept)", key, r)
	}
}
