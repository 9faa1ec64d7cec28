package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestRenewUnlockUnderSerializableDefault: on a database whose
// default_transaction_isolation is serializable (or repeatable read), a
// RENEW and an UNLOCK that wait for a holder's row another transaction
// updates (a renewal or a release of another hold of the same token, a
// grant's reentry) still succeed once it commits. They are single
// statements, run at the session's default isolation: at serializable a
// row updated since the statement's snapshot fails it with SQLSTATE 40001
// (could not serialize access due to concurrent update), which the client
// got as -NOQUORUM and a KEEPALIVE watchdog took for a lost lock.
func TestRenewUnlockUnderSerializableDefault(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, b, conn, _ := serializableDB(ctx, t)
	const key = "ser-key"
	for i := 0; i < 2; i++ { // two holds of token A
		if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "A", TTL: time.Minute}); err != nil {
			t.Fatalf("LOCK %d = %v", i+1, err)
		}
	}
	for _, op := range []struct {
		name string
		run  func() error
	}{
		{"RENEW", func() error {
			v, err := b.Renew(ctx, key, "A", time.Minute)
			if err == nil && v <= 0 {
				err = fmt.Errorf("validity %v", v)
			}
			return err
		}},
		{"UNLOCK", func() error {
			ok, err := b.Unlock(ctx, key, "A")
			if err == nil && !ok {
				err = fmt.Errorf("not held")
			}
			return err
		}},
	} {
		// Another transaction updates the row (as a renewal of the same
		// token does) and commits while op waits for it.
		tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `UPDATE `+b.n.holds+` SET expires_at = expires_at + interval '1 second' WHERE key = $1`, key); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- op.run() }()
		time.Sleep(200 * time.Millisecond) // op is waiting for the row
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s after a concurrent update of the row = %v; want success", op.name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s not answered", op.name)
		}
	}
}

