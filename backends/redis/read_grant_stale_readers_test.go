package redis

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
)

// TestReadGrantOnFreeKeyDropsStaleReaders: reader keys left behind by a
// read-held lock key that was deleted (by hand, or a transparent DEL,
// which syncHoldsScript follows by dropping lockm only) name readers
// whose holds ended with the key. A read grant on the free key starts
// afresh: the old readers are not among its holders, and cannot renew.
func TestReadGrantOnFreeKeyDropsStaleReaders(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 10*time.Second)
	const key = "stale-readers"
	for _, tok := range []string{"old", "new"} {
		if g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: tok, TTL: time.Minute, Mode: quorum.Shared}); err != nil || !g.Acquired {
			t.Fatalf("read grant to %s = %+v, %v", tok, g, err)
		}
		if tok == "old" {
			// The lock key is deleted; its reader keys stay.
			if err := direct.Del(ctx, "lp:lock:"+key).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	st, err := n.LockState(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if got := describeState(st); got != "r:new=1" {
		t.Errorf("state %q; want r:new=1 (the deleted key's reader gone)", got)
	}
	if ok, err := n.Extend(ctx, key, "old", time.Minute); ok || err != nil {
		t.Errorf("renewal of the deleted key's reader = %v, %v; want refused", ok, err)
	}
}
