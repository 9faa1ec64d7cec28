package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestCloseWithDatabaseUnreachable: Close runs last in lockproxy's
// shutdown, after the drain; a database that stopped answering (a
// partition, a frozen host) must not keep the process from exiting.
// Before, a pool connection given up on while a statement ran on it was
// closed by pgx with a cancel request bounded by 15 s, which Close waited
// for: lockproxy exited 15 s past its drain time.
func TestCloseWithDatabaseUnreachable(t *testing.T) {
	pg, p := testDB(t)
	link := harness.StartLink(t, pg.Addr)
	b, err := New(Config{DSN: strings.Replace(pg.DSN(), pg.Addr, link.Addr(), 1), TablePrefix: p,
		SweepInterval: time.Hour, DriftFactor: 0.01, DriftMin: 2 * time.Millisecond, PoolSize: 2,
		OpTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "t1", TTL: time.Minute}); err != nil {
		t.Fatalf("LOCK before the cut: %v", err)
	}
	link.Cut()
	// Given up within op_timeout: the connection it ran on is closed.
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "k2", Token: "t2", TTL: time.Minute}); err == nil {
		t.Fatal("LOCK through a cut link succeeded")
	}
	start := time.Now()
	closed := make(chan struct{})
	go func() {
		b.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close had not returned 10 s after the database became unreachable")
	}
	// op_timeout for the pool, and margin for a loaded host.
	took := time.Since(start)
	if took > 3*time.Second {
		t.Errorf("Close took %v with the database unreachable; want it bounded by op_timeout (500ms)", took)
	}
	t.Logf("Close took %v", took)
}
