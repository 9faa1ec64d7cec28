package redis_test

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/backends/redis"
)

// TestLateReentrantRollbackKeepsHold: token T holds k on n0 and n2 (n1 is
// another's). T's reentrant LOCK is granted by n0 (a second hold),
// refused by n1, and its SET NX to n2 is delayed by the link past the
// node timeout, so it fails and is rolled back on n0 and n2. The
// roll-back goes out on n2's next connection at once (the link heals for
// new bytes), while the SET NX is still on its way. Its acquire never
// added a hold on n2 (a SET NX on T's own key does nothing; the reentrant
// script is sent only once its answer is read), so a plain release there
// takes T's only hold: T, still within its validity, holds n0 alone, and
// once n1's holder leaves, another token is granted n1 and n2. Without
// the kill (before the owed change) the late SET NX put T's key back 3 s
// later, after a window in which another token could take n2; with the
// kill it never lands. The roll-back of an acquire in doubt removes only
// a hold its SET NX made (no stored fence), so T keeps n2.
func TestLateReentrantRollbackKeepsHold(t *testing.T) {
	const delay = 3 * time.Second
	b, rs, _, p := backendWithN2Link(t, redis.DefaultUser)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const key = "late-reentrant"
	const ttl = 20 * time.Second // node timeout 250 ms
	c0, c1, c2 := rs[0].Client(t), rs[1].Client(t), rs[2].Client(t)

	if err := c1.Set(ctx, "lp:lock:"+key, "other", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "T", TTL: ttl}); err != nil {
		t.Fatalf("T's LOCK with n0 and n2 free = %v", err)
	}
	if v0, v2 := c0.Get(ctx, "lp:lock:"+key).Val(), c2.Get(ctx, "lp:lock:"+key).Val(); v0 != "T" || v2 != "T" {
		t.Fatalf("after T's LOCK: n0 %q, n2 %q; want T on both", v0, v2)
	}

	failedReentryKeepsN2(ctx, t, b, rs, p, key, ttl, delay)
}
