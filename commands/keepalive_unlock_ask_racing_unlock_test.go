package commands

import (
	"context"
	"testing"
	"time"
)

// TestPooledUnlockAskRacedByAnotherPooledUnlock: B holds k twice with
// KEEPALIVE and the client's pool releases both, through A1 then A3. A1 is
// the only UNLOCK in flight, so it asks the nodes how many holds are left
// (one); as the answer comes back A3's UNLOCK begins, lands and ends
// (another UNLOCK in flight, A1's: A3's is pending). A1 then settles both
// with its answer, asked before A3's landed: one left, two counted, so one
// of B's is taken and A3's taken for a hold the watchdog does not count.
// The watchdog keeps counting a hold of B's that is gone, and B is told
// its lock is lost though the client released it.
func TestPooledUnlockAskRacedByAnotherPooledUnlock(t *testing.T) {
	const ttl = 600 * time.Millisecond
	be := &infoHookBackend{Backend: newRealRedLock(t, 3)}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	k := newTestKeepalives(t, be, time.Minute)
	b, a1, a3 := newTestConn(t, 3), newTestConn(t, 3), newTestConn(t, 3)
	const key, tok = "ask-raced-unlock", "t-ask-raced-unlock"
	keepTwice(ctx, t, k, be, b, key, tok, ttl)
	op1 := k.beginUnlock(key, tok)
	k.whichHold(ctx, op1)
	if ok, err := be.Unlock(ctx, key, tok); err != nil || !ok {
		t.Fatalf("A1's UNLOCK = %v, %v", ok, err)
	}
	be.mu.Lock()
	be.after = func() {
		op3 := k.beginUnlock(key, tok)
		k.whichHold(ctx, op3)
		if ok, err := be.Unlock(ctx, key, tok); err != nil || !ok {
			t.Errorf("A3's UNLOCK = %v, %v", ok, err)
		}
		k.endUnlock(op3, true, a3.ka)
	}
	be.mu.Unlock()
	k.endUnlock(op1, true, a1.ka)
	if _, held, err := be.Info(ctx, key); err != nil || held {
		t.Fatalf("Info after both UNLOCKs = held %v, %v; want the key free (the premise)", held, err)
	}
	if n := k.count(); n != 0 {
		t.Errorf("watchdogs running after the client released both holds = %d; want 0", n)
	}
	waitFor(t, func() bool { return k.count() == 0 }, "the watchdog's end")
	if why, lost := b.ka.takeLost([]byte(key)); lost {
		t.Errorf("B told %q; want nothing: the client released its own lock", why)
	}
	if p := b.pushed(); len(p) != 0 {
		t.Errorf("B's pushes = %q; want none", p)
	}
}
