package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/test/harness"
)

// digestNoKeySchemaSQL is the schema of the first version with the digest
// indexes, which had no primary key at all (an expression index cannot be
// one), in public with prefix p.
func digestNoKeySchemaSQL(p string) []string {
	return append(oldSchemaSQL(p),
		`ALTER TABLE `+p+`holds DROP CONSTRAINT `+p+`holds_pkey`,
		`ALTER TABLE `+p+`waiting_writers DROP CONSTRAINT `+p+`waiting_writers_pkey`,
		`CREATE UNIQUE INDEX `+p+`holds_key ON `+p+`holds (`+digest("key")+`, `+digest("token")+`, mode)`,
		`CREATE UNIQUE INDEX `+p+`waiting_writers_key ON `+p+`waiting_writers (`+digest("key")+`, waiter)`)
}

// primaryKeys is how many of p's two tables have a primary key on the
// identity column id, and how many have one on anything else.
func primaryKeys(t *testing.T, pg *harness.Postgres, p string) (onID, other int) {
	t.Helper()
	if err := pg.Conn(t).QueryRow(context.Background(), `SELECT
	count(*) FILTER (WHERE c.conkey = ARRAY[a.attnum] AND a.attidentity = 'a'),
	count(*) FILTER (WHERE a.attnum IS NULL OR c.conkey <> ARRAY[a.attnum])
FROM pg_constraint c LEFT JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attname = 'id'
WHERE c.contype = 'p' AND c.conrelid IN ($1::regclass, $2::regclass)`, p+"holds", p+"waiting_writers").Scan(&onID, &other); err != nil {
		t.Fatal(err)
	}
	return onID, other
}

// TestPublishedTablesGrantAndRelease: tables in a publication (logical
// replication, CDC) need a replica identity for UPDATE and DELETE, or
// those fail with SQLSTATE 55000 and no lock can be granted (LOCK's lazy
// DELETE runs first). An expression index cannot be one, so the tables
// have a surrogate primary key, id: on new tables, on tables upgraded
// from the primary keys on the keys, and on tables of the first digest
// version, which had no primary key.
func TestPublishedTablesGrantAndRelease(t *testing.T) {
	for _, tc := range []struct {
		name   string
		schema func(p string) []string
	}{
		{"new tables", nil},
		{"upgraded from primary keys on the keys", oldSchemaSQL},
		{"upgraded from digest indexes without a key", digestNoKeySchemaSQL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pg, p := testDB(t)
			if tc.schema != nil {
				execAll(t, pg, tc.schema(p)...)
				execAll(t, pg, `INSERT INTO `+p+`holds VALUES ('old', 'O', 0, 1, clock_timestamp() + interval '1 min', nextval('`+p+`fence'))`)
			} else {
				newTestBackend(t, pg, p, 2).Close()
			}
			execAll(t, pg, `CREATE PUBLICATION `+p+`pub FOR TABLE `+p+`holds, `+p+`waiting_writers`)
			t.Cleanup(func() { execAll(t, pg, `DROP PUBLICATION `+p+`pub`) })
			b := newTestBackend(t, pg, p, 2)
			if onID, other := primaryKeys(t, pg, p); onID != 2 || other != 0 {
				t.Errorf("primary keys: %d on id, %d on other columns; want 2 and 0", onID, other)
			}
			ctx := context.Background()
			if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "A", TTL: 10 * time.Second}); err != nil {
				t.Fatalf("LOCK = %v", err)
			}
			if v, err := b.Renew(ctx, "k", "A", 10*time.Second); err != nil || v <= 0 {
				t.Errorf("RENEW = %v, %v", v, err)
			}
			if ok, err := b.Unlock(ctx, "k", "A"); !ok || err != nil {
				t.Errorf("UNLOCK = %v, %v", ok, err)
			}
			if tc.schema != nil {
				if ok, err := b.Unlock(ctx, "old", "O"); !ok || err != nil {
					t.Errorf("UNLOCK of a hold made before the upgrade = %v, %v", ok, err)
				}
			}
		})
	}
}

