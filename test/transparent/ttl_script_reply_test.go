package transparent

import (
	"testing"
	"time"

	"github.com/bsm/redislock"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestBsmRedislockTTLWithNodesApart: bsm/redislock's Lock.TTL runs its
// luaPTTL script (GET, then PTTL of the key when the token holds it). The
// nodes' leases are never exactly equal (each node ran the grant and runs
// the script at its own moment), so the script's replies differ by some
// milliseconds; served under the plain majority rule they never agree
// and TTL failed with "no majority" while the lock was held. Its reply is
// a PTTL, and gets PTTL's rule: the time the key stays on a majority.
func TestBsmRedislockTTLWithNodesApart(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := e.client(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)
	l, err := redislock.New(c).Obtain(ctx, "lock:bsm-ttl", 10*time.Second, nil)
	if err != nil {
		t.Fatalf("Obtain: %v", err)
	}
	// The leases a loaded machine leaves on the nodes, made wide enough
	// apart to tell which one the reply is.
	for i, ms := range []int64{9000, 6000, 3000} {
		if err := e.direct[i].PExpire(ctx, keyPrefix+"lock:lock:bsm-ttl", time.Duration(ms)*time.Millisecond).Err(); err != nil {
			t.Fatal(err)
		}
	}
	ttl, err := l.TTL(ctx)
	if err != nil || ttl <= 3*time.Second || ttl > 6*time.Second {
		t.Fatalf("Lock.TTL with 9 s, 6 s, 3 s left on the nodes = %v, %v; want about 6 s (the time the key stays on a majority)", ttl, err)
	}
	// Another holder's token: the script's own "not held" (-3) on every
	// node, which bsm reads as 0.
	other, err := redislock.New(c).Obtain(ctx, "lock:bsm-ttl-2", 10*time.Second, nil)
	if err != nil {
		t.Fatalf("Obtain: %v", err)
	}
	if err := other.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if ttl, err := other.TTL(ctx); err != nil || ttl != 0 {
		t.Errorf("Lock.TTL after release = %v, %v; want 0", ttl, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	e.requireGone(t, "after release", "lock:bsm-ttl")
}
