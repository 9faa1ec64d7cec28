package postgres

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockproxy/lockproxy/test/harness"
)

// These tests run the backend against a real PostgreSQL, started once for
// the package on first use; each test has tables of its own (a prefix).
// Triggers stretch the timing of a race to make it happen every time.

var (
	dbOnce sync.Once
	dbPG   *harness.Postgres
	dbDir  string
	dbErr  error
	dbSeq  atomic.Int64
)

func TestMain(m *testing.M) {
	code := m.Run()
	if dbPG != nil {
		dbPG.Kill()
		os.RemoveAll(dbDir)
	}
	os.Exit(code)
}

// testDB is the package's PostgreSQL server and a table prefix of t's own.
func testDB(t *testing.T) (*harness.Postgres, string) {
	t.Helper()
	dbOnce.Do(func() {
		if dbDir, dbErr = os.MkdirTemp("", "lockproxy-pg-unit-"); dbErr != nil {
			return
		}
		dbPG, dbErr = harness.LaunchPostgres(dbDir)
	})
	if dbErr != nil {
		t.Fatalf("postgres: %v", dbErr)
	}
	return dbPG, fmt.Sprintf("u%d_%s_", dbSeq.Add(1), strings.ToLower(strings.ReplaceAll(t.Name(), "/", "_"))[:min(20, len(t.Name()))])
}

// newTestBackend is a Backend on pg's tables named with prefix, with no
// periodic sweep.
func newTestBackend(t *testing.T, pg *harness.Postgres, prefix string, pool int32) *Backend {
	t.Helper()
	b, err := New(Config{DSN: pg.DSN(), TablePrefix: prefix, SweepInterval: time.Hour,
		DriftFactor: 0.01, DriftMin: 2 * time.Millisecond, PoolSize: pool})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// newDatabase creates database db on pg (CREATE DATABASE db options, then
// the statements after), dropped at the end of the test, and returns a
// DSN for it.
func newDatabase(t *testing.T, pg *harness.Postgres, db, options string, after ...string) string {
	t.Helper()
	execAll(t, pg, append([]string{"CREATE DATABASE " + db + options}, after...)...)
	t.Cleanup(func() { execAll(t, pg, "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)") })
	return strings.Replace(pg.DSN(), "/postgres?", "/"+db+"?", 1)
}

// newDSNBackend is a Backend on dsn's database, its tables named with
// prefix, with no periodic sweep; closed at the end of the test, before
// a database newDatabase made is dropped.
func newDSNBackend(t *testing.T, dsn, prefix string) *Backend {
	t.Helper()
	b, err := New(Config{DSN: dsn, TablePrefix: prefix, SweepInterval: time.Hour,
		DriftFactor: 0.01, DriftMin: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// execAll runs statements on a direct connection to pg.
func execAll(t *testing.T, pg *harness.Postgres, stmts ...string) {
	t.Helper()
	conn := pg.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, q := range stmts {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// waitActivity waits up to 10 s until a session of conn's database other
// than conn's matches cond, a condition on pg_stat_activity's columns
// (wait_event_type = 'Lock' AND query LIKE …).
func waitActivity(t *testing.T, conn *pgx.Conn, what, cond string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND `+cond).Scan(&n); err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if n > 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// gateSQL is the statement, in a test's trigger, that holds the backend's
// statement there while the test holds gate n (holdGate), n the value of
// SQL expression e: for as long as the test needs, unlike a sleep.
func gateSQL(e string) string { return `PERFORM pg_advisory_xact_lock(7426031, (` + e + `)::int)` }

// holdGate takes gate n of gateSQL on conn until the function it returns
// is called.
func holdGate(t *testing.T, conn *pgx.Conn, n int) (release func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(7426031, $1)`, n); err != nil {
		t.Fatal(err)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock(7426031, $1)`, n); err != nil {
			t.Fatal(err)
		}
	}
}

// waitGate waits up to 10 s until a session of conn's database waits for
// gate n.
func waitGate(t *testing.T, conn *pgx.Conn, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		var waiting bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_database d ON d.oid = l.database
WHERE d.datname = current_database() AND l.locktype = 'advisory' AND l.classid = 7426031 AND l.objid = $1 AND l.objsubid = 2 AND NOT l.granted)`,
			n).Scan(&waiting); err != nil {
			t.Fatalf("waiting for a statement held by gate %d: %v", n, err)
		}
		if waiting {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}
