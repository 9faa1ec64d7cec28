package redis

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
)

// TestLateReadReleaseTakesOnlyItsAttemptsHold: the roll-back of a read
// acquire in doubt (lateReadReleaseScript, sent when the acquire's answer
// was lost) removes a read hold only where that attempt's grant left its
// mark. A plain read release cannot tell: where the acquire never ran (a
// connection killed with it unread) it took the hold the token had before
// — a reader that believes it holds the key on a majority then holds it
// on fewer nodes, and a writer can be granted it meanwhile.
func TestLateReadReleaseTakesOnlyItsAttemptsHold(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 10*time.Second)
	const key = "late-read-mark"
	w := &writer{}
	defer w.drop()
	read := func(token, attempt string, ttl time.Duration) opResult {
		t.Helper()
		now := time.Now()
		a := n.acquireOp(quorum.Request{Key: key, Token: token, TTL: ttl, Mode: quorum.Shared, Attempt: attempt})
		a.start, a.deadline, a.res = now, now.Add(5*time.Second), make(chan opResult, 1)
		n.exec(w, []*op{a})
		ra := <-a.res
		if g, err := acquireGrant(ra, quorum.Shared); err != nil || !g.Acquired {
			t.Fatalf("RLOCK %s (%s) = %+v; want granted", token, attempt, ra)
		}
		return ra
	}
	lateRollback := func(token, attempt string) int64 {
		t.Helper()
		now := time.Now()
		rb := &op{kind: opRelease, base: key, token: token, hold: quorum.ReadHold, rollback: true, attempt: attempt,
			lateGrant: true, start: now, deadline: now.Add(5 * time.Second), res: make(chan opResult, 1)}
		n.exec(w, []*op{rb})
		rr := <-rb.res
		if rr.err != nil {
			t.Fatalf("late roll-back of %s: %v", attempt, rr.err)
		}
		return rr.n
	}
	state := func() string {
		t.Helper()
		st, err := n.LockState(ctx, key) // also: a mark is no reader
		if err != nil {
			t.Fatal(err)
		}
		return describeState(st)
	}

	read("R", "A1", 10*time.Second)
	if got := lateRollback("R", "A2"); got != 0 || state() != "r:R=1" {
		t.Errorf("roll-back of attempt A2, which never ran = %d, state %q; want 0 and R's hold kept (r:R=1)", got, state())
	}
	if h := read("R", "A3", 10*time.Second).holds; h != 2 {
		t.Fatalf("R's reentrant read = %d holds; want 2", h)
	}
	if got := lateRollback("R", "A3"); got != 1 || state() != "r:R=1" {
		t.Errorf("roll-back of attempt A3, which ran = %d, state %q; want 1 and one hold left (r:R=1)", got, state())
	}
	if got := lateRollback("R", "A3"); got != 0 || state() != "r:R=1" {
		t.Errorf("A3's roll-back again = %d, state %q; want 0 (its mark went with the first)", got, state())
	}
	// A mark goes with its reader: by release, and by the pruning of an
	// ended lease.
	read("S", "B1", 100*time.Millisecond)
	time.Sleep(150 * time.Millisecond)
	read("U", "C1", 10*time.Second) // prunes S
	if ok, err := n.Release(ctx, key, "U", quorum.AnyHold); !ok || err != nil {
		t.Fatalf("UNLOCK U = %v, %v", ok, err)
	}
	fields, err := direct.HKeys(ctx, "lp:lockrh:"+key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(fields) != 1 || fields[0] != "R" {
		t.Errorf("reader holds hash fields %q; want only R's count (S's and U's marks gone with them)", fields)
	}
	if ok, err := n.Release(ctx, key, "R", quorum.AnyHold); !ok || err != nil {
		t.Fatalf("UNLOCK R = %v, %v", ok, err)
	}
	if k := direct.Exists(ctx, "lp:lock:"+key, "lp:lockrh:"+key, "lp:lockr:"+key).Val(); k != 0 {
		t.Errorf("%d of the lock's keys left after the last reader's UNLOCK; want none", k)
	}
}