// TestTakeBackOfLateReentryUnderSerializableDefault: a reentrant LOCK
// whose reply comes too late to be of use (its COMMIT held by a deferred
// trigger past its 200 ms lease) is answered no, and the hold it added is
// taken back in the background (dropReentry). On a database whose
// default_transaction_isolation is serializable, that take-back, one
// statement at the session's default isolation, waited for the row
// another transaction was updating (here a direct UPDATE; the holder's
// RENEW or KEEPALIVE renewal does the same) and failed with SQLSTATE
// 40001 once it committed: the token kept one hold more than its holder
// was told of, and the holder's one UNLOCK left the key held by no one
// for the rest of the lease (a minute here; for good while a watchdog
// renews it). It is run again, as RENEW and UNLOCK are.
func TestTakeBackOfLateReentryUnderSerializableDefault(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, b, conn, watch := serializableDB(ctx, t)
	for _, q := range []string{
		`CREATE FUNCTION ` + p + `slow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN IF NEW.holds > OLD.holds THEN ` + gateSQL("1") + `; END IF; RETURN NULL; END $$`,
		`CREATE CONSTRAINT TRIGGER slow AFTER UPDATE ON ` + b.n.holds + ` DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ` + p + `slow()`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	holdsOf := func(key string) (holds int64) {
		t.Helper()
		if err := watch.QueryRow(ctx, `SELECT holds FROM `+b.n.holds+` WHERE key = $1 AND token = 'A'`, key).Scan(&holds); err != nil {
			t.Fatal(err)
		}
		return holds
	}
	// round runs the race on key and reports whether the take-back came
	// to the row after the update got it, as it does nearly always: as
	// the reentry commits, the update, queued, gets the row before the
	// take-back is sent, unless the server does not run it at once.
	round := func(key string) (raced bool) {
		t.Helper()
		if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "A", TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		release := holdGate(t, watch, 1)
		start := time.Now()
		reentry := make(chan error, 1)
		go func() {
			l, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "A", TTL: 200 * time.Millisecond})
			if err == nil {
				err = fmt.Errorf("granted %+v", l)
			}
			reentry <- err
		}()
		waitGate(t, watch, 1) // the reentry's COMMIT, held by the trigger
		tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		updated := make(chan error, 1)
		go func() {
			_, err := tx.Exec(ctx, `UPDATE `+b.n.holds+` SET expires_at = expires_at + interval '1 second' WHERE key = $1`, key)
			updated <- err
		}()
		waitActivity(t, watch, "the update queued behind the reentry", `wait_event_type = 'Lock' AND query LIKE 'UPDATE%'`)
		time.Sleep(300*time.Millisecond - time.Since(start)) // past the reentry's lease
		release()
		if err := <-reentry; !errors.Is(err, backends.ErrNotAcquired) {
			t.Fatalf("reentry answering after 300 ms with a 200 ms lease = %v; want not acquired", err)
		}
		if err := <-updated; err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			var n int
			if err := watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
	AND wait_event_type = 'Lock' AND query LIKE 'WITH target%'`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n > 0 {
				break // the take-back waits for the updated row
			}
			if holdsOf(key) == 1 {
				return false // the take-back got the row first and is done
			}
			if time.Now().After(deadline) {
				t.Fatal("the take-back neither done nor waiting for the row 10 s after the reentry was answered")
			}
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return true
	}
	key := ""
	for i := 0; ; i++ {
		if i == 5 {
			t.Fatal("in 5 rounds the take-back never came to the row after the update")
		}
		key = fmt.Sprintf("late-reentry-%d", i)
		if round(key) {
			break
		}
		t.Logf("round %d: the take-back got the row before the update; again", i)
	}
	var holds int64
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if holds = holdsOf(key); holds == 1 || time.Now().After(deadline) {
			break
		}
	}
	if holds != 1 {
		t.Errorf("A's holds 5 s after its late reentry was answered no = %d; want 1 (the reentry's hold taken back)", holds)
	}
	if ok, err := b.Unlock(ctx, key, "A"); !ok || err != nil {
		t.Fatalf("A's UNLOCK = %v, %v", ok, err)
	}
	if l, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "B", TTL: time.Minute}); err != nil {
		t.Errorf("B's LOCK after A's one UNLOCK of its one granted hold = %+v, %v; want granted", l, err)
	}
}

// TestSweepUnderSerializableDefault: on a database whose
// default_transaction_isolation is serializable, the sweep's DELETE, one
// statement at the session's default isolation, is rolled back (SQLSTATE
// 40001) when a serializable transaction that ran beside it read rows it
// deleted and wrote where it read (here a direct one, while a trigger
// holds the sweep's DELETE). The sweep must run it again.
// Before, the pass over the table ended there: its expired rows stayed
// until the next sweep, a sweep_interval later, their keys' waiters were
// not woken when the leases ran out, and a backlog was not caught up.
func TestSweepUnderSerializableDefault(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p, b, conn, watch := serializableDB(ctx, t)
	insertExpired := `INSERT INTO ` + b.n.holds + ` (key, token, mode, holds, expires_at, fence)
SELECT k, 't', 0, 1, clock_timestamp() - interval '1 hour', 1 FROM unnest($1::text[]) k`
	for _, q := range []string{
		`CREATE FUNCTION ` + p + `slow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN IF OLD.key = 'e1' THEN ` + gateSQL("1") + `; END IF; RETURN NULL; END $$`,
		`CREATE TRIGGER slow AFTER DELETE ON ` + b.n.holds + ` FOR EACH ROW EXECUTE FUNCTION ` + p + `slow()`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, insertExpired, []string{"e1", "e2"}); err != nil {
		t.Fatal(err)
	}
	release := holdGate(t, watch, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.sweepPass()
	}()
	waitGate(t, watch, 1) // the sweep's DELETE, held by the trigger
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+b.n.holds+` WHERE key = 'e2'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, insertExpired, []string{"e3"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	release()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("sweep not done after 20 s")
	}
	var left []string
	rows, err := conn.Query(ctx, `SELECT key FROM `+b.n.holds+` ORDER BY key`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		left = append(left, k)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("expired rows left by the sweep = %v (swept %d); want none", left, b.Swept())
	}
}

