package postgres

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestAmbiguousCommitGrantTakenBack: a first grant whose COMMIT waits for
// a synchronous standby that does not answer is cut off by op_timeout and
// answered with an error. pgx then cancels the statement over a new
// connection, and a cancelled wait for a synchronous standby ends with the
// transaction committed ("the transaction has already committed locally"):
// the row is there after all. dropGrant's DELETE, sent at once on a pooled
// connection, arrives before the cancel (a new connection takes round trips
// more: here every new connection is 200 ms slower), finds the insert still
// uncommitted and invisible, deletes nothing and "succeeds". The caller,
// told it has no lock, must not keep the key for its lease (60 s here).
func TestAmbiguousCommitGrantTakenBack(t *testing.T) {
	pg := harness.StartPostgres(t) // a server of its own: synchronous replication is server-wide
	p := "amb_"
	ctx := context.Background()
	// Sessions started from now on commit without the standby; only A's
	// grant asks for it (the trigger below).
	execAll(t, pg, `CREATE TABLE sync_probe (x int)`, `ALTER DATABASE postgres SET synchronous_commit = local`)
	execAll(t, pg, `ALTER SYSTEM SET synchronous_standby_names = 'lockproxy_no_such_standby'`, `SELECT pg_reload_conf()`)
	waitSyncRep(t, pg)

	proxy := startSlowDialProxy(t, pg.Addr, 200*time.Millisecond)
	dsn := strings.Replace(pg.DSN(), pg.Addr, proxy, 1) + "&pool_min_conns=3"
	b, err := New(Config{DSN: dsn, TablePrefix: p, SweepInterval: time.Hour,
		DriftFactor: 0.01, DriftMin: 2 * time.Millisecond, PoolSize: 4, OpTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	for deadline := time.Now().Add(10 * time.Second); b.pool.Stat().IdleConns() < 3; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the pool's 3 connections not up after 10 s")
		}
	}
	waitListening(t, b)
	execAll(t, pg,
		`CREATE FUNCTION `+p+`sync_rep() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
	IF NEW.token = 'A' THEN PERFORM set_config('synchronous_commit', 'on', true); END IF; RETURN NULL; END $$`,
		`CREATE TRIGGER sync_rep AFTER INSERT ON `+p+`holds FOR EACH ROW EXECUTE FUNCTION `+p+`sync_rep()`,
	)

	la, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "A", TTL: time.Minute})
	if err == nil {
		t.Fatalf("A's LOCK whose COMMIT waits for a missing standby, op_timeout 1 s = %+v; want an error", la)
	}
	t.Logf("A's LOCK: %v", err)
	start := time.Now()
	lb, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "B", TTL: time.Minute, Wait: 8 * time.Second})
	t.Logf("B's LOCK WAIT 8 s: %+v, %v after %v", lb, err, time.Since(start).Round(time.Millisecond))
	if err != nil {
		var rows int
		_ = pg.Conn(t).QueryRow(ctx, `SELECT count(*) FROM `+p+`holds WHERE key = 'k' AND token = 'A' AND expires_at > clock_timestamp()`).Scan(&rows)
		t.Errorf("B not granted within 8 s of A's failed LOCK (%v); A, told it has no lock, holds %d live row(s) of the key", err, rows)
	}
}

// waitSyncRep waits until a commit that asks for the synchronous standby
// waits for it (the configuration reloaded), cancelling each probe.
func waitSyncRep(t *testing.T, pg *harness.Postgres) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		conn := pg.Conn(t)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		_, err := conn.Exec(ctx, `BEGIN; SET LOCAL synchronous_commit = on; INSERT INTO sync_probe VALUES (1); COMMIT`)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) || err != nil && strings.Contains(err.Error(), "timeout") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("commits do not wait for the synchronous standby after 10 s (last: %v)", err)
		}
	}
}

// startSlowDialProxy relays TCP to upstream, each new connection opened
// delay later than asked, as a distant database's connection setup takes
// round trips more than a statement on an open connection.
func startSlowDialProxy(t *testing.T, upstream string, delay time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	var wg sync.WaitGroup
	track := func(c net.Conn) {
		mu.Lock()
		conns[c] = struct{}{}
		mu.Unlock()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			track(c)
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(delay)
				s, err := net.DialTimeout("tcp", upstream, 2*time.Second)
				if err != nil {
					_ = c.Close()
					return
				}
				track(s)
				wg.Add(2)
				for _, pair := range [][2]net.Conn{{c, s}, {s, c}} {
					go func() {
						defer wg.Done()
						_, _ = io.Copy(pair[1], pair[0])
						_ = pair[0].Close()
						_ = pair[1].Close()
					}()
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
