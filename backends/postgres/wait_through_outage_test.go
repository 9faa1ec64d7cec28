package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestWaitSurvivesKilledPoolConnection: the pooled connections of an
// instance are ended by the server (pg_terminate_backend, as a DBA's
// script, a connection pooler or a failover tool does) while a LOCK waits
// on it; the database itself stays up, and the holder then releases
// through another instance. pgxpool hands out a connection idle for less
// than a second without a ping, so the waiter's next try runs on a dead
// connection. The waiter must go on waiting and be granted within its
// WAIT, as on the RedLock backend, which keeps waiting through a try that
// reached no quorum; it answered -NOQUORUM (server shutting down) at once,
// 9 s before its WAIT ended, though the key was free.
func TestWaitSurvivesKilledPoolConnection(t *testing.T) {
	pg, p := testDB(t)
	a := newTestBackend(t, pg, p, 4)
	b := newTestBackend(t, pg, p, 4)
	waitListening(t, a)
	ctx := context.Background()
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "H", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := a.Lock(ctx, backends.LockRequest{Key: "k", Token: "W", TTL: time.Minute, Wait: 10 * time.Second})
		done <- err
	}()
	conn := pg.Conn(t)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+p+`waiting_writers`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("W not waiting after 10 s")
		}
	}
	// End every connection of a's pool (not its listening one).
	var pids []int32
	for deadline := time.Now().Add(10 * time.Second); len(pids) == 0; time.Sleep(5 * time.Millisecond) {
		for _, c := range a.pool.AcquireAllIdle(ctx) {
			pids = append(pids, int32(c.Conn().PgConn().PID()))
			c.Release()
		}
		if len(pids) == 0 && time.Now().After(deadline) {
			t.Fatal("no idle pooled connection to end after 10 s")
		}
	}
	if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) pid`, pids); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int[])`, pids).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the pooled connections not ended after 10 s")
		}
	}
	start := time.Now()
	if ok, err := b.Unlock(ctx, "k", "H"); !ok || err != nil {
		t.Fatalf("UNLOCK through the other instance = %v, %v", ok, err)
	}
	err := <-done
	t.Logf("%d pooled connections ended; W's LOCK WAIT 10 s: %v, %v after the UNLOCK", len(pids), err, time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Errorf("W's LOCK, waiting while its instance's pooled connections were ended (the database up, the key then free): %v; want granted", err)
	}
}

// TestWaitEndsAtClose: a LOCK waiting when its backend is closed ends at
// its next try (not at its WAIT's end), with the backend's closed error,
// though a try that fails on the database is otherwise waited through.
func TestWaitEndsAtClose(t *testing.T) {
	pg, p := testDB(t)
	b, err := New(Config{DSN: pg.DSN(), TablePrefix: p, SweepInterval: time.Hour, PoolSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "H", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "W", TTL: time.Minute, Wait: 20 * time.Second})
		done <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); b.Waiting() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("W not waiting after 10 s")
		}
	}
	start := time.Now()
	b.Close()
	select {
	case err := <-done:
		t.Logf("W's LOCK after Close: %v, %v later", err, time.Since(start).Round(time.Millisecond))
		if !errors.Is(err, errClosed) {
			t.Errorf("W's LOCK after Close = %v; want %v", err, errClosed)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("W's LOCK WAIT 20 s still waiting 10 s after Close")
	}
}
