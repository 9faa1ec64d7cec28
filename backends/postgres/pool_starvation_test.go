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

// TestFirstTryQueuedStarvesPool: while one transaction holds a key's
// advisory lock (an instance stalled inside a grant, which the README
// bounds by op_timeout, 5 s by default), new LOCKs of that key must not
// take the whole pool: a RENEW of an unrelated key through the same
// instance must get a connection within the second a KEEPALIVE watchdog
// gives the renewal of a PX 3000 lock (TTL/3). Before, every LOCK's first
// try queued on the advisory lock inside a pooled connection, and pool
// such LOCKs starved the RENEW though the database was idle. Now one
// first try per key queues in the database, the others in the process.
func TestFirstTryQueuedStarvesPool(t *testing.T) {
	pg, p := testDB(t)
	const pool = 4
	b := newTestBackend(t, pg, p, pool) // OpTimeout: the default 5 s
	ctx := context.Background()
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "other", Token: "A", TTL: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	// A stalled instance's grant: a transaction holding hot's advisory lock.
	conn := pg.Conn(t)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, b.n.lockKeySQL(), "hot"); err != nil {
		t.Fatal(err)
	}
	// 2×pool clients LOCK hot, with WAIT and without.
	var wg sync.WaitGroup
	for i := range 2 * pool {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := backends.LockRequest{Key: "hot", Token: fmt.Sprint("W", i), TTL: 10 * time.Second}
			if i%2 == 0 {
				req.Wait = 3 * time.Second
			}
			_, _ = b.Lock(ctx, req)
		}()
	}
	time.Sleep(300 * time.Millisecond)
	var queued int
	if err := pg.Conn(t).QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&queued); err != nil {
		t.Fatal(err)
	}
	if queued > 1 {
		t.Errorf("%d of this instance's LOCKs of one key queued on its advisory lock, each holding a pooled connection; want at most 1", queued)
	}
	rctx, cancel := context.WithTimeout(ctx, time.Second) // the watchdog's TTL/3
	start := time.Now()
	v, rerr := b.Renew(rctx, "other", "A", 3*time.Second)
	took := time.Since(start)
	cancel()
	_ = tx.Rollback(ctx)
	wg.Wait()
	if rerr != nil || v <= 0 {
		t.Errorf("RENEW of an unrelated key while %d LOCKs of a key whose advisory lock is taken wait = %v, %v after %v; want it served (pool %d)",
			2*pool, v, rerr, took.Round(time.Millisecond), pool)
	}
}

// TestKeyGate: the first tries of one key that wait in the process are let
// through one at a time in arrival order (as the database's queue on the
// advisory lock would), one whose context ends leaves the queue with its
// error, and the gate of a key goes once no try holds or waits for it.
func TestKeyGate(t *testing.T) {
	b := &Backend{gates: map[string]*keyGate{}}
	ctx := context.Background()
	first, err := b.enterGate(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	// One that gives up while queued.
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := b.enterGate(cctx, "k"); err == nil {
		t.Fatal("a try whose context ended got the gate while another held it")
	}
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			release, err := b.enterGate(ctx, "k")
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			release()
		}()
		// Queued in this order: wait until it waits for the gate, not a
		// while (a loaded machine may run it later than that).
		waitGateQueue(t, i+1)
	}
	other, err := b.enterGate(ctx, "other") // another key is not held up
	if err != nil {
		t.Fatal(err)
	}
	other()
	first()
	wg.Wait()
	if fmt.Sprint(order) != "[0 1 2 3 4]" {
		t.Errorf("tries let through in order %v; want arrival order [0 1 2 3 4]", order)
	}
	if len(b.gates) != 0 {
		t.Errorf("%d gates left with no try; want none", len(b.gates))
	}
}

// waitGateQueue waits (up to 10 s) until n goroutines wait in enterGate
// for a key's slot: a channel's queue of senders is first come, first
// served, so the order they started waiting in is the order they get it.
func waitGateQueue(t *testing.T, n int) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		waiting := 0
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, " [select") && strings.Contains(g, "postgres.(*Backend).enterGate(") {
				waiting++
			}
		}
		if waiting == n {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%d tries wait for the gate; want %d", waiting, n)
		}
	}
}
