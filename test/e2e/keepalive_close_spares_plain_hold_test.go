package e2e

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestPlainHoldKeepsToldLeaseWhenKeepaliveHolderCloses proves that a plain
// hold (no KEEPALIVE) of a token keeps the validity its holder was told
// when another connection's KEEPALIVE hold of the same token ends with
// its connection. Connection A holds key with TOKEN t and KEEPALIVE;
// connection C (alive: a pool, or a reentrant caller) takes LOCK key PX
// 20000 TOKEN t and is told a validity of ~20 s; A closes. No rival may
// be granted within C's validity, and C's UNLOCK still finds its hold.
// Before, the watchdog C's hold had joined released it with A's on A's
// close, and a rival through another instance got the key at once.
func TestPlainHoldKeepsToldLeaseWhenKeepaliveHolderCloses(t *testing.T) {
	cl := startCluster(t, 3)
	inA := startSemInstance(t, cl)
	inB := startSemInstance(t, cl)
	key := "close-spares-plain-" + lockclient.RandID()
	tok := "t-" + lockclient.RandID()

	a := lc.DialRaw(t, inA.addr)
	rawGrant(t, a, key, "PX", "600", "TOKEN", tok, "KEEPALIVE")
	c := lc.DialRaw(t, inA.addr)
	r := c.Do("LOCK", key, "PX", "20000", "TOKEN", tok)
	v := r.Pairs()["validity_ms"]
	if v.Int < 15000 {
		t.Fatalf("C's plain reentrant LOCK PX 20000 = %v; want a grant with validity ~20 s", r)
	}
	told := time.Now()
	_ = a.Conn.Close()
	rival := lc.DialRaw(t, inB.addr)
	// A's lease (600 ms) has run out by the last try: only C's hold is left.
	for _, at := range []time.Duration{300 * time.Millisecond, 1500 * time.Millisecond} {
		time.Sleep(time.Until(told.Add(at)))
		if g := rival.Do("LOCK", key, "PX", "5000"); g.Pairs()["token"].Str != "" {
			t.Fatalf("rival granted %v after A closed, within the %d ms validity C (alive, no UNLOCK) was told for its plain hold: %v",
				time.Since(told).Round(time.Millisecond), v.Int, g)
		}
	}
	if r := c.Do("UNLOCK", key, tok); r.Int != 1 {
		t.Errorf("C's UNLOCK of its plain hold = %v; want :1", r)
	}
}
