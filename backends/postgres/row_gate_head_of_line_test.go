package postgres

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestRowGateOneTokensRowStallsOtherTokens: the row gate (033d4ac) lets
// one RENEW/UNLOCK of a key at a time through an instance, whatever its
// token. A statement of one token that waits in the database for its own
// row only (another instance stalled in a take-back of that row,
// dropGrant's DELETE before its COMMIT, kept up to op_timeout by
// idle_in_transaction_session_timeout) then holds every other token's
// RENEW and UNLOCK of the key on this instance, though their rows are free
// and the database would serve them at once. A KEEPALIVE watchdog gives a
// renewal TTL/3 (1 s for PX 3000): the other readers' renewals all time out
// behind the one stuck renewal and their locks are lost. Before 033d4ac
// only the stuck token's renewal waited.
func TestRowGateOneTokensRowStallsOtherTokens(t *testing.T) {
	type op func(ctx context.Context, b *Backend, key, token string) error
	cases := []struct {
		name string
		op   op
	}{
		{"RENEW", func(ctx context.Context, b *Backend, key, token string) error {
			v, err := b.Renew(ctx, key, token, 3*time.Second)
			if err == nil && v <= 0 {
				err = fmt.Errorf("not renewed")
			}
			return err
		}},
		{"RenewHold", func(ctx context.Context, b *Backend, key, token string) error {
			v, err := b.RenewHold(ctx, key, token, backends.Read, 3*time.Second)
			if err == nil && v <= 0 {
				err = fmt.Errorf("not renewed")
			}
			return err
		}},
		{"UNLOCK", func(ctx context.Context, b *Backend, key, token string) error {
			ok, err := b.Unlock(ctx, key, token)
			if err == nil && !ok {
				err = fmt.Errorf("nothing released")
			}
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pg, p := testDB(t)
			b, err := New(Config{DSN: pg.DSN(), TablePrefix: p, SweepInterval: time.Hour,
				DriftFactor: 0.01, DriftMin: 2 * time.Millisecond, PoolSize: 8, OpTimeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			ctx := context.Background()
			for _, tok := range []string{"R0", "R1"} {
				if _, err := b.Lock(ctx, backends.LockRequest{Key: "hot", Token: tok, TTL: time.Minute, Mode: backends.Read}); err != nil {
					t.Fatal(err)
				}
			}
			// Another instance's take-back of R0's row, stalled before its
			// COMMIT: R0's row locked, R1's free.
			tx, err := pg.Conn(t).Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, `SELECT 1 FROM `+p+`holds WHERE key = 'hot' AND token = 'R0' FOR UPDATE`); err != nil {
				t.Fatal(err)
			}
			// R0's watchdog renews: it waits in the database for its row.
			stuck := make(chan error, 1)
			go func() {
				rctx, cancel := context.WithTimeout(ctx, time.Second)
				defer cancel()
				_, err := b.RenewHold(rctx, "hot", "R0", backends.Read, 3*time.Second)
				stuck <- err
			}()
			waiting := pg.Conn(t)
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				var n int
				if err := waiting.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("R0's renewal not waiting on its row after 10 s")
				}
			}
			// R1's statement, within a watchdog's TTL/3 of PX 3000.
			rctx, cancel := context.WithTimeout(ctx, time.Second)
			start := time.Now()
			oerr := tc.op(rctx, b, "hot", "R1")
			took := time.Since(start)
			cancel()
			<-stuck
			_ = tx.Rollback(ctx)
			if oerr != nil || took > 500*time.Millisecond {
				t.Errorf("%s of R1, whose row is free, while R0's renewal waits for R0's locked row: %v after %v; want served at once",
					tc.name, oerr, took.Round(time.Millisecond))
			}
		})
	}
}

// TestRowGateManyReadersRenewLate measures what serialising a key's
// renewals costs its readers: n readers of one key through one instance,
// each renewing within a KEEPALIVE watchdog's TTL/3, against a database
// whose statements take rtt (a database that far away, or whose COMMIT
// waits for a synchronous standby). One at a time they take about n×rtt, and
// every renewal queued past TTL/3 fails; in parallel over the pool they
// take n×rtt/pool. The lease is lost once TTL·0.9 passes without one
// (keepalive.go's canRetry), so every KEEPALIVE reader on a key with
// n×rtt > TTL/3 loses its lock where a pool wide enough served them all.
func TestRowGateManyReadersRenewLate(t *testing.T) {
	const (
		readers = 50
		rtt     = 5 * time.Millisecond
		pool    = 10
		period  = 150 * time.Millisecond // TTL/3 of PX 450
	)
	pg, p := testDB(t)
	px := startDelayProxy(t, pg.Addr, rtt)
	dsn := strings.Replace(pg.DSN(), pg.Addr, px, 1)
	b, err := New(Config{DSN: dsn, TablePrefix: p, SweepInterval: time.Hour,
		DriftFactor: 0.01, DriftMin: 2 * time.Millisecond, PoolSize: pool, OpTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx := context.Background()
	for i := range readers {
		if _, err := b.Lock(ctx, backends.LockRequest{Key: "hot", Token: fmt.Sprint("R", i), TTL: time.Minute, Mode: backends.Read}); err != nil {
			t.Fatal(err)
		}
	}
	// Warm the pool, so that dials are not measured.
	var wg sync.WaitGroup
	for range pool {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = b.Ready(ctx)
		}()
	}
	wg.Wait()
	var failed atomic.Int64
	start := time.Now()
	for i := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx, cancel := context.WithTimeout(ctx, period)
			defer cancel()
			if v, err := b.RenewHold(rctx, "hot", fmt.Sprint("R", i), backends.Read, 3*period); err != nil || v <= 0 {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	t.Logf("%d renewals of one key's readers (rtt %v, pool %d) took %v; %d not within %v",
		readers, rtt, pool, time.Since(start).Round(time.Millisecond), failed.Load(), period)
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of %d readers' renewals not served within a watchdog's TTL/3 (%v), %v from the database with a pool of %d; want all",
			n, readers, period, rtt, pool)
	}
}

// startDelayProxy relays TCP to upstream, holding every reply chunk for
// delay: a database delay further away. It returns the proxy's address.
func startDelayProxy(t *testing.T, upstream string, delay time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.DialTimeout("tcp", upstream, 2*time.Second)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			conns[c], conns[s] = struct{}{}, struct{}{}
			mu.Unlock()
			wg.Add(2)
			go func() {
				defer wg.Done()
				defer s.Close()
				_, _ = io.Copy(s, c)
			}()
			go func() {
				defer wg.Done()
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 {
						time.Sleep(delay)
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}