// TestUnmarkWriterUnderSerializableDefault: a waiting writer that gives
// up deletes its marker (unmarkWriter), one statement at the session's
// default isolation. On a database whose default_transaction_isolation is
// serializable, a serializable transaction beside it that read the marker
// and wrote where the DELETE read (here a direct one, while a trigger
// holds the DELETE) has it rolled back (SQLSTATE 40001). It must be
// run again. Before, the marker stayed until it expired: new readers of
// the key, on every instance, were held back up to writerMarkTTL (3 s)
// behind a writer that no longer waited.
func TestUnmarkWriterUnderSerializableDefault(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p, b, conn, watch := serializableDB(ctx, t)
	const key, marker = "k", "gave-up"
	if err := b.markWriter(ctx, key, marker); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE FUNCTION ` + p + `slow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN ` + gateSQL("1") + `; RETURN NULL; END $$`,
		`CREATE TRIGGER slow AFTER DELETE ON ` + b.n.waiters + ` FOR EACH ROW EXECUTE FUNCTION ` + p + `slow()`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	release := holdGate(t, watch, 1)
	b.unmarkWriter(ctx, key, marker) // answers after unmarkWait; the DELETE goes on
	waitGate(t, watch, 1)            // the marker's DELETE, held by the trigger
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+b.n.waiters).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+b.n.waiters+` (key, waiter, expires_at) VALUES ('other', 'w', clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	release()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+b.n.waiters+` WHERE waiter = $1`, marker).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the marker of a writer that gave up still there 5 s later; want it deleted")
		}
	}
}

