package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockproxy/lockproxy/backends"
)

// TestRenewUnlockUnderSerializableDefault: on a database whose
// default_transaction_isolation is serializable (or repeatable read), a
// RENEW and an UNLOCK that wait for a holder's row another transaction
// updates (a renewal or a release of another hold of the same token, a
// grant's reentry) still succeed once it commits. They are single
// statements, run at the session's default isolation: at serializable a
// row updated since the statement's snapshot fails it with SQLSTATE 40001
// (could not serialize access due to concurrent update), which the client
// got as -NOQUORUM and a KEEPALIVE watchdog took for a lost lock.
func TestRenewUnlockUnderSerializableDefault(t *testing.T) {
	pg, p := testDB(t)
	db := strings.TrimSuffix(p, "_") + "_ser"
	dsn := newDatabase(t, pg, db, "", "ALTER DATABASE "+db+" SET default_transaction_isolation = 'serializable'")
	b := newDSNBackend(t, dsn, p)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	const key = "ser-key"
	for i := 0; i < 2; i++ { // two holds of token A
		if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "A", TTL: time.Minute}); err != nil {
			t.Fatalf("LOCK %d = %v", i+1, err)
		}
	}
	for _, op := range []struct {
		name string
		run  func() error
	}{
		{"RENEW", func() error {
			v, err := b.Renew(ctx, key, "A", time.Minute)
			if err == nil && v <= 0 {
				err = fmt.Errorf("validity %v", v)
			}
			return err
		}},
		{"UNLOCK", func() error {
			ok, err := b.Unlock(ctx, key, "A")
			if err == nil && !ok {
				err = fmt.Errorf("not held")
			}
			return err
		}},
	} {
		// Another transaction updates the row (as a renewal of the same
		// token does) and commits while op waits for it.
		tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `UPDATE `+b.n.holds+` SET expires_at = expires_at + interval '1 second' WHERE key = $1`, key); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- op.run() }()
		time.Sleep(200 * time.Millisecond) // op is waiting for the row
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s after a concurrent update of the row = %v; want success", op.name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s not answered", op.name)
		}
	}
}
