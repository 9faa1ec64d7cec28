package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestWaitRedoNotForgottenAfterSecondLostCommit: a LOCK … WAIT whose
// first grant (fence F1) commits with its reply lost during an outage
// that also fails its take-back must redo that take-back in its next try
// (redo). When that try, which drops F1's hold and inserts F2 in one
// transaction, loses its COMMIT too — this time before the database got it,
// so F1's row stays and F2 never was — and F2's take-back fails as well,
// the loop must still remember F1: it kept only F2 (redo = lost.fence
// overwrote F1), redid a take-back of a row that does not exist, and its
// next try found F1's row live and joined it as a reentry: one LOCK, a row
// of two holds, and its one UNLOCK left the key held for a whole lease.
func TestWaitRedoNotForgottenAfterSecondLostCommit(t *testing.T) {
	pg, p := testDB(t)
	px := startCommitProxy(t, pg.Addr,
		commitFault{apply: true, down: 1500 * time.Millisecond},  // F1 committed, reply lost
		commitFault{apply: false, down: 1500 * time.Millisecond}, // F1's drop and F2 lost before COMMIT
	)
	dsn := strings.Replace(pg.DSN(), pg.Addr, px.addr, 1)
	b, err := New(Config{DSN: dsn, TablePrefix: p, SweepInterval: time.Hour,
		DriftFactor: 0.01, DriftMin: 2 * time.Millisecond, PoolSize: 4, OpTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	waitListening(t, b)
	ctx := context.Background()

	px.arm()
	start := time.Now()
	la, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "A", TTL: time.Minute, Wait: 20 * time.Second})
	t.Logf("A's LOCK WAIT 20 s through two lost COMMITs: %+v, %v after %v (faults: %d)", la, err, time.Since(start).Round(time.Millisecond), px.fired())
	if px.fired() != 2 {
		t.Fatalf("the proxy cut %d COMMITs; want 2: the test has no teeth", px.fired())
	}
	if err != nil {
		t.Fatalf("A's LOCK WAIT 20 s, the database back after each 1.5 s outage: %v; want granted", err)
	}
	var holds int64
	if err := pg.Conn(t).QueryRow(ctx, `SELECT COALESCE(sum(holds), 0) FROM `+p+`holds WHERE key = 'k' AND token = 'A' AND expires_at > clock_timestamp()`).Scan(&holds); err != nil {
		t.Fatal(err)
	}
	if la.Holds != 1 || holds != 1 {
		t.Errorf("after one LOCK (granted, Holds %d) A's rows have %d hold(s); want 1: the retry joined the row of its first lost grant", la.Holds, holds)
	}
	if ok, err := b.Unlock(ctx, "k", "A"); !ok || err != nil {
		t.Fatalf("A's UNLOCK = %v, %v", ok, err)
	}
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "B", TTL: time.Minute}); err != nil {
		t.Errorf("B's LOCK after A's one LOCK and one UNLOCK = %v; want granted (A's first lost grant holds the key for a lease)", err)
	}
}
