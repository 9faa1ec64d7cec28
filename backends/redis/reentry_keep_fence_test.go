package redis_test

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/backends/redis"
)

// TestReentryRollbackKeepDoesNotLowerFence: T's hold survives on n0 only
// (on n1 and n2 it ended: here deleted, as the expiry of a hold whose
// lease only n0 extended, through a reentrant LOCK answered no). U is
// then granted n1 and n2 with fence fU and leaves. T's reentrant LOCK is
// granted by n0 as a reentry, refused by n1 (held by another), and on n2
// its SET NX makes a fresh hold whose answer is lost: the LOCK fails, and
// its roll-back on n2 (tagged reentry) keeps that fresh hold, without a
// stored fence. T's next LOCK then joins "its hold" on n0 and n2, a
// majority, and keeps n0's old fence, below fU: a fence that went
// backwards. (A roll-back that removed nothing where another node granted
// the attempt as a reentry did this; the roll-back removes the fresh hold,
// and T's next grant is a fresh one with a higher fence.)
func TestReentryRollbackKeepDoesNotLowerFence(t *testing.T) {
	// Mostly waits for the delayed link (14 s): beside the other such
	// tests, each on nodes of its own.
	t.Parallel()
	const delay = 3 * time.Second
	b, rs, _, p := backendWithN2Link(t, redis.DefaultUser)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const key = "reentry-keep-fence"
	const ttl = 30 * time.Second
	c1, c2 := rs[1].Client(t), rs[2].Client(t)
	redis.WarmUp(ctx, t, b, rs, key, ttl)
	lt, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "T", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // fence writes land
	for _, c := range rs[1:] {
		cl := c.Client(t)
		if err := cl.Del(ctx, "lp:lock:"+key, "lp:lockf:"+key, "lp:lockm:"+key).Err(); err != nil {
			t.Fatal(err)
		}
	}
	lu, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "U", TTL: ttl})
	if err != nil {
		t.Fatalf("U's LOCK with n1 and n2 free = %v", err)
	}
	if lu.Fence <= lt.Fence {
		t.Fatalf("U's fence %d not above T's %d", lu.Fence, lt.Fence)
	}
	if ok, err := b.Unlock(ctx, key, "U"); !ok || err != nil {
		t.Fatalf("UNLOCK U = %v, %v", ok, err)
	}
	for i := 0; c2.Exists(ctx, "lp:lock:"+key).Val() != 0; i++ {
		if i == 200 {
			t.Fatal("U's key still on n2")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := c1.Set(ctx, "lp:lock:"+key, "other", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	// T's reentrant LOCK: n2's link delays everything by delay, also the
	// writer's next connection, so the SET NX lands before any kill or
	// roll-back.
	p.SetLatency(delay, 0)
	if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "T", TTL: ttl}); err == nil {
		t.Fatal("T's LOCK with n1 held and n2 late granted")
	}
	// Let the late SET NX, the kill and the roll-back all land.
	time.Sleep(4 * delay)
	p.PassThrough()
	time.Sleep(2 * time.Second)
	t.Logf("n2 lock=%q lockf=%q", c2.Get(ctx, "lp:lock:"+key).Val(), c2.Get(ctx, "lp:lockf:"+key).Val())
	if err := c1.Del(ctx, "lp:lock:"+key).Err(); err != nil {
		t.Fatal(err)
	}
	l, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "T", TTL: ttl})
	if err != nil {
		t.Fatalf("T's LOCK = %v", err)
	}
	if l.Fence <= lu.Fence {
		t.Errorf("T's grant after U's (fence %d) has fence %d: fences went backwards", lu.Fence, l.Fence)
	}
}
