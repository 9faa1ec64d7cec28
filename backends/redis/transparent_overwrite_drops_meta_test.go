package redis

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
)

// TestTransparentOverwriteDropsOtherTokensMeta: a transparent command that
// overwrites a write hold with another token's (SET k B PX, say) leaves the
// old hold's lockm behind; syncHoldsScript, which follows it, drops that
// lockm, so that a later hold of the old token (SET k A PX again) does not
// inherit the old hold's extra holds: A's one release must free the key.
func TestTransparentOverwriteDropsOtherTokensMeta(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 10*time.Second)
	const key = "overwrite"
	keys := n.lockKeys(n.LockKey(key), key, keyWriterWaits)
	// set is a transparent client's SET key tok PX 10 s, with the sync
	// that follows it in its MULTI.
	set := func(tok string) {
		t.Helper()
		if err := direct.Set(ctx, keys[keyLock], tok, 10*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
		if err := direct.Eval(ctx, syncHoldsScript, keys, readMarker, "lp:released:"+key).Err(); err != nil {
			t.Fatalf("syncHoldsScript: %v", err)
		}
	}
	// A holds it twice.
	for i := 0; i < 2; i++ {
		if g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: "A", TTL: 10 * time.Second}); err != nil || !g.Acquired {
			t.Fatalf("grant %d = %+v, %v", i, g, err)
		}
	}
	set("B")
	if m := direct.Get(ctx, keys[keyHolds]).Val(); m != "" {
		t.Errorf("lockm %q left after B's SET overwrote A's hold; want it dropped", m)
	}
	set("A")
	st, err := n.LockState(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if got := describeState(st); got != "w:A:1" {
		t.Errorf("state %q after A's SET; want w:A:1 (not the overwritten hold's extra holds)", got)
	}
	if ok, err := n.Release(ctx, key, "A", quorum.AnyHold); !ok || err != nil {
		t.Fatalf("release = %v, %v", ok, err)
	}
	if direct.Exists(ctx, keys[keyLock]).Val() != 0 {
		t.Error("lock key left after the one hold's release")
	}
}

// TestSyncLeavesPersistentHoldAlone: syncHoldsScript leaves a write hold
// without expiry (a transparent SET without PX) as it is: it neither ends
// it nor gives its lockf an expiry of its own.
func TestSyncLeavesPersistentHoldAlone(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 10*time.Second)
	const key = "persistent"
	keys := n.lockKeys(n.LockKey(key), key, keyWriterWaits)
	if err := direct.Set(ctx, keys[keyLock], "A", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := direct.Set(ctx, keys[keyFence], "7,A", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := direct.Eval(ctx, syncHoldsScript, keys, readMarker, "lp:released:"+key).Err(); err != nil {
		t.Fatalf("syncHoldsScript: %v", err)
	}
	for _, k := range []string{keys[keyLock], keys[keyFence]} {
		if got := direct.PTTL(ctx, k).Val(); got != -1 {
			t.Errorf("%s PTTL %v after the sync; want it left without expiry (-1)", k, got)
		}
	}
	if v := direct.Get(ctx, keys[keyLock]).Val(); v != "A" {
		t.Errorf("lock key %q after the sync; want A's hold left alone", v)
	}
}
