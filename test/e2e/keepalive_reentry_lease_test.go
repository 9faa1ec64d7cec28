package e2e

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestKeepaliveReentryKeepsEarlierHoldsLease: a client holds a lock
// without KEEPALIVE on connection A (LOCK k PX 4000 TOKEN t, or RLOCK),
// then takes it again, of the same kind and with the same token, on
// connection B with KEEPALIVE and a shorter TTL (… PX 600 TOKEN t
// KEEPALIVE): a reentry, which "extends the lease to at least the new
// TTL … never shortening it: … must leave the holder the lease it was
// told of" (README, Reentrancy). B's watchdog counts only B's hold and
// leaves A's alone when B ends (UNLOCK or close), but its renewals reset
// the lease of the token's holds of that kind to 600 ms on the nodes. So
// once B is gone, A's hold, told about 4 s, runs out about 0.6 s after
// B's last renewal and a rival writer through another instance is granted
// the key while A still relies on it. This is the same-kind case of
// TestKeepaliveReadHoldLeavesWriteHold, which only covers a downgrade.
func TestKeepaliveReentryKeepsEarlierHoldsLease(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cmd  string // A's and B's command: LOCK or RLOCK
		end  string // how B ends: "close" or "unlock"
		// bFirst: B's KEEPALIVE hold is taken first and A's plain one
		// joins its watchdog (a loose hold, which "keeps the lease it
		// has" when the last KEEPALIVE hold is UNLOCKed).
		bFirst bool
	}{
		{"write, B closes", "LOCK", "close", false},
		{"write, B UNLOCKs", "LOCK", "unlock", false},
		{"read, B closes", "RLOCK", "close", false},
		{"write, A joins B's watchdog, B UNLOCKs", "LOCK", "unlock", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cl := startCluster(t, 3)
			inA := startSemInstance(t, cl)
			inB := startSemInstance(t, cl)
			a := lc.NewClient(t, inA.addr, 3)
			other := lc.NewClient(t, inB.addr, 3)
			key := "reentry-lease-" + lockclient.RandID()
			tok := "t-" + lockclient.RandID()

			b := lc.DialRaw(t, inA.addr)
			bLock := func() {
				t.Helper()
				if r := b.Do(tc.cmd, key, "PX", "600", "TOKEN", tok, "KEEPALIVE"); r.Kind != '*' && r.Kind != '%' {
					t.Fatalf("B's %s … KEEPALIVE = %v; want a grant", tc.cmd, r)
				}
			}
			if tc.bFirst {
				bLock()
			}
			g := lc.MustAcquire(t, a, tc.cmd, key, "PX", 4000, "TOKEN", tok)
			// The validity counts from the reply, which is no later than now.
			end := time.Now().Add(time.Duration(g.ValidityMS) * time.Millisecond)
			if !tc.bFirst {
				bLock()
			}
			// Let B's watchdog renew a few times (every 200 ms).
			for stop := time.Now().Add(700 * time.Millisecond); time.Now().Before(stop); time.Sleep(100 * time.Millisecond) {
				if r := b.Do("PING"); r.Str != "PONG" {
					t.Fatalf("PING on B = %v", r)
				}
			}
			pttls := cl.nodePTTLs(t, key)
			switch tc.end {
			case "close":
				_ = b.Conn.Close()
			case "unlock":
				if r := b.Do("UNLOCK", key, tok); r.Kind != ':' || r.Int != 1 {
					t.Fatalf("B's UNLOCK = %v; want :1", r)
				}
			}
			ended := time.Now()
			// Up to just before A's validity ends no writer may get the key.
			for i := 0; time.Until(end) > 150*time.Millisecond; i++ {
				if i > 100 {
					t.Fatal("more than 100 rounds")
				}
				if w, ok := lc.Lock(t, other, key, "PX", 5000); ok {
					t.Fatalf("writer granted (fence %d) through the other instance %v after B ended (%s), %v before the end of A's validity of %d ms; the lock key's PTTL on the nodes was %v ms when B ended, %v ms left of A's validity",
						w.Fence, time.Since(ended).Round(time.Millisecond), tc.end, time.Until(end).Round(time.Millisecond),
						g.ValidityMS, pttls, end.Sub(ended).Milliseconds())
				}
				time.Sleep(100 * time.Millisecond)
			}
			if got := lc.Unlock(t, a, key, tok); got != 1 {
				t.Errorf("A's UNLOCK = %d; want 1 (A's hold, still within its validity)", got)
			}
		})
	}
}

