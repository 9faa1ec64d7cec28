package postgres

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestRowLockQueueStarvesPool: a grant's transaction share-locks every row
// of its key (heldRowsSQL) until it ends; an instance stalled inside it
// (paused, partitioned with its connection open) keeps those locks up to
// op_timeout. Every RENEW, UNLOCK and KEEPALIVE renewal or release of that
// key's holders queues on them inside a pooled connection, and a key read
// by many clients through one instance (each reader's watchdog renewing)
// then takes the whole pool: a RENEW of an unrelated key through the same
// instance gets no connection until op_timeout and its lease lapses,
// though the database is idle. TestFirstTryQueuedStarvesPool keeps LOCKs
// of a stalled key to one pooled connection per instance; these statements
// must be kept so too.
func TestRowLockQueueStarvesPool(t *testing.T) {
	type queued func(ctx context.Context, b *Backend, key, token string) error
	cases := []struct {
		name string
		op   queued
	}{
		{"RENEW", func(ctx context.Context, b *Backend, key, token string) error {
			_, err := b.Renew(ctx, key, token, 10*time.Second)
			return err
		}},
		{"UNLOCK", func(ctx context.Context, b *Backend, key, token string) error {
			_, err := b.Unlock(ctx, key, token)
			return err
		}},
		{"RenewHold", func(ctx context.Context, b *Backend, key, token string) error {
			_, err := b.RenewHold(ctx, key, token, backends.Read, 10*time.Second)
			return err
		}},
		{"UnlockHold", func(ctx context.Context, b *Backend, key, token string) error {
			_, err := b.UnlockHold(ctx, key, token, backends.Read)
			return err
		}},
	}
	const pool = 2
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pg, p := testDB(t)
			b, err := New(Config{DSN: pg.DSN(), TablePrefix: p, SweepInterval: time.Hour,
				DriftFactor: 0.01, DriftMin: 2 * time.Millisecond, PoolSize: pool, OpTimeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			ctx := context.Background()
			if _, err := b.Lock(ctx, backends.LockRequest{Key: "other", Token: "A", TTL: 30 * time.Second}); err != nil {
				t.Fatal(err)
			}
			for i := range 2 * pool {
				if _, err := b.Lock(ctx, backends.LockRequest{Key: "hot", Token: fmt.Sprint("R", i), TTL: 30 * time.Second, Mode: backends.Read}); err != nil {
					t.Fatal(err)
				}
			}
			// Another instance's grant of hot, stalled after its read: the
			// key's advisory lock and its rows share-locked.
			tx, err := pg.Conn(t).Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, b.n.lockKeySQL(), "hot"); err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, b.n.heldRowsSQL(), "hot"); err != nil {
				t.Fatal(err)
			}
			// The readers' statements, through this instance.
			var wg sync.WaitGroup
			for i := range 2 * pool {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_ = tc.op(ctx, b, "hot", fmt.Sprint("R", i))
				}()
			}
			// Wait until they all wait: on a row lock in the database, or
			// for a connection or a gate in the process.
			waiting := pg.Conn(t)
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				var n int
				if err := waiting.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n >= 1 && n+blockedIn("pgxpool.(*Pool).Acquire(", "postgres.(*Backend).enterGateOf(") == 2*pool {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the readers' %d statements not all waiting after 10 s (%d on row locks)", 2*pool, n)
				}
			}
			rctx, cancel := context.WithTimeout(ctx, time.Second) // a KEEPALIVE watchdog's TTL/3 of PX 3000
			start := time.Now()
			v, rerr := b.Renew(rctx, "other", "A", 3*time.Second)
			took := time.Since(start)
			cancel()
			_ = tx.Rollback(ctx)
			wg.Wait()
			if rerr != nil || v <= 0 {
				t.Errorf("RENEW of an unrelated key while %d %ss of a key whose rows a stalled grant locks wait = %v, %v after %v; want it served (pool %d)",
					2*pool, tc.name, v, rerr, took.Round(time.Millisecond), pool)
			}
		})
	}
}

// blockedIn counts the goroutines blocked (on a channel, a select or a
// semaphore) inside any of the functions named.
func blockedIn(funcs ...string) int {
	buf := make([]byte, 1<<20)
	n := 0
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if !strings.Contains(g, " [select") && !strings.Contains(g, " [chan") && !strings.Contains(g, " [semacquire") && !strings.Contains(g, " [sync.") {
			continue
		}
		for _, f := range funcs {
			if strings.Contains(g, f) {
				n++
				break
			}
		}
	}
	return n
}
