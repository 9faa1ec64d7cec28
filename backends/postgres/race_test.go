package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestRenewInFlightNotTwoHolders: A's lease ends at T. A's RENEW updates
// the row just before T and commits late (a deferred trigger sleeps at
// commit, as a sync-rep wait or an fsync stall would). B's grant runs its
// lazy DELETE before T (A's row live: kept) and reads the key's rows
// after T (an expired decoy row's DELETE trigger stretches the gap). B
// must wait for A's RENEW and see the renewed row: never both B granted
// and A's RENEW valid.
func TestRenewInFlightNotTwoHolders(t *testing.T) {
	pg, p := testDB(t)
	a := newTestBackend(t, pg, p, 4)
	b := newTestBackend(t, pg, p, 4)
	ctx := context.Background()
	execAll(t, pg,
		`CREATE FUNCTION `+p+`slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.4); RETURN NULL; END $$`,
		`CREATE CONSTRAINT TRIGGER slow_commit AFTER UPDATE ON `+p+`holds DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION `+p+`slow_commit()`,
		`CREATE FUNCTION `+p+`slow_delete() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF OLD.token = 'decoy' THEN PERFORM pg_sleep(0.1); END IF; RETURN OLD; END $$`,
		`CREATE TRIGGER slow_delete BEFORE DELETE ON `+p+`holds FOR EACH ROW EXECUTE FUNCTION `+p+`slow_delete()`,
	)
	if _, err := a.Lock(ctx, backends.LockRequest{Key: "k", Token: "A", TTL: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	granted := time.Now()
	execAll(t, pg, `INSERT INTO `+p+`holds VALUES ('k', 'decoy', 1, 1, clock_timestamp() - interval '1 s', 0)`)
	T := granted.Add(300 * time.Millisecond)
	renewed := make(chan time.Duration, 1)
	time.Sleep(time.Until(T.Add(-60 * time.Millisecond)))
	go func() {
		v, err := a.Renew(ctx, "k", "A", 5*time.Second)
		if err != nil {
			t.Error(err)
		}
		renewed <- v
	}()
	time.Sleep(time.Until(T.Add(-30 * time.Millisecond)))
	lb, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "B", TTL: 5 * time.Second})
	v := <-renewed
	t.Logf("B's LOCK: %+v, %v; A's RENEW: validity %v", lb, err, v)
	if err == nil && v > 0 {
		t.Errorf("two write holders: B granted (fence %d) and A's RENEW valid for %v", lb.Fence, v)
	}
}