// TestUnlockRolledBackRepeatedlyUnderSerializableDefault: on a database
// whose default_transaction_isolation is serializable, UNLOCK's statement
// is rolled back (SQLSTATE 40001) whenever a serializable transaction
// beside it read the row it deletes and wrote where it read; renewals
// and releases of a key's holders do so to each other (the rows of a
// small table share their pages), and on a key several clients renew and
// release, one statement was rolled back three times in a row now and
// then. Here three such transactions in turn (each while a trigger holds
// one run of the statement) roll back three runs. UNLOCK must go on
// running it within its op_timeout. Before, it gave up after three runs
// and answered -NOQUORUM (transaction rolled back), though the fourth run
// released the lock; RENEW and the KEEPALIVE watchdog's renewals and
// releases likewise.
func TestUnlockRolledBackRepeatedlyUnderSerializableDefault(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p, b, conn, watch := serializableDB(ctx, t)
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "A", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	// Run n of the statement waits for gate n.
	for _, q := range []string{
		`CREATE SEQUENCE ` + p + `runs`,
		`CREATE FUNCTION ` + p + `slow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN ` + gateSQL(`nextval('`+p+`runs')`) + `; RETURN NULL; END $$`,
		`CREATE TRIGGER slow AFTER DELETE ON ` + b.n.holds + ` FOR EACH ROW EXECUTE FUNCTION ` + p + `slow()`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	const rolledBack = 3
	var release [rolledBack + 1]func()
	for n := 1; n <= rolledBack; n++ {
		release[n] = holdGate(t, watch, n)
	}
	type answer struct {
		ok  bool
		err error
	}
	done := make(chan answer, 1)
	go func() {
		ok, err := b.Unlock(ctx, "k", "A")
		done <- answer{ok, err}
	}()
	for n := 1; n <= rolledBack; n++ {
		waitGate(t, watch, n)
		tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
		if err != nil {
			t.Fatal(err)
		}
		var rows int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+b.n.holds).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+b.n.holds+` (key, token, mode, holds, expires_at, fence)
VALUES ($1, 'B', 0, 1, clock_timestamp() + interval '1 minute', 1)`, fmt.Sprintf("other-%d", n)); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		release[n]()
	}
	select {
	case a := <-done:
		if !a.ok || a.err != nil {
			t.Errorf("UNLOCK whose statement was rolled back %d times in a row = %v, %v; want released", rolledBack, a.ok, a.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("UNLOCK not answered after 20 s")
	}
	var left int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+b.n.holds+` WHERE key = 'k'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("A's row after its UNLOCK: %d left; want none", left)
	}
}

// serializableDB makes a database of t's own whose default isolation is
// serializable, where statements that meet a row another transaction
// changed are rolled back (SQLSTATE 40001), and returns its table prefix,
// a Backend on it and two direct connections, closed at the end of t: conn
// for the test's own transactions, watch to look at the gate and the
// sessions from outside them.
func serializableDB(ctx context.Context, t *testing.T) (prefix string, b *Backend, conn, watch *pgx.Conn) {
	t.Helper()
	return serializableDBPool(ctx, t, 0)
}

// serializableDBPool is serializableDB with a Backend whose pool has
// pool connections (0: pgx's default).
func serializableDBPool(ctx context.Context, t *testing.T, pool int32) (prefix string, b *Backend, conn, watch *pgx.Conn) {
	t.Helper()
	pg, p := testDB(t)
	db := strings.TrimSuffix(p, "_") + "_ser"
	dsn := newDatabase(t, pg, db, "", "ALTER DATABASE "+db+" SET default_transaction_isolation = 'serializable'")
	b, err := New(Config{DSN: dsn, TablePrefix: p, SweepInterval: time.Hour,
		DriftFactor: 0.01, DriftMin: 2 * time.Millisecond, PoolSize: pool})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	for _, c := range []**pgx.Conn{&conn, &watch} {
		var err error
		if *c, err = pgx.Connect(ctx, dsn); err != nil {
			t.Fatalf("connect to %s: %v", db, err)
		}
		cc := *c
		t.Cleanup(func() { cc.Close(context.Background()) })
	}
	return p, b, conn, watch
}

// TestReadsUnderSerializableDefault: LOCKINFO and the /readyz check
// (Ready) read the lock tables in one statement, at the session's default
// isolation. On a database whose default_transaction_isolation is
// serializable, a read that started before a transaction (the pivot)
// committed and reads that transaction's row after has it rolled back
// (SQLSTATE 40001, "canceled on conflict out to pivot, during read") when
// the pivot itself read what a third transaction that committed before it
// wrote: the read-only anomaly serializable isolation rules out. Here the
// pivot and the third transaction are direct ones on the key's row and
// another's, and the read waits, its snapshot taken, behind a LOCK TABLE
// queued behind the pivot. On a hot key, grants, renewals and releases
// make the same pattern now and then. The read must be run again (its
// new snapshot sees the pivot committed). Before, LOCKINFO answered
// -NOQUORUM … transaction rolled back, and /readyz sent clients away from
// a working instance.
func TestReadsUnderSerializableDefault(t *testing.T) {
	for _, tc := range []struct {
		name  string
		op    retryOp
		run   func(ctx context.Context, b *Backend) error
		query string // how pg_stat_activity shows the read
	}{
		{"LOCKINFO", opInfo, func(ctx context.Context, b *Backend) error {
			info, ok, err := b.Info(ctx, "k")
			if err == nil && (!ok || len(info.Holders) != 1) {
				err = fmt.Errorf("LOCKINFO %+v, %v; want A's hold", info, ok)
			}
			return err
		}, "SELECT token%"},
		{"Ready", opReady, func(ctx context.Context, b *Backend) error { return b.Ready(ctx) }, "SELECT current_setting(%"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			// One pooled connection: the read's statement is prepared on it
			// beforehand, so that it waits for the table's lock after
			// taking its snapshot, not while being prepared.
			_, b, pivot, watch := serializableDBPool(ctx, t, 1)
			locker, err := pgx.ConnectConfig(ctx, b.pool.Config().ConnConfig.Copy())
			if err != nil {
				t.Fatal(err)
			}
			defer locker.Close(context.Background())
			if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "A", TTL: time.Minute}); err != nil {
				t.Fatal(err)
			}
			if err := tc.run(ctx, b); err != nil {
				t.Fatal(err)
			}
			// The pivot reads the holds, then a transaction that commits
			// first writes one, then the pivot updates the key's row.
			ptx, err := pivot.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = ptx.Rollback(context.Background()) }()
			var n int
			if err := ptx.QueryRow(ctx, `SELECT count(*) FROM `+b.n.holds).Scan(&n); err != nil {
				t.Fatal(err)
			}
			otx, err := watch.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := otx.Exec(ctx, `INSERT INTO `+b.n.holds+` (key, token, mode, holds, expires_at, fence)
VALUES ('other', 'B', 0, 1, clock_timestamp() + interval '1 minute', 1)`); err != nil {
				t.Fatal(err)
			}
			if err := otx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := ptx.Exec(ctx, `UPDATE `+b.n.holds+` SET expires_at = expires_at + interval '1 second' WHERE key = 'k'`); err != nil {
				t.Fatal(err)
			}
			ltx, err := locker.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = ltx.Rollback(context.Background()) }()
			locked := make(chan error, 1)
			go func() {
				_, err := ltx.Exec(ctx, `LOCK TABLE `+b.n.holds+` IN ACCESS EXCLUSIVE MODE`)
				locked <- err
			}()
			waitActivity(t, watch, "the LOCK TABLE queued behind the pivot", `wait_event_type = 'Lock' AND query LIKE 'LOCK TABLE%'`)
			done := make(chan error, 1)
			go func() { done <- tc.run(ctx, b) }()
			waitActivity(t, watch, "the read queued behind the LOCK TABLE", `wait_event_type = 'Lock' AND query LIKE '`+tc.query+`'`)
			if err := ptx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-locked; err != nil {
				t.Fatal(err)
			}
			if err := ltx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("%s after a serializable conflict out to a committed pivot = %v; want it run again and answered", tc.name, err)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("%s not answered", tc.name)
			}
			if got := b.retryCounts()[tc.op.String()+" 40001"]; got < 1 {
				t.Errorf("%s run again %d times for SQLSTATE 40001; want at least once (the anomaly not made?)", tc.name, got)
			}
			if got := scrapeRetries(t, b, tc.op.String(), "40001"); got < 1 {
				t.Errorf("lockproxy_postgres_statement_retries_total{op=%q,sqlstate=\"40001\"} = %v; want at least 1", tc.op, got)
			}
		})
	}
}

// scrapeRetries is lockproxy_postgres_statement_retries_total of op and
// sqlstate, as b's Collector exports it.
func scrapeRetries(t *testing.T, b *Backend, op, sqlstate string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(b.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "lockproxy_postgres_statement_retries_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if len(labels) != 2 {
				t.Errorf("retries metric with labels %v; want op and sqlstate only", labels)
			}
			if labels["op"] == op && labels["sqlstate"] == sqlstate {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no lockproxy_postgres_statement_retries_total{op=%q,sqlstate=%q}", op, sqlstate)
	return 0
}

// TestWaitingWriterMarkerUnderSerializableDefault: a waiting writer's
// marker (markWriter) is one statement at the session's default
// isolation. On a database whose default_transaction_isolation is
// serializable, its commit is rolled back (SQLSTATE 40001, "canceled on
// commit attempt with conflict in from prepared pivot") when a
// transaction that read the waiting writers after the marker's insert is
// committing (here held there by a synchronous standby that never
// answers; on a hot key, in the instant of its commit, as another
// writer's marker removal or the sweep) and itself wrote what a third,
// open transaction read. The marker must be run again. Before, the writer
// went on waiting without its marker (new readers let in ahead of it) or,
// its WAIT over by then, answered -NOQUORUM … transaction rolled back
// instead of not acquired. The marker's first run is held by a trigger
// until the WAIT is over; its second run, if any, until the other two
// transactions ended.
func TestWaitingWriterMarkerUnderSerializableDefault(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pg := harness.StartPostgres(t) // a server of its own: synchronous replication is server-wide
	const p = "mark_"
	execAll(t, pg, `CREATE TABLE sync_probe (x int)`,
		`ALTER DATABASE postgres SET synchronous_commit = local`,
		`ALTER DATABASE postgres SET default_transaction_isolation = 'serializable'`)
	execAll(t, pg, `ALTER SYSTEM SET synchronous_standby_names = 'lockproxy_no_such_standby'`, `SELECT pg_reload_conf()`)
	waitSyncRep(t, pg)
	b, err := New(Config{DSN: pg.DSN(), TablePrefix: p, SweepInterval: time.Hour, PoolSize: 2,
		DriftFactor: 0.01, DriftMin: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	// Run n of the marker's statement waits for gate n.
	execAll(t, pg, `CREATE SEQUENCE `+p+`runs`,
		`CREATE FUNCTION `+p+`slow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN `+gateSQL(`nextval('`+p+`runs')`)+`; RETURN NULL; END $$`,
		`CREATE TRIGGER slow AFTER INSERT OR UPDATE ON `+b.n.waiters+` FOR EACH ROW WHEN (NEW.key = 'k') EXECUTE FUNCTION `+p+`slow()`)
	open, pivot, watch := pg.Conn(t), pg.Conn(t), pg.Conn(t)
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "A", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	release1, release2 := holdGate(t, watch, 1), holdGate(t, watch, 2)
	otx, err := open.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = otx.Rollback(context.Background()) }()
	var n int
	if err := otx.QueryRow(ctx, `SELECT count(*) FROM `+b.n.waiters).Scan(&n); err != nil {
		t.Fatal(err)
	}
	ptx, err := pivot.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ptx.Exec(ctx, `SET LOCAL synchronous_commit = on`); err != nil {
		t.Fatal(err)
	}
	if _, err := ptx.Exec(ctx, `INSERT INTO `+b.n.waiters+` (key, waiter, expires_at) VALUES ('x', 'x', clock_timestamp() + interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	const wait = 300 * time.Millisecond
	start := time.Now()
	locked := make(chan error, 1)
	go func() {
		l, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "W", TTL: time.Minute, Wait: wait})
		if err == nil {
			err = fmt.Errorf("granted %+v", l)
		}
		locked <- err
	}()
	waitGate(t, watch, 1) // the marker's first run, inserted
	if err := ptx.QueryRow(ctx, `SELECT count(*) FROM `+b.n.waiters).Scan(&n); err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithCancel(ctx)
	defer pcancel()
	committed := make(chan error, 1)
	go func() { committed <- ptx.Commit(pctx) }()
	waitActivity(t, watch, "the pivot's COMMIT waiting for the standby", `wait_event = 'SyncRep'`)
	time.Sleep(time.Until(start.Add(wait + 100*time.Millisecond))) // the WAIT is over
	release1()
	var lerr error
	select {
	case lerr = <-locked:
	case <-gateWaiting(ctx, watch, 2): // the marker's second run
		if err := otx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		pcancel() // the COMMIT stops waiting for the standby, committed
		<-committed
		release2()
		lerr = <-locked
		if got := b.retryCounts()["mark_writer 40001"]; got < 1 {
			t.Errorf("marker run again %d times for SQLSTATE 40001; want at least once", got)
		}
	}
	if !errors.Is(lerr, backends.ErrNotAcquired) {
		t.Errorf("LOCK … WAIT whose writer marker's commit was rolled back = %v; want not acquired", lerr)
	}
	pcancel()
	release2()
}

