package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
)

// TestListenerRedialsStalledListen: the link of a freshly dialed listening
// connection stops delivering as it sends its LISTEN (a NAT or firewall
// that dropped it, a database host that froze). The LISTEN must be given
// up within op_timeout and the connection dialed again, so that NOTIFYs
// wake waiters once more. Before, the LISTEN waited on the dead connection
// without a bound (until the kernel gave up on it, some 15 minutes, or for
// good behind a proxy that keeps it open): no waiter was woken by a
// release for that long, and every waiter polled the database 5 to 40
// times a second meanwhile.
func TestListenerRedialsStalledListen(t *testing.T) {
	pg, p := testDB(t)
	link := harness.StartLink(t, pg.Addr)
	b, err := New(Config{DSN: strings.Replace(pg.DSN(), pg.Addr, link.Addr(), 1), TablePrefix: p,
		SweepInterval: time.Hour, DriftFactor: 0.01, DriftMin: 2 * time.Millisecond, PoolSize: 2,
		OpTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	waitListening(t, b)
	// The next LISTEN sent is lost, and so is all on its connection: the
	// one the listener dials after its connection is ended here.
	link.StrandOn([]byte("LISTEN " + b.n.channelIdent))
	var n int
	if err := pg.Conn(t).QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query = $1`,
		"LISTEN "+b.n.channelIdent).Scan(&n); err != nil || n != 1 {
		t.Fatalf("terminate the listening connection: %d, %v", n, err)
	}
	for deadline := time.Now().Add(10 * time.Second); b.listening.Load(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the ended listening connection was not noticed within 10 s")
		}
	}
	lost := time.Now()
	for deadline := lost.Add(10 * time.Second); !b.listening.Load(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not listening again 10 s after the listening connection was lost, its redial's LISTEN stalled (op_timeout 1 s)")
		}
	}
	t.Logf("listening again %v after the loss", time.Since(lost).Round(time.Millisecond))
	checkNotifyWakes(t, pg, b)
}
