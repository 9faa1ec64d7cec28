package commands

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// TestUnlockOfUncountedHold: connection b takes k with token t and
// KEEPALIVE: b's grant starts the watchdog, which counts b's hold only,
// and its reply says how many holds the token has (2 when a held k with t
// without KEEPALIVE before). Connection a, which has no hold the watchdog
// counts, then UNLOCKs k with t. Whose hold that released the lock store
// tells, asked after the release how many holds the token has left: as
// many as the watchdog counts (b's), and the one released was a's: b's
// lock stays kept, and b is told nothing; fewer, and it was b's own, the
// token's release of its own lock (a client's pool UNLOCKs through one
// connection what it locked on another): the watchdog stops without a
// word, as a lock its holder released. So even when the reply's count was
// wrong (a's hold released before b's grant counted it on its way). Only
// when the lock store cannot answer is the reply's count used: a hold the
// watchdog knows it does not count is taken for the one released, and
// without one b's hold is taken off and b told (the notice, the push, the
// `unlocked` loss) rather than left relying on a lock nobody renews.
// Before 9201c06 endUnlock took b's hold in every case and stopped the
// watchdog without a word; since, until the lock store was asked, b was
// told its lock was lost when its own token released it.
func TestUnlockOfUncountedHold(t *testing.T) {
	const ttl = 600 * time.Millisecond
	heldBy := func(tok string, n int64) backends.LockInfo {
		return backends.LockInfo{Mode: backends.Write, Holders: []backends.Holder{{Token: tok, Holds: n}}}
	}
	for _, tc := range []struct {
		name    string
		holds   int64 // the token's holds b's grant reply told
		info    backends.LockInfo
		held    bool  // the lock store shows k held
		infoErr error // the lock store cannot answer
		kept    bool  // b's lock still kept after a's UNLOCK
		told    bool  // b told its lock is lost
	}{
		{name: "the reply shows a's hold; b's is left", holds: 2, info: heldBy("t", 1), held: true, kept: true},
		{name: "the reply shows a's hold; none is left", holds: 2},
		{name: "the reply shows a's hold; the lock store cannot tell", holds: 2, infoErr: quorum.ErrNoQuorum, kept: true},
		{name: "the reply shows b's only; b's is left", holds: 1, info: heldBy("t", 1), held: true, kept: true},
		{name: "the reply shows b's only; none is left", holds: 1},
		{name: "the reply shows b's only; another token holds k", holds: 1, info: heldBy("other", 1), held: true},
		{name: "the reply shows b's only; the lock store cannot tell", holds: 1, infoErr: quorum.ErrNoQuorum, told: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fb := &infoBackend{info: tc.info, held: tc.held, infoErr: tc.infoErr}
			k := newTestKeepalives(t, fb, time.Second)
			a, b := newTestConn(t, 3), newTestConn(t, 3)
			now := time.Now()
			if !k.startGrant(b.ctx, b.ka, "k", "t", ttl, 0, backends.Write, true,
				grantTiming{sent: now, validity: ttl, begun: now, holds: tc.holds}) {
				t.Fatal("startGrant = false")
			}
			k.endUnlock(k.beginUnlock("k", "t"), true, a.ka)
			if n := fb.asked.Load(); n != 1 {
				t.Errorf("lock store asked %d times after a's UNLOCK; want once", n)
			}
			if n := k.count(); (n == 1) != tc.kept {
				t.Fatalf("count after a's UNLOCK = %d; want b's lock kept: %v", n, tc.kept)
			}
			why, lost := b.ka.takeLost([]byte("k"))
			if lost != tc.told || (lost && !strings.Contains(why, "UNLOCK")) {
				t.Errorf("b's notice = %q, %v; want one about the UNLOCK: %v", why, lost, tc.told)
			}
			if p := b.pushed(); len(p) != map[bool]int{true: 1, false: 0}[tc.told] {
				t.Errorf("b's pushes = %q; want one only when b is told", p)
			}
			if got, want := counterValue(t, k.lost[lostUnlocked]), map[bool]float64{true: 1, false: 0}[tc.told]; got != want {
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
				if n := fb.asked.Load(); n != 1 {
					t.Errorf("lock store asked %d times after b's own UNLOCK; want once (for a's only)", n)
				}
			}
			if _, unlocks := fb.counts(); unlocks != 0 {
				t.Errorf("%d releases by the watchdog; want none (the UNLOCKs released the holds)", unlocks)
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