// gateWaiting is closed once a session of conn's database waits for gate
// n (as waitGate waits), or never.
func gateWaiting(ctx context.Context, conn *pgx.Conn, n int) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		for ctx.Err() == nil {
			var waiting bool
			err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_database d ON d.oid = l.database
WHERE d.datname = current_database() AND l.locktype = 'advisory' AND l.classid = 7426031 AND l.objid = $1 AND l.objsubid = 2 AND NOT l.granted)`,
				n).Scan(&waiting)
			if err == nil && waiting {
				close(ch)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	return ch
}

// TestTakeBackRunAgainAfterDeadlock: the take-back of a grant whose
// caller was told no (dropGrant) is one transaction, READ COMMITTED; one
// the database picks as a deadlock's victim (SQLSTATE 40P01; here raised
// once by a trigger on its DELETE) is rolled back before its COMMIT and
// must be run again. Before, it failed: the row kept the key for its
// lease (a minute here), or a waiting caller's next try had to redo it.
func TestTakeBackRunAgainAfterDeadlock(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 4)
	ctx := context.Background()
	lease, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "A", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	execAll(t, pg,
		`CREATE SEQUENCE `+p+`raised`,
		`CREATE FUNCTION `+p+`deadlock_once() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
	IF nextval('`+p+`raised') = 1 THEN RAISE EXCEPTION 'deadlock detected (test)' USING ERRCODE = '40P01'; END IF;
	RETURN OLD; END $$`,
		`CREATE TRIGGER deadlock_once BEFORE DELETE ON `+p+`holds FOR EACH ROW EXECUTE FUNCTION `+p+`deadlock_once()`,
	)
	select {
	case err := <-b.dropGrant(b.storable(backends.LockRequest{Key: "k", Token: "A"}), lease.Fence):
		if err != nil {
			t.Errorf("take-back rolled back once for a deadlock = %v; want it run again and done", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("take-back not done after 10 s")
	}
	var rows int
	if err := pg.Conn(t).QueryRow(ctx, `SELECT count(*) FROM `+p+`holds WHERE key = 'k'`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Errorf("A's row after its take-back: %d left; want none", rows)
	}
	if got := b.retryCounts()["take_back 40P01"]; got != 1 {
		t.Errorf("take-back run again %d times for SQLSTATE 40P01; want once", got)
	}
}
