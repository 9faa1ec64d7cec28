package postgres

import (
	"context"
	"testing"
	"time"
)

// TestListenerBackoffResetsAfterSuccess: the listening connection's redial
// backoff (100 ms doubling to 5 s) is for a database that stays
// unreachable. After a connection that worked for a while is lost, the
// redial must come quickly again: while it does not, every waiter polls
// every 25–200 ms. Each of 5 losses here comes after the listener was up
// for 0.5 s; before, the fifth redial waited 1.6 s (100 ms doubling).
func TestListenerBackoffResetsAfterSuccess(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 2)
	waitListening(t, b)
	conn := pg.Conn(t)
	ctx := context.Background()
	for i := range 5 {
		time.Sleep(500 * time.Millisecond) // up and working for a while
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query = $1`,
			"LISTEN "+b.n.channelIdent).Scan(&n); err != nil || n != 1 {
			t.Fatalf("terminate the listening connection: %d, %v", n, err)
		}
		for deadline := time.Now().Add(5 * time.Second); b.listening.Load(); time.Sleep(2 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the lost listening connection was not noticed within 5 s")
			}
		}
		lost := time.Now()
		waitListening(t, b)
		if d := time.Since(lost); d > time.Second {
			t.Errorf("loss %d (after 0.5 s up): listening again %v later; want under 1 s (backoff not reset after a connection that worked)",
				i+1, d.Round(time.Millisecond))
		}
	}
}