// TestUnlockOfPlainHoldKeepsOtherConnectionsKeepalive: a client holds a
// lock without KEEPALIVE on connection A (LOCK k PX 5000 TOKEN t) and
// takes it again with KEEPALIVE on connection B (LOCK k PX 600 TOKEN t
// KEEPALIVE): two holds on the nodes, of which B's watchdog counts B's
// only. A then UNLOCKs its own hold (one hold left on the nodes: B's).
// B's lock must stay kept alive while B talks, or B must at least be told
// (the lock-lost push, -LOCKLOST). Before, endUnlock, finding no hold of
// A's to take off, took B's KEEPALIVE hold off ("last another
// connection's"), which stopped B's watchdog without a word: B's hold ran
// out (at the end of the lease its reentry set, or 0.6 s after one of its
// renewals) and a writer through another instance got the key
// while B, PINGing all along, was never told.
func TestUnlockOfPlainHoldKeepsOtherConnectionsKeepalive(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	inA := startSemInstance(t, cl)
	inB := startSemInstance(t, cl)
	a := lc.NewClient(t, inA.addr, 3)
	other := lc.NewClient(t, inB.addr, 3)
	key := "unlock-plain-" + lockclient.RandID()
	tok := "t-" + lockclient.RandID()

	lc.MustLock(t, a, key, "PX", 5000, "TOKEN", tok)
	b := lc.DialRaw(t, inA.addr)
	if r := b.Do("HELLO", "3"); r.Kind != '%' {
		t.Fatalf("HELLO 3 = %v; want a map", r)
	}
	if r := b.Do("LOCK", key, "PX", "600", "TOKEN", tok, "KEEPALIVE"); r.Kind != '%' {
		t.Fatalf("B's LOCK … KEEPALIVE (a reentry) = %v; want a grant", r)
	}
	granted := time.Now()
	if got := lc.Unlock(t, a, key, tok); got != 1 {
		t.Fatalf("A's UNLOCK = %d; want 1", got)
	}
	unlocked := time.Now()
	// B talks past the end of the lease A's grant set (5 s) and more than
	// three of its own leases after; no writer may get the key unless B
	// was told its lock is lost.
	for i := 0; time.Since(granted) < 6500*time.Millisecond; i++ {
		if i > 200 {
			t.Fatal("more than 200 rounds")
		}
		r := b.Do("PING")
		if r.Kind == '>' {
			t.Logf("B was told %v after %v", r, time.Since(unlocked).Round(time.Millisecond))
			return
		}
		if r.Str != "PONG" {
			t.Fatalf("PING on B = %v", r)
		}
		if i%2 == 0 {
			if w, ok := lc.Lock(t, other, key, "PX", 5000); ok {
				lost := b.Do("LOCK", key, "PX", "600", "TOKEN", tok, "KEEPALIVE")
				t.Fatalf("writer granted (fence %d) through the other instance %v after A's UNLOCK while B, PINGing all along with its KEEPALIVE hold, was never told (no push; B's next LOCK = %v)",
					w.Fence, time.Since(unlocked).Round(time.Millisecond), lost)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if r := b.Do("UNLOCK", key, tok); r.Kind != ':' || r.Int != 1 {
		t.Errorf("B's UNLOCK after 6.5 s = %v; want :1 (B's KEEPALIVE hold, kept alive)", r)
	}
}

// TestKeepaliveMaxHoldOfJoiningHold: connection A holds a lock with
// KEEPALIVE and no MAXHOLD; connection B takes it with the same token,
// KEEPALIVE and MAXHOLD 1000, and A then UNLOCKs its hold. B's hold is the
// only one left, and B asked for it to end at MAXHOLD ("use MAXHOLD ms to
// cap the whole hold", README): a rival must get the key about one lease
// after B's MAXHOLD, while B keeps PINGing. Before, B's grant joined A's
// watchdog, which has no MAXHOLD, and B's MAXHOLD was dropped without a
// word: the lock was renewed for as long as B talked.
func TestKeepaliveMaxHoldOfJoiningHold(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	in := startSemInstance(t, cl)
	other := lc.NewClient(t, in.addr, 3)
	key := "maxhold-join-" + lockclient.RandID()
	tok := "t-" + lockclient.RandID()

	a := lc.DialRaw(t, in.addr)
	if r := a.Do("LOCK", key, "PX", "600", "TOKEN", tok, "KEEPALIVE"); r.Kind != '*' && r.Kind != '%' {
		t.Fatalf("A's LOCK … KEEPALIVE = %v; want a grant", r)
	}
	b := lc.DialRaw(t, in.addr)
	if r := b.Do("LOCK", key, "PX", "600", "TOKEN", tok, "KEEPALIVE", "MAXHOLD", "1000"); r.Kind != '*' && r.Kind != '%' {
		t.Fatalf("B's LOCK … KEEPALIVE MAXHOLD 1000 = %v; want a grant", r)
	}
	granted := time.Now()
	if r := a.Do("UNLOCK", key, tok); r.Kind != ':' || r.Int != 1 {
		t.Fatalf("A's UNLOCK = %v; want :1", r)
	}
	// MAXHOLD (1 s) plus one lease (0.6 s) plus slack: by 3.5 s the key
	// must be free although B talks all along.
	for i := 0; ; i++ {
		if i > 100 {
			t.Fatal("more than 100 rounds")
		}
		if r := b.Do("PING"); r.Kind != '+' && r.Kind != '-' {
			// A RESP2 connection gets no push; -LOCKLOST comes on a lock command.
			t.Fatalf("PING on B = %v", r)
		}
		if _, ok := lc.Lock(t, other, key, "PX", 1000); ok {
			t.Logf("the key was free %v after B's grant with MAXHOLD 1000", time.Since(granted).Round(time.Millisecond))
			return
		}
		if time.Since(granted) > 3500*time.Millisecond {
			t.Fatalf("the key is still held %v after B's grant with MAXHOLD 1000 (A UNLOCKed its hold; B's is the only one left), B PINGing", time.Since(granted).Round(time.Millisecond))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
