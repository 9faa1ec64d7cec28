package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockproxy/lockproxy/backends"
)

// TestReadyRefusesWhenGrantsCannotBe: Ready, which /readyz answers with,
// fails while the database answers queries but cannot grant a lock: a
// read-only database (a hot standby the DSN reaches after a failover, or
// default_transaction_read_only on), or lock tables gone. A bare SELECT 1
// answered ready there while every LOCK got -NOQUORUM, so a load
// balancer kept sending clients to an instance that could grant nothing.
func TestReadyRefusesWhenGrantsCannotBe(t *testing.T) {
	pg, p := testDB(t)
	for _, tc := range []struct {
		name string
		stop func(b *Backend, db string) string // a statement that stops grants, run on db
		want string                             // in Ready's error
	}{
		{"read-only", func(_ *Backend, db string) string {
			return "ALTER DATABASE " + db + " SET default_transaction_read_only = on"
		}, "read-only"},
		{"no-table", func(b *Backend, _ string) string {
			return "DROP TABLE " + b.n.holds
		}, "lock tables missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := strings.TrimSuffix(p, "_") + "_" + strings.ReplaceAll(tc.name, "-", "_")
			dsn := newDatabase(t, pg, db, "")
			b := newDSNBackend(t, dsn, p)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := b.Ready(ctx); err != nil {
				t.Fatalf("Ready on a working database = %v; want nil", err)
			}
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			q := tc.stop(b, db)
			_, err = conn.Exec(ctx, q)
			conn.Close(context.Background())
			if err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			// The pool's connections are made again, as after a
			// failover: new sessions take the database's settings.
			b.pool.Reset()
			if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "A", TTL: time.Minute}); err == nil {
				t.Fatal("LOCK granted: the case does not stop grants")
			}
			if err := b.Ready(ctx); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Ready = %v; want an error with %q", err, tc.want)
			}
		})
	}
}
