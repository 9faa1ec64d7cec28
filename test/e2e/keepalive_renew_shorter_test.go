package e2e

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestRenewShorterThanKeepaliveLeaseKeepsLock proves that a RENEW … PX
// shorter than a KEEPALIVE lock's TTL does not leave the lock unkept: a
// RESP3 holder (PX 3000: renewed every second) sends RENEW key tok PX 300,
// which sets the lease to 300 ms; the watchdog renews within half of that,
// so no rival on another instance is granted the key while the holder,
// PINGing all along, is told of no loss. Before, the next renewal came up
// to a second later: the lease ran out ~300 ms after the RENEW, a rival
// was granted, and only then was the holder told it had lost the lock.
func TestRenewShorterThanKeepaliveLeaseKeepsLock(t *testing.T) {
	cl := startCluster(t, 3)
	inA := startSemInstance(t, cl)
	inB := startSemInstance(t, cl)
	key := "renew-shorter-" + lockclient.RandID()
	holder := lc.DialRaw(t, inA.addr)
	if r := holder.Do("HELLO", "3"); r.Kind != '%' {
		t.Fatalf("HELLO 3 = %v", r)
	}
	tok := rawGrant(t, holder, key, "PX", "3000", "KEEPALIVE")
	time.Sleep(100 * time.Millisecond)
	if r := holder.Do("RENEW", key, tok, "PX", "300"); r.Kind != ':' || r.Int <= 0 {
		t.Fatalf("RENEW = %v", r)
	}
	renewed := time.Now()
	rival := lc.DialRaw(t, inB.addr)
	for time.Since(renewed) < 2500*time.Millisecond {
		if r := holder.Do("PING"); r.Kind == '>' {
			t.Fatalf("holder told %v %v after its RENEW PX 300, while PINGing: want its KEEPALIVE lock kept",
				r, time.Since(renewed).Round(time.Millisecond))
		}
		if g := rival.Do("LOCK", key, "PX", "5000"); g.Pairs()["token"].Str != "" {
			t.Fatalf("rival granted %v after the holder's RENEW PX 300, while the holder (PINGing, KEEPALIVE) had not been told of any loss",
				time.Since(renewed).Round(time.Millisecond))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r := holder.Do("UNLOCK", key, tok); r.Int != 1 {
		t.Errorf("UNLOCK = %v; want :1 (the lock kept)", r)
	}
}
