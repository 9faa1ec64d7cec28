package redis_test

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/backends/redis"
)

// TestReentryRollbackKeepsHoldWithoutFence: T holds the key on n0 and n2
// (a LOCK without TOKEN: the fast path, whose fence write follows the
// answer), but n2 has no stored fence for the hold (its fence write was
// lost: a flush that failed, or a kill whose owed rewrite came too late).
// T's reentrant LOCK (with TOKEN) is granted by n0 as a reentry, refused
// by n1 and its answer on n2 is lost. Before attempts were marked, the
// roll-back on n2 could not tell T's hold from one the lost SET NX made
// (no lockf, no lockm) and removed it: T, still within its validity, then
// held n0 alone, and another token was granted n1 and n2 once n1's holder
// left. Now the attempt's first step marks a hold it makes afresh
// (acquireMarkedScript), and its roll-back removes only a hold with its
// mark. A roll-back that removed nothing where another node granted the
// attempt as a reentry let a fence go backwards
// (TestReentryRollbackKeepDoesNotLowerFence).
func TestReentryRollbackKeepsHoldWithoutFence(t *testing.T) {
	const delay = 3 * time.Second
	b, rs, _, p := backendWithN2Link(t, redis.DefaultUser)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const key = "reentry-no-fence"
	const ttl = 30 * time.Second
	c1, c2 := rs[1].Client(t), rs[2].Client(t)
	redis.WarmUp(ctx, t, b, rs, key, ttl)
	if err := c1.Set(ctx, "lp:lock:"+key, "other", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "T", TTL: ttl, NoReentry: true}); err != nil {
		t.Fatalf("T's LOCK with n0 and n2 free = %v", err)
	}
	// n2's fence write is answered before the next batch on its
	// connection goes out; then the hold loses it.
	for i := 0; c2.Exists(ctx, "lp:lockf:"+key).Val() == 0; i++ {
		if i == 200 {
			t.Fatal("no lockf on n2 2 s after T's LOCK")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := c2.Del(ctx, "lp:lockf:"+key).Err(); err != nil {
		t.Fatal(err)
	}
	failedReentryKeepsN2(ctx, t, b, rs, p, key, ttl, delay)
}
