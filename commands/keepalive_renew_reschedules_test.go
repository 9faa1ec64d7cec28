package commands

import (
	"testing"
	"time"
)

// TestRenewOfKeptLockReschedulesWatchdog proves that a RENEW of a key and
// token a watchdog keeps brings its next renewal within half the validity
// the RENEW answered: RENEW sets the lease, and RENEW … PX 300 on a lock
// kept with PX 3000 (renewed every second) leaves it 300 ms. Before, the
// watchdog renewed at its next scheduled renewal, up to a second later,
// after that lease had run out.
func TestRenewOfKeptLockReschedulesWatchdog(t *testing.T) {
	b := &fakeBackend{}
	k := newTestKeepalives(t, b, time.Minute)
	c := newTestConn(t, 3)
	if !k.start(c.ctx, c.ka, "k", "tok", 3*time.Second, 0) {
		t.Fatal("start = false")
	}
	time.Sleep(100 * time.Millisecond)
	renewed := time.Now()
	k.toldRenewal("k", "tok", renewed, 300*time.Millisecond)
	waitFor(t, func() bool { r, _ := b.counts(); return len(r) > 0 }, "a renewal")
	r, _ := b.counts()
	// Within half the RENEW's validity (150 ms), with room for a loaded host.
	if d := r[0].at.Sub(renewed); d > 250*time.Millisecond {
		t.Errorf("first renewal %v after a RENEW that answered 300 ms of validity; want within ~150 ms", d.Round(time.Millisecond))
	}
	if len(c.pushed()) != 0 {
		t.Errorf("pushes %q; want none", c.pushed())
	}
}