// TestUnfitIndexRefusedAtStart: CREATE UNIQUE INDEX IF NOT EXISTS keeps
// an index of the same name whatever it is, and the grants' ON CONFLICT
// then finds no arbiter (SQLSTATE 42P10): every grant would fail while New
// reported success, and on an earlier version's tables the primary keys
// would be dropped first. New must refuse, naming the index and what is
// wrong with it, and leave the tables as they were.
func TestUnfitIndexRefusedAtStart(t *testing.T) {
	for _, tc := range []struct {
		name  string
		old   bool   // on an earlier version's tables (primary keys on the keys)
		index string // the statement making the index named holds_key; %p is the prefix
		want  string // in the error
	}{
		{"not unique, other columns", false, `CREATE INDEX %pholds_key ON %pholds (expires_at, mode)`, "not unique"},
		{"not unique, other columns, earlier tables", true, `CREATE INDEX %pholds_key ON %pholds (expires_at, mode)`, "not unique"},
		{"unique on other columns", false, `CREATE UNIQUE INDEX %pholds_key ON %pholds (key, token, mode)`, "columns"},
		{"unique on other columns, earlier tables", true, `CREATE UNIQUE INDEX %pholds_key ON %pholds (key, token, mode)`, "columns"},
		{"partial", false, `CREATE UNIQUE INDEX %pholds_key ON %pholds (` + digest("key") + `, ` + digest("token") + `, mode) WHERE holds > 1`, "partial"},
		{"digests swapped", false, `CREATE UNIQUE INDEX %pholds_key ON %pholds (` + digest("token") + `, ` + digest("key") + `, mode)`, "columns"},
		{"the key's digest twice", false, `CREATE UNIQUE INDEX %pholds_key ON %pholds (` + digest("key") + `, ` + digest("key") + `, mode)`, "is not on the columns the statements' ON CONFLICT names"},
		{"not an index", false, `CREATE TABLE %pholds_key (x int)`, "not an index"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pg, p := testDB(t)
			if tc.old {
				execAll(t, pg, oldSchemaSQL(p)...)
			} else {
				newTestBackend(t, pg, p, 2).Close()
				execAll(t, pg, `DROP INDEX `+p+`holds_key`)
			}
			execAll(t, pg, strings.ReplaceAll(tc.index, "%p", p))
			b, err := New(Config{DSN: pg.DSN(), TablePrefix: p, SweepInterval: time.Hour,
				DriftFactor: 0.01, DriftMin: 2 * time.Millisecond, PoolSize: 2})
			if err == nil {
				defer b.Close()
				_, lerr := b.Lock(context.Background(), backends.LockRequest{Key: "k", Token: "A", TTL: time.Second})
				t.Fatalf("New accepted holds_key made by %q (LOCK then = %v); want a refusal", tc.index, lerr)
			}
			if !strings.Contains(err.Error(), p+"holds_key") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New = %v; want it to name %sholds_key and say %q", err, p, tc.want)
			}
			if onID, other := primaryKeys(t, pg, p); tc.old && (onID != 0 || other != 2) {
				t.Errorf("primary keys after the refusal: %d on id, %d on the keys; want the earlier version's two left", onID, other)
			}
		})
	}
}

// TestInvalidIndexRefusedAtStart: a unique index a failed CREATE INDEX
// CONCURRENTLY left invalid has the right definition but enforces
// nothing and is no ON CONFLICT arbiter: New refuses it.
func TestInvalidIndexRefusedAtStart(t *testing.T) {
	pg, p := testDB(t)
	newTestBackend(t, pg, p, 2).Close()
	execAll(t, pg,
		`DROP INDEX `+p+`holds_key`,
		`INSERT INTO `+p+`holds VALUES ('k', 'A', 0, 1, clock_timestamp() + interval '1 min', 1), ('k', 'A', 0, 1, clock_timestamp() + interval '1 min', 2)`)
	conn := pg.Conn(t)
	if _, err := conn.Exec(context.Background(), `CREATE UNIQUE INDEX CONCURRENTLY `+p+`holds_key ON `+p+`holds (`+b0(p).holdsConflict()+`)`); err == nil {
		t.Fatal("CREATE UNIQUE INDEX CONCURRENTLY over duplicate rows succeeded")
	}
	b, err := New(Config{DSN: pg.DSN(), TablePrefix: p, SweepInterval: time.Hour,
		DriftFactor: 0.01, DriftMin: 2 * time.Millisecond, PoolSize: 2})
	if err == nil {
		b.Close()
		t.Fatal("New accepted an invalid holds_key; want a refusal")
	}
	if !strings.Contains(err.Error(), p+"holds_key") || !strings.Contains(err.Error(), "not valid") {
		t.Errorf("New = %v; want it to name %sholds_key and say it is not valid", err, p)
	}
}

// b0 is the names of prefix p's objects in public.
func b0(p string) names { return newNames("public", p) }