// TestLateReplyNoValidity: a RENEW, and a reentrant LOCK, whose commit is
// slow (a deferred trigger sleeps 60 ms at commit) reply after the 20 ms
// lease they set ended: the RENEW reports 0 (not renewed), the LOCK is not
// acquired and its hold is taken back.
func TestLateReplyNoValidity(t *testing.T) {
	pg, p := testDB(t)
	a := newTestBackend(t, pg, p, 4)
	ctx := context.Background()
	for _, key := range []string{"k", "k2"} {
		if _, err := a.Lock(ctx, backends.LockRequest{Key: key, Token: "A", TTL: 10 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	execAll(t, pg,
		`CREATE FUNCTION `+p+`slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.06); RETURN NULL; END $$`,
		`CREATE CONSTRAINT TRIGGER slow AFTER UPDATE ON `+p+`holds DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION `+p+`slow()`,
	)
	lease, err := a.Lock(ctx, backends.LockRequest{Key: "k", Token: "A", TTL: 20 * time.Millisecond})
	if !errors.Is(err, backends.ErrNotAcquired) {
		t.Errorf("reentrant LOCK PX 20 replying after 60 ms = %+v, %v; want not acquired", lease, err)
	}
	if v, err := a.Renew(ctx, "k2", "A", 20*time.Millisecond); err != nil || v != 0 {
		t.Errorf("RENEW PX 20 replying after 60 ms = %v, %v; want 0", v, err)
	}
	conn := pg.Conn(t)
	var holds int64
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if err := conn.QueryRow(ctx, `SELECT holds FROM `+p+`holds WHERE key = 'k' AND token = 'A'`).Scan(&holds); err != nil {
			t.Fatal(err)
		}
		if holds == 1 || time.Now().After(deadline) {
			break
		}
	}
	if holds != 1 {
		t.Errorf("holds after the late reentrant LOCK = %d; want 1 (its hold taken back)", holds)
	}
}

// TestSweepSkipsLockedRows: the sweep leaves an expired row another
// transaction has locked (a grant's lazy DELETE, a RENEW) and deletes the
// others without waiting, so it cannot deadlock with that transaction.
func TestSweepSkipsLockedRows(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 4)
	ctx := context.Background()
	execAll(t, pg, `INSERT INTO `+p+`holds SELECT 'k' || g, 't', 0, 1, clock_timestamp() - interval '1 s', g FROM generate_series(1, 3) g`)
	conn := pg.Conn(t)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM `+p+`holds WHERE key = 'k2' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var n, keys int64
	err = b.pool.QueryRow(sctx, b.n.sweepSQL(b.n.holds), sweepBatch).Scan(&n, &keys)
	if err != nil || n != 2 {
		t.Errorf("sweep with one expired row locked elsewhere = %d rows, %v; want the 2 others, at once", n, err)
	}
}

// TestLockRetriesOnceOnRollback: a grant whose transaction the database
// rolls back for a deadlock (SQLSTATE 40P01; here raised once by a
// trigger on the lazy DELETE) is tried once more, and granted.
func TestLockRetriesOnceOnRollback(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 4)
	ctx := context.Background()
	execAll(t, pg,
		`CREATE SEQUENCE `+p+`raised`,
		`CREATE FUNCTION `+p+`deadlock_once() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
	IF nextval('`+p+`raised') = 1 THEN RAISE EXCEPTION 'deadlock detected (test)' USING ERRCODE = '40P01'; END IF;
	RETURN OLD; END $$`,
		`CREATE TRIGGER deadlock_once BEFORE DELETE ON `+p+`holds FOR EACH ROW EXECUTE FUNCTION `+p+`deadlock_once()`,
		`INSERT INTO `+p+`holds VALUES ('k', 'gone', 0, 1, clock_timestamp() - interval '1 s', 0)`,
	)
	lease, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "A", TTL: 10 * time.Second})
	if err != nil || lease.Holds != 1 {
		t.Errorf("LOCK after one deadlock rollback = %+v, %v; want granted", lease, err)
	}
}

// TestWriterMarkerGoneOnReturn: a waiting writer's marker is gone when its
// LOCK returns, granted or given up, so a new reader is not refused after
// it. A trigger slows the marker's DELETE by 200 ms, so a DELETE left to
// run after the return would be seen.
func TestWriterMarkerGoneOnReturn(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 4)
	ctx := context.Background()
	execAll(t, pg,
		`CREATE FUNCTION `+p+`slow_unmark() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.2); RETURN OLD; END $$`,
		`CREATE TRIGGER slow_unmark BEFORE DELETE ON `+p+`waiting_writers FOR EACH ROW EXECUTE FUNCTION `+p+`slow_unmark()`,
	)
	conn := pg.Conn(t)
	markers := func(key string) int {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+p+`waiting_writers WHERE key = $1`, key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	read := func(key, token string) error {
		_, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: token, TTL: time.Minute, Mode: backends.Read})
		return err
	}

	// Granted: the reader r1 releases while the writer waits.
	if err := read("g", "r1"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := b.Lock(ctx, backends.LockRequest{Key: "g", Token: "w", TTL: time.Minute, Wait: 30 * time.Second})
		done <- err
	}()
	for deadline := time.Now().Add(30 * time.Second); markers("g") == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no marker of the waiting writer after 30 s")
		}
	}
	if _, err := b.Unlock(ctx, "g", "r1"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := markers("g"); n != 0 {
		t.Errorf("%d waiting-writer markers left after the writer's grant; want 0", n)
	}
	if _, err := b.Unlock(ctx, "g", "w"); err != nil {
		t.Fatal(err)
	}
	if err := read("g", "r2"); err != nil {
		t.Errorf("a new reader after the writer's grant and release: %v", err)
	}

	// Given up: the wait runs out while r1 still reads.
	if err := read("u", "r1"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "u", Token: "w", TTL: time.Minute, Wait: 300 * time.Millisecond}); !errors.Is(err, backends.ErrNotAcquired) {
		t.Fatalf("writer behind a reader, WAIT 300 = %v; want not acquired", err)
	}
	if n := markers("u"); n != 0 {
		t.Errorf("%d waiting-writer markers left after the writer gave up; want 0", n)
	}
}

