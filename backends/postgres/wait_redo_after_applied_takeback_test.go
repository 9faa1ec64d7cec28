package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestWaitRedoOfAppliedTakeBackDropsJoinedHold: a take-back (dropGrant)
// whose COMMIT reached the database but whose reply was lost reports an
// error, and the WAIT redoes it (redo) in its next try: one hold of the
// row taken twice. When another connection's LOCK of the same token joined
// the row (a reentry, told it holds the key) before the take-back, the
// take-back took the lost grant's hold and the redo takes the joined one:
// the row goes, the WAIT's retry is granted a fresh row of one hold, and
// two LOCKs answered OK share one hold. The first UNLOCK frees the key
// while the other holder still holds it, and another token is granted it.
//
//  1. A's LOCK … WAIT grants row F; its COMMIT applies, the reply is lost.
//  2. Another connection's LOCK of A joins F: 2 holds, told OK.
//  3. The take-back of F applies (1 hold), its reply lost: error, redo F.
//  4. The retry redoes F (the joined hold: the row goes), grants F′.
func TestWaitRedoOfAppliedTakeBackDropsJoinedHold(t *testing.T) {
	pg, p := testDB(t)
	ctx := context.Background()
	other := newTestBackend(t, pg, p, 2) // the same token's other connection, through another instance
	direct := pg.Conn(t)
	holdsOf := func(token string) int64 {
		var n int64
		if err := direct.QueryRow(ctx, `SELECT COALESCE(sum(holds), 0) FROM `+p+`holds WHERE key = 'k' AND token = $1 AND expires_at > clock_timestamp()`, token).Scan(&n); err != nil {
			t.Error(err)
		}
		return n
	}
	var joined backends.Lease
	var joinErr error
	px := startCommitProxy(t, pg.Addr,
		commitFault{apply: true, hook: func() time.Duration { // 1, 2: the grant's COMMIT went; A joins its row
			joined, joinErr = other.Lock(ctx, backends.LockRequest{Key: "k", Token: "A", TTL: time.Minute})
			return 0
		}},
		commitFault{apply: true, hook: func() time.Duration { // 3: the take-back's COMMIT went; its reply is lost
			for deadline := time.Now().Add(5 * time.Second); holdsOf("A") != 1 && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			}
			return 1500 * time.Millisecond
		}},
	)
	dsn := strings.Replace(pg.DSN(), pg.Addr, px.addr, 1)
	b, err := New(Config{DSN: dsn, TablePrefix: p, SweepInterval: time.Hour,
		DriftFactor: 0.01, DriftMin: 2 * time.Millisecond, PoolSize: 4, OpTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	waitListening(t, b)

	px.arm()
	la, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "A", TTL: time.Minute, Wait: 20 * time.Second})
	t.Logf("A's LOCK WAIT: %+v, %v; the other connection's LOCK of A: %+v, %v; COMMITs hooked: %d", la, err, joined, joinErr, px.fired())
	if px.fired() != 2 || joinErr != nil || joined.Holds != 2 {
		t.Fatalf("the scenario did not run (hooks %d, join %+v %v): the test has no teeth", px.fired(), joined, joinErr)
	}
	if err != nil {
		t.Fatalf("A's LOCK WAIT 20 s: %v; want granted", err)
	}
	if n := holdsOf("A"); n != 2 {
		t.Errorf("two LOCKs of A answered OK (the other connection's joined, the WAIT's) and none released, but A's rows have %d hold(s); want 2", n)
	}
	if ok, err := other.Unlock(ctx, "k", "A"); !ok || err != nil {
		t.Fatalf("the other connection's UNLOCK of A = %v, %v", ok, err)
	}
	if lb, err := other.Lock(ctx, backends.LockRequest{Key: "k", Token: "B", TTL: time.Minute}); err == nil {
		t.Errorf("B granted k (%+v) while the WAIT's LOCK of A, answered OK and never released, still holds it", lb)
	}
}
