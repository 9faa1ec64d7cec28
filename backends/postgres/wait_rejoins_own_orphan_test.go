package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestWaitAfterAmbiguousCommitLeavesNoExtraHold: a LOCK … WAIT whose
// first grant's COMMIT reaches the database but whose reply is lost (the
// database's connections drop right after it, as in a crash or failover
// just after the commit record), during an outage that also fails the
// background dropGrant (it gets no connection). Since 1ed09a9 the WAIT goes
// on trying through the outage; once the database is back its retry, of
// the same token, finds the committed row of its own lost grant and joins
// it as a reentry: the client, which sent one LOCK, is told it holds the
// key while the row has two holds, and its one UNLOCK (answered 1) leaves
// the key held for a whole lease. Before, the LOCK answered -NOQUORUM at
// once and held nothing.
func TestWaitAfterAmbiguousCommitLeavesNoExtraHold(t *testing.T) {
	pg, p := testDB(t)
	proxy := startCommitProxy(t, pg.Addr, commitFault{apply: true, down: 1500 * time.Millisecond})
	dsn := strings.Replace(pg.DSN(), pg.Addr, proxy.addr, 1)
	b, err := New(Config{DSN: dsn, TablePrefix: p, SweepInterval: time.Hour,
		DriftFactor: 0.01, DriftMin: 2 * time.Millisecond, PoolSize: 4, OpTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	waitListening(t, b)
	ctx := context.Background()

	// The next COMMIT is relayed to the database, then every connection
	// is cut and new ones refused for 1.5 s.
	proxy.arm()
	start := time.Now()
	la, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "A", TTL: time.Minute, Wait: 20 * time.Second})
	t.Logf("A's LOCK WAIT 20 s through the cut: %+v, %v after %v (cut: %v)", la, err, time.Since(start).Round(time.Millisecond), proxy.fired())
	if proxy.fired() == 0 {
		t.Fatal("the proxy never saw the grant's COMMIT: the test has no teeth")
	}
	if err != nil {
		t.Fatalf("A's LOCK WAIT 20 s, the database back after 1.5 s: %v; want granted", err)
	}
	var holds int64
	conn := pg.Conn(t)
	if err := conn.QueryRow(ctx, `SELECT COALESCE(sum(holds), 0) FROM `+p+`holds WHERE key = 'k' AND token = 'A' AND expires_at > clock_timestamp()`).Scan(&holds); err != nil {
		t.Fatal(err)
	}
	if la.Holds != 1 || holds != 1 {
		t.Errorf("after one LOCK (granted, Holds %d) A's row has %d hold(s); want 1: the retry joined the row of its own lost grant", la.Holds, holds)
	}
	if ok, err := b.Unlock(ctx, "k", "A"); !ok || err != nil {
		t.Fatalf("A's UNLOCK = %v, %v", ok, err)
	}
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "B", TTL: time.Minute}); err != nil {
		t.Errorf("B's LOCK after A's one LOCK and one UNLOCK = %v; want granted (the key is held by A's lost grant for a lease)", err)
	}
}
