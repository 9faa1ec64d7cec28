package e2e

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// Regressions of the KEEPALIVE change that made renewals raise-only and
// added the `unlocked` loss (commit 9201c06), on real Redis nodes.

// TestPooledUnlockOfKeepaliveLockIsNoLoss: a pooled client takes its lock
// on one connection (LOCK k PX 600 TOKEN t KEEPALIVE on B) and releases it
// through another connection of its pool (UNLOCK k t on A), the pattern of
// every pooled Redis client. The token's only hold is B's (its grant's
// reply said 1), and A's UNLOCK released it: the client released its own
// lock, nothing was lost. Since 9201c06 endUnlock, finding no hold of A's,
// no loose one and no uncounted one, takes B's through forsakeLocked,
// which tells B its lock is lost (reason `unlocked`): B gets a lock-lost
// push, lockproxy_lock_lost_total{reason="unlocked"} counts a loss, and B's
// next LOCK of the key — when the pool hands B out again for the next turn
// — answers -LOCKLOST and is not run. Before, the watchdog stopped without
// a word, and the next LOCK was granted.
func TestPooledUnlockOfKeepaliveLockIsNoLoss(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	in := startSemInstance(t, cl)
	key := "pool-unlock-" + lockclient.RandID()
	tok := "t-" + lockclient.RandID()

	b := lc.DialRaw(t, in.addr)
	if r := b.Do("HELLO", "3"); r.Kind != '%' {
		t.Fatalf("HELLO 3 = %v; want a map", r)
	}
	a := lc.DialRaw(t, in.addr)
	for turn := 1; turn <= 2; turn++ {
		if r := b.Do("LOCK", key, "PX", "600", "TOKEN", tok, "KEEPALIVE"); r.Kind != '%' {
			t.Fatalf("turn %d: B's LOCK … TOKEN t KEEPALIVE = %v; want a grant", turn, r)
		}
		if r := a.Do("UNLOCK", key, tok); r.Kind != ':' || r.Int != 1 {
			t.Fatalf("turn %d: A's UNLOCK = %v; want :1", turn, r)
		}
		// A push, had one been sent, was queued on B before A's reply.
		if r := b.Do("PING"); r.Kind != '+' || r.Str != "PONG" {
			t.Errorf("turn %d: B's PING after A's UNLOCK of the client's own lock = %v; want PONG (no lock-lost push)", turn, r)
			if r.Kind == '>' {
				_, _ = b.Read() // the PONG behind the push
			}
		}
	}
	// The key was released: nobody holds it.
	if h := cl.holders(t, key, tok); h > 1 {
		t.Errorf("key held by the token on %d nodes after the UNLOCKs; want released", h)
	}
	if v := metricValue(t, in, `lockproxy_lock_lost_total{reason="unlocked"}`); v != "0" && v != "" {
		t.Errorf(`lockproxy_lock_lost_total{reason="unlocked"} = %s; want 0: the client released its own lock`, v)
	}
}

// TestLockDelayHeldAtLeastTheDelay: with locks.lock_delay 300 ms for the
// key, a KEEPALIVE lock (PX 3000, renewed every second) whose holder's
// connection drops, after the validity its grant told has ended, is held
// for at least the delay and then freed when the lease ends: the delay
// only raises the lease (README, Lock-delay), so the lease the watchdog's
// last renewal asked for may stand, up to one TTL. Setting the lease to
// exactly the delay would free the key sooner, but could cut a racing
// grant of the same token (commands TestLockDelayKeepsRacingReentrantGrant).
func TestLockDelayHeldAtLeastTheDelay(t *testing.T) {
	t.Parallel()
	const delay = 300 * time.Millisecond
	cl := startCluster(t, 3)
	in := startInstanceEnv(t, cl.addrs(), []string{
		"LOCKPROXY_LOCKS_LOCK_DELAY=delayed:*=300ms",
		"LOCKPROXY_REDLOCK_NODE_TIMEOUT_MIN=1s",
		"LOCKPROXY_REDLOCK_NODE_TIMEOUT_MAX=1s",
	})
	waiter := lc.NewClient(t, in.addr, 2)
	key := "delayed:" + lockclient.RandID()

	holder := lc.DialRaw(t, in.addr)
	granted := time.Now()
	rawGrant(t, holder, key, "PX", "3000", "KEEPALIVE")
	// Past the grant's validity (3 s), the watchdog renewing every second.
	for i := 0; time.Since(granted) < 3500*time.Millisecond; i++ {
		if i > 50 {
			t.Fatal("more than 50 rounds")
		}
		if r := holder.Do("PING"); r.Str != "PONG" {
			t.Fatalf("PING = %v", r)
		}
		time.Sleep(100 * time.Millisecond)
	}
	gone := time.Now()
	_ = holder.Conn.Close()
	g, ok := lc.Lock(t, waiter, key, "PX", 1000, "WAIT", 8000)
	took := time.Since(gone)
	if !ok {
		t.Fatalf("LOCK … WAIT 8000 = nil %v after the holder left; want a grant", took)
	}
	t.Logf("granted %v after the holder's connection closed (lock-delay %v, TTL 3 s)", took.Round(time.Millisecond), delay)
	if took < delay-50*time.Millisecond {
		t.Errorf("granted %v after the holder left; want no earlier than the %v lock-delay", took, delay)
	}
	if took > 3*time.Second+700*time.Millisecond {
		t.Errorf("granted %v after the holder left; want within the lock-delay or the lease last renewed (TTL 3 s)", took)
	}
	lc.Unlock(t, waiter, key, g.Token)
}

