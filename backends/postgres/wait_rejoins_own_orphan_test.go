package postgres

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync"
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
	proxy := startCommitCutProxy(t, pg.Addr)
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
	proxy.arm(1500 * time.Millisecond)
	start := time.Now()
	la, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "A", TTL: time.Minute, Wait: 20 * time.Second})
	t.Logf("A's LOCK WAIT 20 s through the cut: %+v, %v after %v (cut: %v)", la, err, time.Since(start).Round(time.Millisecond), proxy.fired())
	if !proxy.fired() {
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

// commitCutProxy relays TCP to a database; armed, it relays the next
// simple-query COMMIT to the database, then closes every connection and
// refuses new ones for a while: the commit is applied, its reply lost.
type commitCutProxy struct {
	addr string

	mu        sync.Mutex
	conns     map[net.Conn]struct{}
	armed     time.Duration // the outage after the cut; 0 when not armed
	downUntil time.Time
	cut       bool
}

// commitMsg is pgx's tx.Commit: a simple Query message "commit".
var commitMsg = append([]byte{'Q', 0, 0, 0, 11}, "commit\x00"...)

func startCommitCutProxy(t *testing.T, upstream string) *commitCutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	px := &commitCutProxy{addr: ln.Addr().String(), conns: map[net.Conn]struct{}{}}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			px.mu.Lock()
			down := time.Now().Before(px.downUntil)
			if !down {
				px.conns[c] = struct{}{}
			}
			px.mu.Unlock()
			if down {
				_ = c.Close()
				continue
			}
			s, err := net.DialTimeout("tcp", upstream, 2*time.Second)
			if err != nil {
				_ = c.Close()
				continue
			}
			px.mu.Lock()
			px.conns[s] = struct{}{}
			px.mu.Unlock()
			wg.Add(2)
			go func() { // client to server, watching for the COMMIT
				defer wg.Done()
				defer c.Close()
				defer s.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						if _, werr := s.Write(buf[:n]); werr != nil {
							return
						}
						if bytes.Contains(buf[:n], commitMsg) {
							px.maybeCut()
						}
					}
					if err != nil {
						return
					}
				}
			}()
			go func() {
				defer wg.Done()
				defer c.Close()
				defer s.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 {
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
		px.mu.Lock()
		for c := range px.conns {
			_ = c.Close()
		}
		px.mu.Unlock()
		wg.Wait()
	})
	return px
}

func (px *commitCutProxy) arm(down time.Duration) {
	px.mu.Lock()
	defer px.mu.Unlock()
	px.armed = down
}

func (px *commitCutProxy) fired() bool {
	px.mu.Lock()
	defer px.mu.Unlock()
	return px.cut
}

// maybeCut cuts every connection when armed (once). The server has been
// sent the COMMIT already; closing the sockets leaves it the message.
func (px *commitCutProxy) maybeCut() {
	px.mu.Lock()
	defer px.mu.Unlock()
	if px.armed == 0 {
		return
	}
	px.downUntil = time.Now().Add(px.armed)
	px.armed = 0
	px.cut = true
	for c := range px.conns {
		_ = c.Close()
	}
	px.conns = map[net.Conn]struct{}{}
}