// TestIdleTxTimeoutInTransaction: idle_in_transaction_session_timeout is
// set inside a grant's transaction (a trigger records what the grant's
// INSERT saw), not as a startup parameter, which PgBouncer refuses.
func TestIdleTxTimeoutInTransaction(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 1)
	ctx := context.Background()
	execAll(t, pg,
		`CREATE TABLE `+p+`seen (v text)`,
		`CREATE FUNCTION `+p+`record() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
	INSERT INTO `+p+`seen VALUES (current_setting('idle_in_transaction_session_timeout')); RETURN NEW; END $$`,
		`CREATE TRIGGER record AFTER INSERT ON `+p+`holds FOR EACH ROW EXECUTE FUNCTION `+p+`record()`,
	)
	if _, ok := b.pool.Config().ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"]; ok {
		t.Error("idle_in_transaction_session_timeout is a startup parameter")
	}
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "A", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	var inTx, outside string
	if err := b.pool.QueryRow(ctx, `SELECT v FROM `+p+`seen`).Scan(&inTx); err != nil {
		t.Fatal(err)
	}
	if err := b.pool.QueryRow(ctx, `SHOW idle_in_transaction_session_timeout`).Scan(&outside); err != nil {
		t.Fatal(err)
	}
	if inTx != "5s" || outside != "0" {
		t.Errorf("idle_in_transaction_session_timeout in the grant %q, outside %q; want 5s (op_timeout), 0", inTx, outside)
	}
}

// TestWaiterSleepsWithoutQueueing: while the listening connection is up, a
// writer waiting behind a long lease tries again only on a NOTIFY or about
// once a second (a trigger counts its marker's refreshes, one per try),
// and its tries do not queue on the key's advisory lock while another
// transaction holds it (which would hold a pool connection meanwhile).
func TestWaiterSleepsWithoutQueueing(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 4)
	ctx := context.Background()
	execAll(t, pg,
		`CREATE SEQUENCE `+p+`tries`,
		`CREATE FUNCTION `+p+`count_try() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM nextval('`+p+`tries'); RETURN NEW; END $$`,
		`CREATE TRIGGER count_try BEFORE INSERT OR UPDATE ON `+p+`waiting_writers FOR EACH ROW EXECUTE FUNCTION `+p+`count_try()`,
	)
	waitListening(t, b)
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "H", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := b.Lock(wctx, backends.LockRequest{Key: "k", Token: "W", TTL: time.Minute, Wait: time.Minute})
		done <- err
	}()
	conn := pg.Conn(t)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+p+`waiting_writers`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the writer did not wait")
		}
	}
	// Hold the key's advisory lock from another transaction for 1.5 s and
	// watch for a pool connection queued on it.
	holder := pg.Conn(t)
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, b.n.lockKeySQL(), "k"); err != nil {
		t.Fatal(err)
	}
	queued := 0
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		queued = max(queued, n)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var tries int64
	if err := conn.QueryRow(ctx, `SELECT last_value FROM `+p+`tries`).Scan(&tries); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-done
	if queued > 0 {
		t.Errorf("a waiter's try queued on the key's advisory lock (%d waiting)", queued)
	}
	// About 1.5 s of waiting with no NOTIFY: 2 or 3 tries at one a second
	// (the first included); 25–200 ms polling made about 15.
	t.Logf("tries in about 1.5 s: %d; advisory lock waits seen: %d", tries, queued)
	if tries > 5 {
		t.Errorf("the waiter tried %d times in about 1.5 s without a NOTIFY; want at most 5", tries)
	}
}

