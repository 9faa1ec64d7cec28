package commands

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/backends/redis"
	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/test/harness"
)

// newRealRedLock is a RedLock backend over n real redis-server nodes.
func newRealRedLock(t *testing.T, n int) *redis.Backend {
	t.Helper()
	b, _ := newRealRedLockNodes(t, n)
	return b
}

// newRealRedLockNodes is newRealRedLock returning the nodes too, for tests
// that look at what is left on each (lock keys are under "lp:").
func newRealRedLockNodes(t *testing.T, n int) (*redis.Backend, []*harness.Redis) {
	t.Helper()
	harness.RequireBinary(t, "redis-server", "redis-server")
	rs := harness.StartRedisN(t, n, harness.RedisOptions{})
	// Nodes get at least 100 ms to answer: the tests' short leases (600 ms:
	// 30 ms by default) missed their quorum on a loaded CI host, and what
	// they test does not depend on it.
	cfg := redis.Config{RetryMin: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond,
		Quorum: quorum.Config{DriftFactor: 0.01, DriftMin: 2 * time.Millisecond, TimeoutMin: 100 * time.Millisecond}}
	for _, r := range rs {
		cfg.Nodes = append(cfg.Nodes, redis.NodeConfig{Addr: r.Addr, KeyPrefix: "lp:", Timeout: time.Second, Metrics: redis.NewMetrics(nil)})
	}
	b, err := redis.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b, rs
}

// TestConcurrentPooledUnlocksOfReentrantKeepalive: connection B holds k
// twice with KEEPALIVE (a reentrant LOCK … TOKEN t KEEPALIVE), and the
// client's pool releases both holds at once through connections A1 and A2,
// each an UNLOCK k t. The steps are those of Handler.unlock (beginUnlock,
// whichHold, the backend's Unlock, endUnlock), on real nodes, in one
// interleaving the handler allows: both UNLOCKs begin, A1's release lands
// and A1 asks the nodes how many holds are left (one: A2's has not landed
// yet), then A2's release lands and A2 asks (none left). The client
// released everything it took: the watchdog must stop, and B must be told
// nothing. endUnlock takes A1's answer (1 left, 2 counted, 1 in flight)
// for a hold the watchdog does not count and A2's for one of B's, so the
// watchdog keeps counting one hold of B's that is gone: its next renewal
// finds nothing and B is told its lock is lost (renew_failed: a push, and
// its next command on the key answers LOCKLOST).
func TestConcurrentPooledUnlocksOfReentrantKeepalive(t *testing.T) {
	const ttl = 600 * time.Millisecond
	be := newRealRedLock(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	k := newTestKeepalives(t, be, time.Minute)
	b, a1, a2 := newTestConn(t, 3), newTestConn(t, 3), newTestConn(t, 3)
	const key, tok = "pooled-reentrant", "t-pooled"
	keepTwice(ctx, t, k, be, b, key, tok, ttl)
	op1 := k.beginUnlock(key, tok)
	op2 := k.beginUnlock(key, tok)
	k.whichHold(ctx, op1)
	k.whichHold(ctx, op2)
	ok1, err := be.Unlock(ctx, key, tok)
	if err != nil || !ok1 {
		t.Fatalf("A1's UNLOCK = %v, %v", ok1, err)
	}
	k.endUnlock(op1, true, a1.ka)
	ok2, err := be.Unlock(ctx, key, tok)
	if err != nil || !ok2 {
		t.Fatalf("A2's UNLOCK = %v, %v", ok2, err)
	}
	k.endUnlock(op2, true, a2.ka)
	if _, held, err := be.Info(ctx, key); err != nil || held {
		t.Fatalf("Info after both UNLOCKs = held %v, %v; want the key free (the premise)", held, err)
	}
	if n := k.count(); n != 0 {
		t.Errorf("watchdogs running after the client released both holds = %d; want 0", n)
	}
	// Give the watchdog (if still running) two renewal periods to act.
	time.Sleep(2 * ttl / 3)
	waitFor(t, func() bool { return k.count() == 0 }, "the watchdog's end")
	if why, lost := b.ka.takeLost([]byte(key)); lost {
		t.Errorf("B told %q; want nothing: the client released its own lock", why)
	}
	if p := b.pushed(); len(p) != 0 {
		t.Errorf("B's pushes = %q; want none", p)
	}
	for r := lostReason(0); r < numLostReasons; r++ {
		if got := counterValue(t, k.lost[r]); got != 0 {
			t.Errorf("lockproxy_lock_lost_total{reason=%q} = %v; want 0", r.label(), got)
		}
	}
}

// keepTwice takes key for tok twice on be with KEEPALIVE through c, as a
// reentrant LOCK … TOKEN tok KEEPALIVE does: c's watchdog counts two holds.
func keepTwice(ctx context.Context, t *testing.T, k *keepalives, be backends.Backend, c *testConn, key, tok string, ttl time.Duration) {
	t.Helper()
	keepOnce(ctx, t, k, be, c, key, tok, ttl)
	keepOnce(ctx, t, k, be, c, key, tok, ttl)
}
