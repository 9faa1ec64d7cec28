package e2e

import (
	"strconv"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestKeepaliveReadHoldLeavesWriteHold: a client takes a write lock
// without KEEPALIVE on connection A (LOCK k PX 4000 TOKEN t) and
// downgrades on connection B with KEEPALIVE (RLOCK k PX 600 TOKEN t
// KEEPALIVE), then closes B. B's watchdog keeps only the read hold: its
// renewals must not cut the write lease on the nodes to the read TTL,
// and B's close must release the read hold, not the write hold, which A
// was told it holds for its whole validity and which is not tied to B.
// Before, each renewal reset the lock key's PX to about 600 ms, and the
// close released the write hold first, so a writer through the other
// instance got the key about 0.6 s after B closed, some 2 s into A's 4 s
// validity.
func TestKeepaliveReadHoldLeavesWriteHold(t *testing.T) {
	cl := startCluster(t, 3)
	inA := startSemInstance(t, cl)
	inB := startSemInstance(t, cl)
	a := lc.NewClient(t, inA.addr, 3)
	other := lc.NewClient(t, inB.addr, 3)
	key := "holdkind-" + lockclient.RandID()
	tok := "t-" + lockclient.RandID()

	w := lc.MustLock(t, a, key, "PX", 4000, "TOKEN", tok)
	// The validity counts from the reply, which is no later than now.
	writeEnd := time.Now().Add(time.Duration(w.ValidityMS) * time.Millisecond)

	b := lc.DialRaw(t, inA.addr)
	r := b.Do("RLOCK", key, "PX", "600", "TOKEN", tok, "KEEPALIVE")
	if r.Kind != '*' && r.Kind != '%' {
		t.Fatalf("RLOCK … KEEPALIVE (the downgrade) = %v; want a grant", r)
	}

	// While B's watchdog renews the read hold (every 200 ms), the lock
	// key, which carries the write hold, must live on a majority of nodes
	// at least as long as A's validity has left.
	told := map[string]bool{} // one error per phase
	checkLease := func(when string) {
		if time.Until(writeEnd) <= 0 || told[when] {
			return
		}
		// Each node's expiry counted from just before its own read (an
		// expiry no later than the node's): one "validity left" taken
		// before all three reads charged the later nodes with the earlier
		// reads' time, which on a loaded host went past the drift margin.
		ends := cl.nodeExpiries(t, key)
		above := 0
		for _, e := range ends {
			if !e.Before(writeEnd.Add(-time.Millisecond)) {
				above++
			}
		}
		if above < len(ends)/2+1 {
			told[when] = true
			var left []string
			for _, e := range ends {
				left = append(left, e.Sub(writeEnd).Round(time.Millisecond).String())
			}
			t.Errorf("%s: the lock key's expiry on the nodes is %v from the end of A's write validity; want a majority at or after it", when, left)
		}
	}
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		checkLease("while B's watchdog renews the read hold")
	}

	_ = b.Conn.Close()
	closed := time.Now()
	// Up to just before A's validity ends, no writer may get the key: not
	// through the other instance, and not after B's read hold is gone.
	for time.Until(writeEnd) > 150*time.Millisecond {
		if g, ok := lc.Lock(t, other, key, "PX", 5000); ok {
			t.Fatalf("writer granted (fence %d) through the other instance %v after B closed, %v before the end of A's write validity of %d ms",
				g.Fence, time.Since(closed).Round(time.Millisecond), time.Until(writeEnd).Round(time.Millisecond), w.ValidityMS)
		}
		checkLease("after B closed")
		time.Sleep(100 * time.Millisecond)
	}
	// A still holds its write lock, and UNLOCK releases it.
	if got := lc.Unlock(t, a, key, tok); got != 1 {
		t.Errorf("A's UNLOCK after B closed = %d; want 1 (the write hold A was granted, still held: %s ms left)",
			got, strconv.FormatInt(time.Until(writeEnd).Milliseconds(), 10))
	}
}
