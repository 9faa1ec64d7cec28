package commands

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestUnlockOfUncountedHold: connection a holds k with token t without
// KEEPALIVE, and b takes it again with KEEPALIVE: b's grant starts the
// watchdog, which counts b's hold only, and its reply says the token holds
// two. a's UNLOCK (a has no hold the watchdog counts) then released the
// hold the watchdog knows it does not count: b's lock stays kept, and b
// is told nothing. When the reply did not show such a hold, the watchdog
// cannot tell a's hold from b's: it takes b's off, and b, whose lock it no
// longer keeps, is told (the notice and the push) rather than left relying
// on a lock nobody renews. Before, endUnlock took b's hold in both cases
// and stopped the watchdog without a word.
func TestUnlockOfUncountedHold(t *testing.T) {
	const ttl = 600 * time.Millisecond
	for _, tc := range []struct {
		name  string
		holds int64 // the token's holds b's grant reply told
		kept  bool  // b's lock still kept after a's UNLOCK
	}{
		{"the reply shows a's hold", 2, true},
		{"the reply shows b's only", 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fb := &fakeBackend{}
			k := newTestKeepalives(t, fb, time.Second)
			a, b := newTestConn(t, 3), newTestConn(t, 3)
			now := time.Now()
			if !k.startGrant(b.ctx, b.ka, "k", "t", ttl, 0, backends.Write, true,
				grantTiming{sent: now, validity: ttl, begun: now, holds: tc.holds}) {
				t.Fatal("startGrant = false")
			}
			k.endUnlock(k.beginUnlock("k", "t"), true, a.ka)
			if n := k.count(); (n == 1) != tc.kept {
				t.Fatalf("count after a's UNLOCK = %d; want b's lock kept: %v", n, tc.kept)
			}
			why, lost := b.ka.takeLost([]byte("k"))
			if lost == tc.kept || (lost && !strings.Contains(why, "UNLOCK")) {
				t.Errorf("b's notice = %q, %v; want one about the UNLOCK: %v", why, lost, !tc.kept)
			}
			if p := b.pushed(); len(p) != map[bool]int{true: 0, false: 1}[tc.kept] {
				t.Errorf("b's pushes = %q; want one only when its lock is no longer kept", p)
			}
			if got, want := counterValue(t, k.lost[lostUnlocked]), map[bool]float64{true: 0, false: 1}[tc.kept]; got != want {
				t.Errorf("lockproxy_lock_lost_total{reason=\"unlocked\"} = %v; want %v", got, want)
			}
			if _, lost := a.ka.takeLost([]byte("k")); lost {
				t.Error("a told of a loss; want nothing: it released its own hold")
			}
			if tc.kept {
				renews, _ := fb.counts()
				waitFor(t, func() bool { r, _ := fb.counts(); return len(r) >= len(renews)+2 }, "b's lock renewed")
				k.endUnlock(k.beginUnlock("k", "t"), true, b.ka)
				if n := k.count(); n != 0 {
					t.Errorf("count after b's UNLOCK = %d; want 0", n)
				}
			}
		})
	}
}

// TestMaxHoldOfJoiningGrant: a's KEEPALIVE lock (no MAXHOLD) is joined by
// b's KEEPALIVE grant with MAXHOLD: the earlier deadline ends the lock for
// both, each told as MAXHOLD's end is told, from then on (not at the next
// renewal). The renewals after the join ask for no lease past it, and
// those before asked for one past it: at the deadline the watchdog
// releases a's and b's KEEPALIVE holds (their told validities over), so
// the lock ends then, and leaves the loose hold (taken without
// KEEPALIVE), whose holder was told a lease of its own. Before, b's
// MAXHOLD was dropped: the lock was renewed for as long as a talked.
func TestMaxHoldOfJoiningGrant(t *testing.T) {
	const ttl = 300 * time.Millisecond
	const maxHold = 100 * time.Millisecond
	fb := &fakeBackend{}
	k := newTestKeepalives(t, fb, time.Second)
	a, b := newTestConn(t, 3), newTestConn(t, 3)
	if !k.startHold(a.ctx, a.ka, "k", "t", ttl, 0, backends.Write, true) {
		t.Fatal("startHold = false")
	}
	waitFor(t, func() bool { r, _ := fb.counts(); return len(r) >= 3 }, "three renewals")
	k.grantedHold(t.Context(), nil, "k", "t", backends.Write, true) // loose
	joined := time.Now()
	if !k.grantedGrant(b.ctx, b.ka, "k", "t", backends.Write, true, ttl, maxHold,
		grantTiming{sent: joined, validity: maxHold / 2, begun: joined, holds: 3}) {
		t.Fatal("grantedGrant = false")
	}
	deadline := joined.Add(maxHold)
	ended := waitEnded(t, a)
	waitStopped(t, k)
	if ended.Before(deadline) || ended.After(deadline.Add(ttl/3)) {
		t.Errorf("ended %v after b's grant; want at its MAXHOLD of %v, before the next renewal was due", ended.Sub(joined), maxHold)
	}
	renews, _ := fb.counts()
	for _, r := range renews {
		if r.at.After(joined) && r.at.Add(r.ttl).After(deadline.Add(5*time.Millisecond)) {
			t.Errorf("renewal at +%v after b's grant for %v outlasts its MAXHOLD", r.at.Sub(joined), r.ttl)
		}
	}
	if got := counterValue(t, k.lost[lostMaxHold]); got != 1 {
		t.Errorf("lockproxy_lock_lost_total{reason=\"maxhold\"} = %v; want 1", got)
	}
	for name, c := range map[string]*testConn{"a": a, "b": b} {
		why, lost := c.ka.takeLost([]byte("k"))
		if !lost || !strings.Contains(why, "MAXHOLD of 100 ms") || len(c.pushed()) != 1 {
			t.Errorf("%s: notice %q, %v, pushes %q; want b's MAXHOLD's notice and one push", name, why, lost, c.pushed())
		}
	}
	if _, unlocks := fb.kinds(); !slices.Equal(unlocks, []string{"write", "write"}) {
		t.Errorf("releases %q; want a's and b's write holds, not the loose one", unlocks)
	}
}
