package commands

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestLockDelayKeepsRacingReentrantGrant: B holds k with a token lockproxy
// made (LOCK k PX 600 KEEPALIVE), the key has a 100 ms lock-delay, and the
// client takes k again with that token on connection A without KEEPALIVE
// (LOCK k PX 10000 TOKEN t): the nodes grant it and A is told about 10 s.
// B's connection closes after A's grant reached the nodes but before
// Handler.acquire counts it on the watchdog (grantedGrant), which is then
// out of the registry, so A's hold is never counted (neither loose nor
// shared). These are the steps of Handler.acquire and of the close, on
// real nodes, in an order the handler allows. The lock-delay must leave
// the lease A was told: nothing but the delay may shorten it. delayLock
// takes the watchdog for one that knows every hold (no loose, no
// uncounted, not shared) and sets the lease exactly (Renew) to the delay
// (or B's told validity): the 10 s lease A relies on is cut to well under
// a second, and a rival gets the key while A holds it.
func TestLockDelayKeepsRacingReentrantGrant(t *testing.T) {
	const (
		delay = 100 * time.Millisecond
		ttlB  = 600 * time.Millisecond
		ttlA  = 10 * time.Second
		key   = "delayed-reentry"
	)
	be := newRealRedLock(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	k := newTestKeepalives(t, be, time.Minute)
	k.delayFor = (&Limits{LockDelays: []LockDelay{{Pattern: key, Delay: delay}}}).lockDelay
	b, a := newTestConn(t, 3), newTestConn(t, 3)

	start := time.Now()
	lb, err := be.Lock(ctx, backends.LockRequest{Key: key, Token: "t-made", TTL: ttlB, NoReentry: true})
	if err != nil {
		t.Fatalf("B's LOCK: %v", err)
	}
	if !k.startGrant(b.ctx, b.ka, key, "t-made", ttlB, 0, backends.Write, false,
		grantTiming{sent: start, validity: lb.Validity, begun: start, holds: lb.Holds}) {
		t.Fatal("B's LOCK not kept")
	}
	// A's reentrant grant reaches the nodes and is answered…
	startA := time.Now()
	la, err := be.Lock(ctx, backends.LockRequest{Key: key, Token: "t-made", TTL: ttlA})
	if err != nil {
		t.Fatalf("A's LOCK … TOKEN t: %v", err)
	}
	toldEnd := startA.Add(la.Validity)
	// …then B's connection closes, before acquire counts A's hold.
	b.cancel()
	waitStopped(t, k)
	if k.grantedGrant(a.ctx, nil, key, "t-made", backends.Write, true, ttlA, 0,
		grantTiming{sent: startA, validity: la.Validity, begun: startA, holds: la.Holds}) {
		t.Fatal("A's grant counted on a watchdog; want none left (the race)")
	}
	info, held, err := be.Info(ctx, key)
	if err != nil || !held {
		t.Fatalf("Info after the lock-delay = held %v, %v; want held by A", held, err)
	}
	left := time.Until(toldEnd)
	t.Logf("A told %v; lease left on the nodes %v, A's validity left %v", la.Validity, info.TTL, left)
	if info.TTL < left-time.Second {
		t.Errorf("lease left after the lock-delay = %v; want at least the %v left of the validity A was told", info.TTL, left.Round(time.Millisecond))
	}
	// A rival must not get k while A's validity lasts.
	time.Sleep(ttlB + 200*time.Millisecond)
	if time.Until(toldEnd) < time.Second {
		t.Skip("too slow to check the rival")
	}
	if _, err := be.Lock(ctx, backends.LockRequest{Key: key, Token: "rival", TTL: time.Second, NoReentry: true}); err == nil {
		t.Errorf("a rival got k with %v left of A's validity; want it held by A", time.Until(toldEnd).Round(time.Millisecond))
	}
}
