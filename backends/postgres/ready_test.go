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
// default_transaction_read_only on), a role that may only read the lock
// tables, or lock tables gone. A bare SELECT 1 answered ready there while
// every LOCK got -NOQUORUM, so a load balancer kept sending clients to an
// instance that could grant nothing.
func TestReadyRefusesWhenGrantsCannotBe(t *testing.T) {
	pg, p := testDB(t)
	for _, tc := range []struct {
		name string
		// stop returns the statements, run as the owner on database db,
		// after which b (logged in as role, or as the owner when "")
		// can grant nothing.
		stop func(b *Backend, db, role string) []string
		role bool // the backend logs in as a role of its own, given every right at first
		want string
	}{
		{"read-only", func(_ *Backend, db, _ string) []string {
			return []string{"ALTER DATABASE " + db + " SET default_transaction_read_only = on"}
		}, false, "read-only"},
		{"select-only", func(b *Backend, _, role string) []string {
			return []string{"REVOKE INSERT, UPDATE, DELETE ON " + b.n.holds + ", " + b.n.waiters + " FROM " + role}
		}, true, "permission denied"},
		{"no-fences", func(b *Backend, _, role string) []string {
			return []string{"REVOKE USAGE, UPDATE ON SEQUENCE " + b.n.fences + " FROM " + role}
		}, true, "permission denied"},
		{"no-table", func(b *Backend, _, _ string) []string {
			return []string{"DROP TABLE " + b.n.holds}
		}, false, "lock tables missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := strings.TrimSuffix(p, "_") + "_" + strings.ReplaceAll(tc.name, "-", "_")
			role := ""
			if tc.role {
				// Made first, so that it is dropped after the database
				// that holds its grants.
				role = db + "_role"
				execAll(t, pg, "CREATE ROLE "+role+" LOGIN")
				t.Cleanup(func() { execAll(t, pg, "DROP ROLE "+role) })
			}
			dsn := newDatabase(t, pg, db, "")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			owner, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer owner.Close(context.Background())
			exec := func(qs ...string) {
				t.Helper()
				for _, q := range qs {
					if _, err := owner.Exec(ctx, q); err != nil {
						t.Fatalf("%s: %v", q, err)
					}
				}
			}
			b := newDSNBackend(t, dsn, p) // makes the tables as the owner
			if tc.role {
				exec("GRANT SELECT, INSERT, UPDATE, DELETE ON "+b.n.holds+", "+b.n.waiters+" TO "+role,
					"GRANT USAGE, UPDATE ON SEQUENCE "+b.n.fences+" TO "+role)
				b = newDSNBackend(t, strings.Replace(dsn, "lockproxy@", role+"@", 1), p)
			}
			if err := b.Ready(ctx); err != nil {
				t.Fatalf("Ready on a working database = %v; want nil", err)
			}
			exec(tc.stop(b, db, role)...)
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
