package redis

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
)

// TestOwedFenceWriteSparesFreshHoldRollback: T's hold H1 (fence write 12
// on conn1, answer unread) ends by its lease; T's next LOCK goes out on
// conn1 behind it, its SET NX makes a fresh hold H2 there, its answer is
// lost, conn1 is dropped and killed, and T's attempt fails (roll-back
// owed). The owed fence write is H1's: written now, seeing the lock key
// T's, it would store lockf on H2, and the owed roll-back
// (lateGrantReleaseScript) would take H2 for a hold T had before and keep
// it for its whole TTL. H1's acquire started longer ago than its TTL, so
// its fence write is owed no more, and the roll-back removes H2.
func TestOwedFenceWriteSparesFreshHoldRollback(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 10*time.Second)
	const key, token = "k2", "T"
	// H2: a fresh SET NX of T's, no lockf, no lockm (its fence write never went out).
	if err := direct.Set(ctx, "lp:lock:"+key, token, 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	o := &owed{}
	now := time.Now()
	fences := unansweredFences{{base: key, token: token, fence: 12, slot: slot(key), start: now.Add(-2 * time.Second), ms: 1000}}
	o.lost([]*op{{kind: opAcquire, base: key, token: token, ms: 10000}}, fences, 99999, "gone-run", now)
	o.unsent([]*op{{kind: opRelease, base: key, token: token, rollback: true, hold: quorum.WriteHold}}, now)
	payDebtsDirect(t, n, r.Addr, o, now)
	if v := direct.Get(ctx, "lp:lock:"+key).Val(); v != "" {
		t.Errorf("H2 (T's failed attempt's fresh hold) kept after its roll-back (lock %q, lockf %q); want it removed", v, direct.Get(ctx, "lp:lockf:"+key).Val())
	}
}
