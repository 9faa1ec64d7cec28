package redis_test

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/backends/redis"
)

// TestFenceKillKeepsReentrantHold: T's fresh grant on n2 has its fence
// write (lockf) delayed on the link past the node timeout; the writer
// drops that connection and (since the fence-write kill) kills it from the
// next one, so T's live hold on n2 never gets its lockf. The roll-back of
// a later reentrant LOCK of T whose answer on n2 is lost
// (lateGrantReleaseScript) takes a hold without lockf or lockm for the
// lost SET NX's own and deletes T's hold on n2: T, still within its
// validity, holds n0 alone, and once n1's holder leaves another token is
// granted n1 and n2 (two holders). Without the kill the late fence write
// lands (3 s) and the roll-back keeps T's hold.
func TestFenceKillKeepsReentrantHold(t *testing.T) {
	// Mostly waits for the delayed link: beside the other such tests,
	// on nodes of its own.
	t.Parallel()
	const delay = 3 * time.Second
	b, rs, logs, p := backendWithN2Link(t, redis.DefaultUser)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const key = "fence-kill-reentrant"
	const ttl = 30 * time.Second
	c1, c2 := rs[1].Client(t), rs[2].Client(t)
	redis.WarmUp(ctx, t, b, rs, key, ttl)
	if err := c1.Set(ctx, "lp:lock:"+key, "other", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}

	// T's grant (n0, n2): n2's fence write is held on the link.
	heal := holdNextFenceWrite(t, b, p, delay, nil)
	if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "T", TTL: ttl, NoReentry: true}); err != nil {
		t.Fatalf("T's LOCK with n0 and n2 free = %v", err)
	}
	heal()
	// Past the held fence write's arrival.
	time.Sleep(delay + time.Second)
	if v := c2.Get(ctx, "lp:lock:"+key).Val(); v != "T" {
		t.Fatalf("n2's lock key %q; want T", v)
	}
	t.Logf("n2 lockf after the delayed fence write: %q; kills logged: %d",
		c2.Get(ctx, "lp:lockf:"+key).Val(), len(logs.FilterMessage("killed a dropped connection").All()))

	failedReentryKeepsN2(ctx, t, b, rs, p, key, ttl, delay)
}