// TestLocksHeldGaugeKeepsRaisedLease: client P holds k without KEEPALIVE
// (LOCK k PX 6000 TOKEN t); connection B takes it again with KEEPALIVE
// and a short TTL (PX 600), its watchdog renews a few times, and B
// UNLOCKs its own hold. P's hold is left, and since 9201c06 its lease on
// the nodes is the 6 s it was told: the watchdog's renewals only raise
// it. lockproxy_locks_held must count the lock until then. But the
// watchdog still reports each renewal with heldLocks.renewed, which sets
// the lease counted to 600 ms from the renewal, so the sweep drops the
// lock from the gauge about a second later while it is held for 5 s more
// (and observes a hold duration that short).
func TestLocksHeldGaugeKeepsRaisedLease(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	in := startSemInstance(t, cl)
	inB := startSemInstance(t, cl)
	p := lc.NewClient(t, in.addr, 3)
	other := lc.NewClient(t, inB.addr, 3)
	key := "held-gauge-" + lockclient.RandID()
	tok := "t-" + lockclient.RandID()

	g := lc.MustLock(t, p, key, "PX", 6000, "TOKEN", tok)
	end := time.Now().Add(time.Duration(g.ValidityMS) * time.Millisecond)
	b := lc.DialRaw(t, in.addr)
	if r := b.Do("LOCK", key, "PX", "600", "TOKEN", tok, "KEEPALIVE"); r.Kind != '*' && r.Kind != '%' {
		t.Fatalf("B's LOCK … KEEPALIVE = %v; want a grant", r)
	}
	for stop := time.Now().Add(700 * time.Millisecond); time.Now().Before(stop); time.Sleep(100 * time.Millisecond) {
		if r := b.Do("PING"); r.Str != "PONG" {
			t.Fatalf("PING on B = %v", r)
		}
	}
	if r := b.Do("UNLOCK", key, tok); r.Kind != ':' || r.Int != 1 {
		t.Fatalf("B's UNLOCK = %v; want :1", r)
	}
	// The sweep runs every second; 600 ms after B's last renewal plus two
	// sweeps is well within P's validity.
	time.Sleep(2200 * time.Millisecond)
	if time.Until(end) < time.Second {
		t.Skipf("too slow: %v left of P's validity", time.Until(end))
	}
	if _, ok := lc.Lock(t, other, key, "PX", 1000); ok {
		t.Fatal("a rival got the key within P's validity; want it held (the premise)")
	}
	if v := metricValue(t, in, "lockproxy_locks_held"); v != "1" {
		t.Errorf("lockproxy_locks_held = %s with P's hold still held for %v; want 1", v, time.Until(end).Round(time.Millisecond))
	}
	if got := lc.Unlock(t, p, key, tok); got != 1 {
		t.Errorf("P's UNLOCK = %d; want 1", got)
	}
	if v := metricValue(t, in, "lockproxy_locks_held"); v != "0" {
		t.Errorf("lockproxy_locks_held after P's UNLOCK = %s; want 0", v)
	}
}
