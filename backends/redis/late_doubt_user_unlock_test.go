package redis

import (
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lockproxy/lockproxy/backends"
)

// TestDoubtSettledByUserUnlockLeavesNoHold: T's LOCK of k is granted by
// n0 and n1 while n2 is paused: n2's acquire is sent and not answered
// (kept in doubt), and runs when n2 resumes. T's LOCK succeeded, so no
// roll-back ever settles that doubt. T then LOCKs k again (a reentrant
// hold on every node, n2 included) and UNLOCKs twice: k must be free on
// every node, n2 included.
//
// The first UNLOCK's release on n2 settles the doubt and goes out as
// lateGrantReleaseScript, which removes nothing where the token has extra
// holds: n2 keeps T's hold after the second UNLOCK, until its TTL. A
// plain release (before 76d839f) took one hold, as on n0 and n1.
func TestDoubtSettledByUserUnlockLeavesNoHold(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	b, rs := newRealBackend(t, 3, func(c *Config) { c.Logger = zap.New(core) })
	ctx := ctxTimeout(t, 60*time.Second)
	const key = "doubt-unlock"
	const ttl = 20 * time.Second

	// Every writer has its connection.
	if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "warm", TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.Unlock(ctx, key, "warm"); !ok || err != nil {
		t.Fatalf("UNLOCK warm = %v, %v", ok, err)
	}
	waitStates := func(what string, ok func(i int, st nodeLockState) bool) {
		t.Helper()
		for i := 0; ; i++ {
			good := true
			sts := holdStates(t, ctx, b, key)
			for j, st := range sts {
				good = good && ok(j, st)
			}
			if good {
				return
			}
			if i == 150 {
				t.Fatalf("3 s: %+v; want %s", sts, what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitStates("k free", func(_ int, st nodeLockState) bool { return !st.held })

	rs[2].Pause()
	if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "T", TTL: ttl}); err != nil {
		rs[2].Resume()
		t.Fatalf("LOCK with n2 paused: %v", err)
	}
	time.Sleep(600 * time.Millisecond) // n2's node timeout (250 ms) passes while paused
	rs[2].Resume()
	waitStates("T's one hold on every node", func(_ int, st nodeLockState) bool {
		return st.held && st.value == "T" && st.extraHolds == 0
	})

	// n2's writer has killed the dropped connection (paid what it owed):
	// the reentrant LOCK's acquire is sent on its new connection.
	for i := 0; logs.FilterMessage("killed a dropped connection").Len() == 0; i++ {
		if i == 150 {
			t.Fatal("n2's writer did not kill the dropped connection within 3 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "T", TTL: ttl}); err != nil {
		t.Fatalf("reentrant LOCK: %v", err)
	}
	waitStates("T's two holds on every node", func(_ int, st nodeLockState) bool {
		return st.held && st.value == "T" && st.extraHolds == 1
	})
	for i := range 2 {
		if ok, err := b.Unlock(ctx, key, "T"); !ok || err != nil {
			t.Fatalf("UNLOCK %d = %v, %v", i+1, ok, err)
		}
	}
	waitStates("k free on every node after T's two UNLOCKs", func(_ int, st nodeLockState) bool { return !st.held })
}
