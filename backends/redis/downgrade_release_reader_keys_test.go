package redis

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
)

// TestWriteReleaseAfterDowngradeEndsReaderKeysWithKey: when a downgraded
// holder (write lease longer than its read lease) releases its write hold,
// the reader keys (lockr, lockrh) expire with the lock key, which lives on
// for the read lease alone, and nothing of the key is left once that ends.
// Before, the reader keys kept the write lease's expiry (readScript gives
// them the longer of the two) and outlived the lock key and every hold by
// the rest of the write lease.
func TestWriteReleaseAfterDowngradeEndsReaderKeysWithKey(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 10*time.Second)
	const key = "down-release-rk"
	if g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: "c", TTL: 10 * time.Second}); err != nil || !g.Acquired {
		t.Fatalf("write grant = %+v, %v", g, err)
	}
	if g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: "c", TTL: 200 * time.Millisecond, Mode: quorum.Shared}); err != nil || !g.Acquired {
		t.Fatalf("downgrade = %+v, %v", g, err)
	}
	if ok, err := n.Release(ctx, key, "c", quorum.WriteHold); err != nil || !ok {
		t.Fatalf("release of the write hold = %v, %v", ok, err)
	}
	lease := direct.PTTL(ctx, "lp:lock:"+key).Val()
	if lease <= 0 || lease > 200*time.Millisecond {
		t.Fatalf("lock key PTTL %v after the write hold's release; want the read lease left (at most 200ms)", lease)
	}
	for _, k := range []string{"lp:lockr:" + key, "lp:lockrh:" + key} {
		if p := direct.PTTL(ctx, k).Val(); p > lease+5*time.Millisecond {
			t.Errorf("PTTL %s = %v; want at most the lock key's %v", k, p, lease)
		}
	}
	time.Sleep(300 * time.Millisecond) // past the read lease
	if ks := direct.Keys(ctx, "lp:*"+key).Val(); len(ks) > 0 {
		t.Errorf("keys left after every hold ended: %v", ks)
	}
}