// TestSequenceCycleRefused: a fence sequence made to CYCLE (fences would
// start again from its minimum) is refused at start, saying how to fix it.
func TestSequenceCycleRefused(t *testing.T) {
	pg, p := testDB(t)
	newTestBackend(t, pg, p, 1) // creates the tables
	execAll(t, pg, `ALTER SEQUENCE `+p+`fence CYCLE`)
	b, err := New(Config{DSN: pg.DSN(), TablePrefix: p, SweepInterval: time.Hour})
	if err == nil {
		b.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "NO CYCLE") {
		t.Errorf("New on a CYCLE fence sequence = %v; want a refusal naming NO CYCLE", err)
	}
}

// TestGrantDropsRowsItFoundExpired: a row that runs out after a grant's
// lazy DELETE (a slow one here: a decoy row's delete sleeps 100 ms) is
// read as expired and goes with the grant, so that no later step back of
// the database's clock can make it live beside the new holder.
func TestGrantDropsRowsItFoundExpired(t *testing.T) {
	pg, p := testDB(t)
	a := newTestBackend(t, pg, p, 4)
	b := newTestBackend(t, pg, p, 4)
	ctx := context.Background()
	execAll(t, pg,
		`CREATE FUNCTION `+p+`slow_delete() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF OLD.token = 'decoy' THEN PERFORM pg_sleep(0.1); END IF; RETURN OLD; END $$`,
		`CREATE TRIGGER slow_delete BEFORE DELETE ON `+p+`holds FOR EACH ROW EXECUTE FUNCTION `+p+`slow_delete()`,
	)
	if _, err := a.Lock(ctx, backends.LockRequest{Key: "k", Token: "A", TTL: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	T := time.Now().Add(300 * time.Millisecond)
	execAll(t, pg, `INSERT INTO `+p+`holds VALUES ('k', 'decoy', 1, 1, clock_timestamp() - interval '1 s', 0)`)
	time.Sleep(time.Until(T.Add(-30 * time.Millisecond)))
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "B", TTL: 5 * time.Second, Wait: 2 * time.Second}); err != nil {
		t.Fatalf("B's LOCK after A's lease ran out: %v", err)
	}
	var n int
	if err := pg.Conn(t).QueryRow(ctx, `SELECT count(*) FROM `+p+`holds WHERE key = 'k' AND token = 'A'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("A's expired row is still there after B's grant (%d rows)", n)
	}
}

// TestReentryNearLeaseEnd: a reentrant RLOCK whose own row is live when
// the FOR SHARE read scans it but runs out while that read waits on another
// holder's row lock (B's RENEW committing slowly) is a grant or "not
// acquired", never an error (it was NOQUORUM: the reentry's UPDATE, which
// re-tested the expiry, matched nothing).
func TestReentryNearLeaseEnd(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 4)
	ctx := context.Background()
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "A", Mode: backends.Read, TTL: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	T := time.Now().Add(300 * time.Millisecond)
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "B", Mode: backends.Read, TTL: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	execAll(t, pg,
		`CREATE FUNCTION `+p+`slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.token = 'B' THEN PERFORM pg_sleep(0.4); END IF; RETURN NULL; END $$`,
		`CREATE CONSTRAINT TRIGGER slow_commit AFTER UPDATE ON `+p+`holds DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION `+p+`slow_commit()`,
	)
	time.Sleep(time.Until(T.Add(-150 * time.Millisecond)))
	go b.Renew(ctx, "k", "B", 10*time.Second)
	time.Sleep(time.Until(T.Add(-80 * time.Millisecond)))
	lease, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "A", Mode: backends.Read, TTL: 5 * time.Second})
	t.Logf("A's reentrant RLOCK 80 ms before its lease's end: %+v, err %v", lease, err)
	if err != nil && !errors.Is(err, backends.ErrNotAcquired) {
		t.Errorf("reentrant RLOCK near the lease's end answered an error: %v", err)
	}
}

// TestRetryAfterKeyBusySoon: a waiting writer woken by a NOTIFY whose
// retry finds the key's advisory lock taken for a moment (another
// transaction's check) looks again soon and is granted within 200 ms of
// the key being free (it slept about a second before).
func TestRetryAfterKeyBusySoon(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 4)
	ctx := context.Background()
	waitListening(t, b)
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "H", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	done := make(chan time.Time, 1)
	go func() {
		_, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "W", TTL: time.Minute, Wait: 20 * time.Second})
		if err != nil {
			t.Error(err)
		}
		done <- time.Now()
	}()
	time.Sleep(300 * time.Millisecond) // W waits
	holder := pg.Conn(t)
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, b.n.lockKeySQL(), "k"); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.Unlock(ctx, "k", "H"); !ok || err != nil {
		t.Fatal(ok, err)
	}
	time.Sleep(15 * time.Millisecond) // a check holding the key's lock 15 ms, shorter than the quick retry's 20 ms
	tx.Rollback(ctx)
	free := time.Now()
	got := <-done
	t.Logf("key free (advisory lock released) -> W granted: %v", got.Sub(free))
	if got.Sub(free) > 200*time.Millisecond {
		t.Errorf("W granted %v after the key was free", got.Sub(free))
	}
}

// TestWaitBoundedAfterDeadline: with a slow waiting_writers table (each
// marker write or removal 1.5 s, within op_timeout 2 s), WAIT 300 still
// ends within WAIT + op_timeout (it took about 3 s before).
func TestWaitBoundedAfterDeadline(t *testing.T) {
	pg, p := testDB(t)
	b, err := New(Config{DSN: pg.DSN(), TablePrefix: p, SweepInterval: time.Hour, OpTimeout: 2 * time.Second, PoolSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	execAll(t, pg,
		`CREATE FUNCTION `+p+`slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(1.5); IF TG_OP = 'DELETE' THEN RETURN OLD; END IF; RETURN NEW; END $$`,
		`CREATE TRIGGER slow BEFORE INSERT OR UPDATE OR DELETE ON `+p+`waiting_writers FOR EACH ROW EXECUTE FUNCTION `+p+`slow()`,
	)
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "H", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = b.Lock(ctx, backends.LockRequest{Key: "k", Token: "W", TTL: time.Minute, Wait: 300 * time.Millisecond})
	el := time.Since(start)
	t.Logf("WAIT 300 ms, op_timeout 2 s: returned %v after %v", err, el)
	if el > 300*time.Millisecond+2*time.Second {
		t.Errorf("WAIT 300 returned after %v > WAIT + op_timeout", el)
	}
}

// TestLateReentryLeavesNoHold: a reentrant LOCK that waited for the key's
// advisory lock past its TTL is not acquired and adds no hold, so after the
// holder's one UNLOCK another client gets the key (before, the late hold
// was taken back after the UNLOCK, missed, and kept the key for its TTL).
func TestLateReentryLeavesNoHold(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 4)
	ctx := context.Background()
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "A", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	t1 := pg.Conn(t)
	tx1, _ := t1.Begin(ctx)
	if _, err := tx1.Exec(ctx, b.n.lockKeySQL(), "k"); err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() {
		_, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "A", TTL: 2 * time.Second})
		res <- err
	}()
	time.Sleep(200 * time.Millisecond) // A's reentry queued on the advisory lock
	t2 := pg.Conn(t)
	second := make(chan struct{})
	defer func() { <-second }() // before the cleanups close t2
	go func() {
		defer close(second)
		tx2, err := t2.Begin(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		_, _ = tx2.Exec(ctx, b.n.lockKeySQL(), "k") // queued behind A's reentry
		time.Sleep(700 * time.Millisecond)
		_ = tx2.Rollback(ctx)
	}()
	time.Sleep(2100 * time.Millisecond) // A's reentry now waited > its TTL
	tx1.Rollback(ctx)
	err := <-res
	t.Logf("A's reentrant LOCK PX 2000 after 2.3 s in the queue: %v", err)
	if ok, err := b.Unlock(ctx, "k", "A"); !ok || err != nil { // A releases its one hold
		t.Fatal(ok, err)
	}
	time.Sleep(1 * time.Second)
	info, held, _ := b.Info(ctx, "k")
	t.Logf("after A's UNLOCK: held %v %+v", held, info)
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "B", TTL: time.Minute}); err != nil {
		t.Errorf("B's LOCK after A released its only hold: %v (phantom hold %+v)", err, info)
	}
}

// TestRenewDowngradedNoDeadlock: a downgraded token's RENEW (two rows, the
// read row first on the page) and another client's grant, whose FOR SHARE
// locks rows in (mode, fence) order, do not deadlock: RENEW locks in mode
// order too (it updated in physical order before, and one of the two was
// rolled back).
func TestRenewDowngradedNoDeadlock(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 4)
	ctx := context.Background()
	execAll(t, pg,
		`INSERT INTO `+p+`holds VALUES ('k', 'X', 1, 1, clock_timestamp() + interval '1 min', nextval('`+p+`fence'))`,
		`INSERT INTO `+p+`holds VALUES ('k', 'X', 0, 1, clock_timestamp() + interval '1 min', 0)`,
		`ANALYZE `+p+`holds`,
		`CREATE FUNCTION `+p+`slow_upd() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF OLD.mode = 1 THEN PERFORM pg_sleep(0.3); END IF; RETURN NEW; END $$`,
		`CREATE TRIGGER slow_upd BEFORE UPDATE ON `+p+`holds FOR EACH ROW EXECUTE FUNCTION `+p+`slow_upd()`,
	)
	rows, _ := pg.Conn(t).Query(ctx, `EXPLAIN (COSTS OFF) `+b.n.renewSQL(), "k", "X", 1000)
	for rows.Next() {
		var l string
		rows.Scan(&l)
		t.Logf("RENEW plan: %s", l)
	}
	rows.Close()
	execAll(t, pg, `CREATE TABLE `+p+`x (a int)`) // marker
	defer func() {
		var n int
		pg.Conn(t).QueryRow(ctx, `SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`).Scan(&n)
		t.Logf("pg_stat_database.deadlocks = %d", n)
	}()
	type res struct {
		v   time.Duration
		err error
	}
	rc := make(chan res, 1)
	go func() {
		v, err := b.Renew(ctx, "k", "X", time.Minute)
		rc <- res{v, err}
	}()
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	_, lerr := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "Y", TTL: time.Minute})
	r := <-rc
	t.Logf("Y's LOCK: %v after %v; X's RENEW: %v, %v", lerr, time.Since(start), r.v, r.err)
	if r.err != nil || !errors.Is(lerr, backends.ErrNotAcquired) {
		t.Errorf("deadlock: RENEW %v, LOCK %v", r.err, lerr)
	}
}

// waitListening waits until b's listening connection is up.
func waitListening(t *testing.T, b *Backend) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !b.listening.Load(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the listening connection not up after 30 s")
		}
	}
}

// TestReentryTooSlowKeepsLease: a reentrant LOCK whose reply comes too
// late to be of use (a deferred trigger holds its COMMIT 60 ms, past its
// 20 ms lease) is answered no and its hold taken back; the holder's lease
// stays the one it was told of, for a write and a read hold. Before, the
// reentry had set the row's lease to 20 ms, nothing put it back, and
// another writer was granted within the holder's 10 s.
func TestReentryTooSlowKeepsLease(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 4)
	ctx := context.Background()
	for _, mode := range []backends.Mode{backends.Write, backends.Read} {
		key := "k-" + mode.String()
		if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "A", TTL: 10 * time.Second, Mode: mode}); err != nil {
			t.Fatal(err)
		}
	}
	execAll(t, pg,
		`CREATE FUNCTION `+p+`slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.06); RETURN NULL; END $$`,
		`CREATE CONSTRAINT TRIGGER slow AFTER UPDATE ON `+p+`holds DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION `+p+`slow()`,
	)
	for _, mode := range []backends.Mode{backends.Write, backends.Read} {
		key := "k-" + mode.String()
		if l, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "A", TTL: 20 * time.Millisecond, Mode: mode}); !errors.Is(err, backends.ErrNotAcquired) {
			t.Fatalf("%v reentry replying after 60 ms with a 20 ms lease = %+v, %v; want not acquired", mode, l, err)
		}
	}
	time.Sleep(200 * time.Millisecond) // the dropped holds' clean-up, and past 20 ms
	for _, mode := range []backends.Mode{backends.Write, backends.Read} {
		key := "k-" + mode.String()
		if l, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "B", TTL: 10 * time.Second}); err == nil {
			t.Errorf("%v: writer B granted (fence %d) within A's 10 s lease", mode, l.Fence)
		}
	}
}

// TestBinaryKeysAndTokens: keys and tokens are binary-safe, as on the
// other backends, though a text column takes only valid UTF-8 without NUL:
// such keys and tokens lock, renew, show in LOCKINFO and unlock as any
// other, and a key that looks like another's stored form is a key of its
// own. Before, they failed as NOQUORUM (SQLSTATE 22021).
func TestBinaryKeysAndTokens(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 4)
	ctx := context.Background()
	for _, tc := range []struct{ key, token string }{
		{"\xff\xfe", "A"},
		{"a\x00b", "A"},
		{"plain", "tok\xff"},
		{"\x01starts-with-the-mark", "\x01"},
		{"\x01" + "/w", "B"}, // the stored form of "\xff" is "\x01/w"
		{"\xff", "C"},
	} {
		l, err := b.Lock(ctx, backends.LockRequest{Key: tc.key, Token: tc.token, TTL: 10 * time.Second})
		if err != nil || l.Token != tc.token {
			t.Errorf("LOCK %q token %q = %+v, %v; want a grant", tc.key, tc.token, l, err)
			continue
		}
		if _, err := b.Lock(ctx, backends.LockRequest{Key: tc.key, Token: "other", TTL: time.Second}); !errors.Is(err, backends.ErrNotAcquired) {
			t.Errorf("second LOCK %q = %v; want not acquired", tc.key, err)
		}
		info, held, err := b.Info(ctx, tc.key)
		if err != nil || !held || len(info.Holders) != 1 || info.Holders[0].Token != tc.token {
			t.Errorf("LOCKINFO %q = %+v, %v, %v; want token %q", tc.key, info, held, err, tc.token)
		}
		if v, err := b.Renew(ctx, tc.key, tc.token, 10*time.Second); err != nil || v <= 0 {
			t.Errorf("RENEW %q = %v, %v", tc.key, v, err)
		}
	}
	for _, key := range []string{"\xff\xfe", "a\x00b", "\x01/w", "\xff"} {
		token := map[string]string{"\xff\xfe": "A", "a\x00b": "A", "\x01/w": "B", "\xff": "C"}[key]
		if ok, err := b.Unlock(ctx, key, token); !ok || err != nil {
			t.Errorf("UNLOCK %q = %v, %v; want true", key, ok, err)
		}
	}
}

// TestSweepUsesExpiryIndex: the sweep finds expired rows through the
// index on expires_at, not by reading every row: with many live locks a
// round would otherwise read the whole table (20,000 live rows here).
func TestSweepUsesExpiryIndex(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 4)
	execAll(t, pg,
		`INSERT INTO `+p+`holds SELECT 'k' || i, 't', 0, 1, clock_timestamp() + interval '1 hour', i FROM generate_series(1, 20000) i`,
		`INSERT INTO `+p+`holds SELECT 'gone' || i, 't', 0, 1, clock_timestamp() - interval '1 s', i FROM generate_series(1, 10) i`,
		`ANALYZE `+p+`holds`)
	conn := pg.Conn(t)
	rows, err := conn.Query(context.Background(), "EXPLAIN "+b.n.sweepSQL(b.n.holds), 100)
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	if text := strings.Join(plan, "\n"); !strings.Contains(text, "Index") || strings.Contains(text, "Seq Scan on") {
		t.Errorf("the sweep's plan reads every row:\n%s", text)
	}
}

// TestListenerRedialsStrandedConnection: a listening connection that a
// NAT or firewall forgot stays open and silent; after a silence it must
// answer a round trip, or it is redialed and listens again, so NOTIFYs
// keep waking waiters. Before, it waited on the dead connection for good
// and waiters polled without a word.
func TestListenerRedialsStrandedConnection(t *testing.T) {
	pg, p := testDB(t)
	link := harness.StartLink(t, pg.Addr)
	b, err := New(Config{DSN: strings.Replace(pg.DSN(), pg.Addr, link.Addr(), 1), TablePrefix: p,
		SweepInterval: time.Hour, DriftFactor: 0.01, DriftMin: 2 * time.Millisecond, PoolSize: 2,
		ListenCheck: 300 * time.Millisecond, OpTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	waitListening(t, b)
	link.Strand()
	for deadline := time.Now().Add(10 * time.Second); b.listening.Load(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the stranded listening connection was not given up within 10 s")
		}
	}
	waitListening(t, b)
	checkNotifyWakes(t, pg, b)
}

// checkNotifyWakes checks that a NOTIFY of a key's release, sent on
// another connection, reaches b's listening connection and wakes a waiter
// of the key within 5 s.
func checkNotifyWakes(t *testing.T, pg *harness.Postgres, b *Backend) {
	t.Helper()
	w := b.addWaiter("notify-check")
	defer b.removeWaiter(w)
	if _, err := pg.Conn(t).Exec(context.Background(), "SELECT pg_notify($1, $2)", b.n.channel, w.tag); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.wake:
	case <-time.After(5 * time.Second):
		t.Fatal("a NOTIFY woke no waiter within 5 s")
	}
}

// TestSequenceCheckedBesideMissingTables: a fence sequence made beforehand
// with a cache is refused also when the tables are missing and lockproxy
// creates them (CREATE SEQUENCE IF NOT EXISTS keeps it). Before, only an
// all-present schema had its sequence checked.
func TestSequenceCheckedBesideMissingTables(t *testing.T) {
	pg, p := testDB(t)
	execAll(t, pg, `CREATE SEQUENCE `+p+`fence AS bigint CACHE 10`)
	b, err := New(Config{DSN: pg.DSN(), TablePrefix: p, SweepInterval: time.Hour})
	if err == nil {
		b.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "CACHE") {
		t.Errorf("New beside a CACHE 10 fence sequence = %v; want a refusal naming CACHE", err)
	}
}

// TestSweepPassReportsBacklog: a sweep deletes at most sweepRounds ×
// sweepBatch rows of a table, and says when it left expired rows behind,
// so that the next comes after sweepCatchUp rather than a whole
// sweep_interval later. Before, a sweep said nothing: at the defaults
// the sweep deleted at most 1,000 expired rows a second per instance, and
// one-time keys expiring faster than that (idempotency keys taken with
// SET NX PX) grew the table without bound.
func TestSweepPassReportsBacklog(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 4)
	const rows = 2*sweepRounds*sweepBatch + 500
	execAll(t, pg, fmt.Sprintf(`INSERT INTO %sholds SELECT 'k' || g, 't', 0, 1, clock_timestamp() - interval '1 s', g FROM generate_series(1, %d) g`, p, rows))
	conn := pg.Conn(t)
	left := func() int64 {
		var n int64
		if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM `+p+`holds`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for i, want := range []struct {
		more bool
		left int64
	}{
		{true, rows - sweepRounds*sweepBatch},
		{true, rows - 2*sweepRounds*sweepBatch},
		{false, 0},
	} {
		if more := b.sweepPass(); more != want.more {
			t.Errorf("sweep %d: more = %v; want %v", i+1, more, want.more)
		}
		if n := left(); n != want.left {
			t.Errorf("sweep %d left %d rows; want %d", i+1, n, want.left)
		}
	}
}
