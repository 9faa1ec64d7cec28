package commands

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestPendingPooledUnlockNotReleasedAgainByEndingWatchdog: connection B
// holds k twice with KEEPALIVE; the client's pool releases both through A1
// and A2 at once (both land on the real nodes), so A1's endUnlock leaves
// its UNLOCK pending (watchdog.pending) while A2's is in flight. Then B's
// connection closes (the watchdog is ending, waiting for A2), and D, on
// the same pool, takes k again with the token without KEEPALIVE (the key
// is free). A2's endUnlock takes its hold off the ending watchdog's
// counts, but A1's pending one is never settled: the watchdog still counts
// one of B's holds, which the client released, and its release takes D's
// hold instead. D was told a lease, and the key is free under it. Before
// db5b937 A1 asked the nodes (none left, fewer than B's two less the one
// in flight) and took B's hold off at once.
func TestPendingPooledUnlockNotReleasedAgainByEndingWatchdog(t *testing.T) {
	const ttl = 2 * time.Second
	be := newRealRedLock(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	k := newTestKeepalives(t, be, time.Minute)
	b, a1, a2 := newTestConn(t, 3), newTestConn(t, 3), newTestConn(t, 3)
	const key, tok = "pending-ending", "t-pending-ending"
	keepTwice(ctx, t, k, be, b, key, tok, ttl)
	op1 := k.beginUnlock(key, tok)
	op2 := k.beginUnlock(key, tok)
	k.whichHold(ctx, op1)
	k.whichHold(ctx, op2)
	for i := 1; i <= 2; i++ {
		if ok, err := be.Unlock(ctx, key, tok); err != nil || !ok {
			t.Fatalf("A%d's UNLOCK = %v, %v", i, ok, err)
		}
	}
	k.endUnlock(op1, true, a1.ka)
	// B's connection closes: the watchdog ends, waiting for A2's UNLOCK.
	b.cancel()
	waitFor(t, func() bool { return k.count() == 0 }, "the watchdog to leave the registry")
	// D takes the free key with the token, without KEEPALIVE.
	l, err := be.Lock(ctx, backends.LockRequest{Key: key, Token: tok, TTL: ttl})
	if err != nil {
		t.Fatalf("D's LOCK: %v", err)
	}
	if k.granted(context.Background(), nil, key, tok) {
		t.Fatalf("D's LOCK counted on a watchdog; want none (the old one is ending)")
	}
	k.endUnlock(op2, true, a2.ka)
	k.close() // waits for the ending watchdog's release
	info, held, err := be.Info(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if !held {
		t.Fatalf("k free after the ending watchdog released; want D's hold (told %v) kept", l.Validity)
	}
	if len(info.Holders) != 1 || info.Holders[0].Token != tok {
		t.Fatalf("holders = %+v; want D's token", info.Holders)
	}
}
