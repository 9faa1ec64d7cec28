package postgres

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/test/harness"
)

// The tables once had PRIMARY KEY (key, token, mode) and (key, waiter): a
// B-tree entry holds at most about 2,700 bytes, so a key longer than that
// (about 2 KB for a binary key, stored base64) was refused with SQLSTATE
// 54000, read as a NOQUORUM, though limits.max_key_bytes allows 65,536
// bytes and the other backends grant such keys.

// longKey is n bytes starting with prefix: printable, or random bytes
// (stored base64 by dbText, a third longer) when binary.
func longKey(t *testing.T, prefix string, n int, binary bool) string {
	t.Helper()
	b := make([]byte, n-len(prefix))
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	if !binary {
		const abc = "abcdefghijklmnopqrstuvwxyz0123456789"
		for i := range b {
			b[i] = abc[int(b[i])%len(abc)]
		}
	} else if len(b) > 0 {
		b[0] = 0xff // not valid UTF-8: stored encoded
	}
	return prefix + string(b)
}

// TestLongKeys: keys up to limits.max_key_bytes (65,536 bytes), printable
// or binary, and tokens longer than an index entry (max_token_bytes has no
// upper bound) lock, refuse a rival, show in LOCKINFO, renew, take a read
// hold beside a write hold, hold back readers behind a waiting writer,
// wake a waiter through NOTIFY (whose payload is the key's md5, only a
// hint of which waiters to wake) and unlock, as short ones do. Two such
// keys that differ in their last byte only are two locks.
func TestLongKeys(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 6)
	waitListening(t, b)
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		size   int
		binary bool
		token  string
	}{
		{"2800 bytes, above an index entry", 2800, false, "A"},
		{"2100 binary bytes, above an index entry once base64", 2100, true, "A"},
		{"65536 bytes", 65536, false, "A"},
		{"65536 binary bytes", 65536, true, "A"},
		{"short key, 4096-byte token", 10, false, strings.Repeat("t", 4096)},
		{"65536 bytes, 4096-byte binary token", 65536, false, longKey(t, "", 4096, true)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := longKey(t, "", tc.size, tc.binary)
			twin := key[:len(key)-1] + string(key[len(key)-1]^1) // another key, same length and start
			l, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: tc.token, TTL: 10 * time.Second})
			if err != nil || l.Token != tc.token || l.Fence == 0 {
				t.Fatalf("LOCK = %+v, %v; want a grant", l, err)
			}
			if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "B", TTL: time.Second}); !errors.Is(err, backends.ErrNotAcquired) {
				t.Errorf("rival LOCK = %v; want not acquired", err)
			}
			lt, err := b.Lock(ctx, backends.LockRequest{Key: twin, Token: "B", TTL: 10 * time.Second})
			if err != nil {
				t.Errorf("LOCK of a key differing in its last byte = %v; want a grant of its own", err)
			}
			if l2, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: tc.token, TTL: 10 * time.Second}); err != nil || l2.Holds != 2 || l2.Fence != l.Fence {
				t.Errorf("reentrant LOCK = %+v, %v; want 2 holds, fence %d", l2, err, l.Fence)
			}
			if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: tc.token, Mode: backends.Read, TTL: 10 * time.Second}); err != nil {
				t.Errorf("RLOCK by the write holder (downgrade) = %v", err)
			}
			info, held, err := b.Info(ctx, key)
			if err != nil || !held || info.Mode != backends.Write || len(info.Holders) != 1 || info.Holders[0].Token != tc.token || info.Holders[0].Holds != 2 {
				t.Errorf("LOCKINFO = %+v, %v, %v; want the token's write hold, 2 holds", info, held, err)
			}
			if v, err := b.Renew(ctx, key, tc.token, 10*time.Second); err != nil || v <= 0 {
				t.Errorf("RENEW = %v, %v; want validity", v, err)
			}
			if v, err := b.RenewHold(ctx, key, tc.token, backends.Read, 10*time.Second); err != nil || v <= 0 {
				t.Errorf("RENEW of the read hold = %v, %v; want validity", v, err)
			}
			for i, mode := range []backends.Mode{backends.Write, backends.Write, backends.Read} {
				if ok, err := b.UnlockHold(ctx, key, tc.token, mode); !ok || err != nil {
					t.Errorf("UNLOCK %d (%v) = %v, %v; want true", i+1, mode, ok, err)
				}
			}
			if _, held, err := b.Info(ctx, key); held || err != nil {
				t.Errorf("LOCKINFO after the UNLOCKs = held %v, %v", held, err)
			}
			if lt.Token != "" {
				if _, held, err := b.Info(ctx, twin); !held || err != nil {
					t.Errorf("LOCKINFO of the other key after the UNLOCKs = held %v, %v; want still held", held, err)
				}
				if ok, err := b.Unlock(ctx, twin, "B"); !ok || err != nil {
					t.Errorf("UNLOCK of the other key = %v, %v", ok, err)
				}
			}

			// A writer waits behind a reader: its marker (the waiting
			// writers' table, also indexed by digest) holds back a new
			// reader, and the reader's UNLOCK wakes it by NOTIFY.
			if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "R", Mode: backends.Read, TTL: 10 * time.Second}); err != nil {
				t.Fatalf("RLOCK = %v", err)
			}
			wakeups := b.Wakeups()
			got := make(chan error, 1)
			go func() {
				_, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "W", TTL: 10 * time.Second, Wait: 20 * time.Second})
				got <- err
			}()
			waitMarker(t, pg, p, key)
			if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "R2", Mode: backends.Read, TTL: time.Second}); !errors.Is(err, backends.ErrNotAcquired) {
				t.Errorf("RLOCK behind a waiting writer = %v; want not acquired", err)
			}
			if ok, err := b.Unlock(ctx, key, "R"); !ok || err != nil {
				t.Errorf("UNLOCK of the reader = %v, %v", ok, err)
			}
			select {
			case err := <-got:
				if err != nil {
					t.Errorf("waiting LOCK = %v; want a grant", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("waiting LOCK not answered within 30 s")
			}
			if b.Wakeups() == wakeups {
				t.Errorf("the waiting LOCK was not woken by the UNLOCK's NOTIFY")
			}
			if ok, err := b.Unlock(ctx, key, "W"); !ok || err != nil {
				t.Errorf("UNLOCK of the writer = %v, %v", ok, err)
			}
		})
	}
}

// waitMarker waits until a waiting writer's marker for key is in p's
// table.
func waitMarker(t *testing.T, pg *harness.Postgres, p, key string) {
	t.Helper()
	conn := pg.Conn(t)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var n int
		if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM `+p+`waiting_writers WHERE key = $1`, dbText(key)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no waiting writer's marker after 30 s")
		}
	}
}

// TestKeyIndexUsed: the statements that look a key's rows up find them
// through the unique index on the digests, not by reading every row (the
// index's expression and theirs must be the same for the planner to see
// it), with the plan made for the parameters' values and with the generic
// plan a prepared statement (pgx caches them) comes to.
func TestKeyIndexUsed(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 4)
	execAll(t, pg,
		`INSERT INTO `+p+`holds SELECT 'k' || i, 't', 0, 1, clock_timestamp() + interval '1 hour', i FROM generate_series(1, 20000) i`,
		`INSERT INTO `+p+`waiting_writers SELECT 'k' || i, 'w', clock_timestamp() + interval '1 hour' FROM generate_series(1, 20000) i`,
		`ANALYZE `+p+`holds`, `ANALYZE `+p+`waiting_writers`)
	conn := pg.Conn(t)
	ctx := context.Background()
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		if _, err := conn.Exec(ctx, "SET plan_cache_mode = "+mode); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name, sql, args string
		}{
			{"held rows", b.n.heldRowsSQL(), `'k7'`},
			{"live holders", b.n.liveHoldersSQL(), `'k7'`},
			{"lazy delete", b.n.dropExpiredOfKeySQL(), `'k7'`},
			{"drop expired rows", b.n.dropRowsSQL(), `'k7', '{t}', '{0}'`},
			{"writer waits", b.n.writerWaitsSQL(), `'k7'`},
			{"reader's try", b.n.readerTryLockKeySQL(), `'k7', 't'`},
			{"release", b.n.releaseSQL(), `'k7', 't'`},
			{"release of a hold", b.n.releaseHoldSQL(), `'k7', 't', 0`},
			{"drop a hold", b.n.dropHoldSQL(), `'k7', 't', 0, 7`},
			{"renew", b.n.renewSQL(), `'k7', 't', 1000`},
			{"renew a hold", b.n.renewHoldSQL(), `'k7', 't', 0, 1000`},
			{"reentry", b.n.reenterSQL(), `'k7', 't', 0, 1000`},
			{"unmark writer", b.n.unmarkWriterNotifySQL(), `'k7', 'w'`},
		} {
			if _, err := conn.Exec(ctx, "PREPARE q AS "+tc.sql); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			rows, err := conn.Query(ctx, "EXPLAIN EXECUTE q("+tc.args+")")
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			var plan []string
			for rows.Next() {
				var line string
				if err := rows.Scan(&line); err != nil {
					t.Fatal(err)
				}
				plan = append(plan, line)
			}
			if err := rows.Err(); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if _, err := conn.Exec(ctx, "DEALLOCATE q"); err != nil {
				t.Fatal(err)
			}
			text := strings.Join(plan, "\n")
			if !strings.Contains(text, p+"holds_key") && !strings.Contains(text, p+"waiting_writers_key") || strings.Contains(text, "Seq Scan on") {
				t.Errorf("%s (plan_cache_mode %s): the plan does not use the key's index:\n%s", tc.name, mode, text)
			}
		}
	}
}

// oldSchemaSQL is the schema before the digests (sql.go's schemaSQL until
// this change), with prefix p, in public.
func oldSchemaSQL(p string) []string {
	return []string{
		`CREATE SEQUENCE IF NOT EXISTS ` + p + `fence AS bigint`,
		`CREATE TABLE IF NOT EXISTS ` + p + `holds (
	key        text        NOT NULL,
	token      text        NOT NULL,
	mode       smallint    NOT NULL CHECK (mode IN (0, 1)),
	holds      bigint      NOT NULL CHECK (holds > 0),
	expires_at timestamptz NOT NULL,
	fence      bigint      NOT NULL,
	PRIMARY KEY (key, token, mode))`,
		`CREATE INDEX IF NOT EXISTS ` + p + `holds_expires_at ON ` + p + `holds (expires_at)`,
		`CREATE TABLE IF NOT EXISTS ` + p + `waiting_writers (
	key        text        NOT NULL,
	waiter     text        NOT NULL,
	expires_at timestamptz NOT NULL,
	PRIMARY KEY (key, waiter))`,
	}
}

// TestSchemaMigration: two lockproxies of this version start together on
// tables an earlier version made, with locks held in them: one of them
// upgrades the tables (the other waits for it and finds nothing left to
// do), the locks stay held with their fences, a waiting writer's marker
// still holds readers back, fences keep growing, long keys lock. An
// earlier version's grant (ON CONFLICT on the old primary key) then fails
// with an error, so an instance left behind can never grant beside the
// new ones.
func TestSchemaMigration(t *testing.T) {
	pg, p := testDB(t)
	execAll(t, pg, oldSchemaSQL(p)...)
	execAll(t, pg,
		`INSERT INTO `+p+`holds VALUES ('k', 'A', 0, 1, clock_timestamp() + interval '1 min', nextval('`+p+`fence'))`,
		`INSERT INTO `+p+`holds VALUES ('r', 'R', 1, 1, clock_timestamp() + interval '1 min', nextval('`+p+`fence'))`,
		`INSERT INTO `+p+`waiting_writers VALUES ('r', 'w1', clock_timestamp() + interval '1 min')`)
	conn := pg.Conn(t)
	ctx := context.Background()
	var fenceA int64
	if err := conn.QueryRow(ctx, `SELECT fence FROM `+p+`holds WHERE key = 'k'`).Scan(&fenceA); err != nil {
		t.Fatal(err)
	}

	var bs [2]*Backend
	var errs [2]error
	var wg sync.WaitGroup
	for i := range bs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bs[i], errs[i] = New(Config{DSN: pg.DSN(), TablePrefix: p, SweepInterval: time.Hour,
				DriftFactor: 0.01, DriftMin: 2 * time.Millisecond, PoolSize: 4})
		}()
	}
	wg.Wait()
	for i, b := range bs {
		if errs[i] != nil {
			t.Fatalf("instance %d on the earlier version's tables: %v", i+1, errs[i])
		}
		t.Cleanup(func() { b.Close() })
	}
	b := bs[0]

	var indexes bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL`, p+"holds_key", p+"waiting_writers_key").Scan(&indexes); err != nil {
		t.Fatal(err)
	}
	// The primary keys on the keys are replaced by the surrogate ones on
	// id (see TestPublishedTablesGrantAndRelease).
	if onID, other := primaryKeys(t, pg, p); onID != 2 || other != 0 || !indexes {
		t.Errorf("after the upgrade: %d primary keys on id, %d on other columns, unique indexes there: %v; want 2, 0 and true", onID, other, indexes)
	}

	if _, err := bs[1].Lock(ctx, backends.LockRequest{Key: "k", Token: "B", TTL: time.Second}); !errors.Is(err, backends.ErrNotAcquired) {
		t.Errorf("LOCK of a key held before the upgrade = %v; want not acquired", err)
	}
	info, held, err := b.Info(ctx, "k")
	if err != nil || !held || len(info.Holders) != 1 || info.Holders[0].Token != "A" || info.Fence != uint64(fenceA) {
		t.Errorf("LOCKINFO of the key held before = %+v, %v, %v; want A with fence %d", info, held, err, fenceA)
	}
	if v, err := b.Renew(ctx, "k", "A", 30*time.Second); err != nil || v <= 0 {
		t.Errorf("RENEW of the hold made before = %v, %v", v, err)
	}
	if l, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "A", TTL: 30 * time.Second}); err != nil || l.Holds != 2 || l.Fence != uint64(fenceA) {
		t.Errorf("reentrant LOCK of the hold made before = %+v, %v; want 2 holds, fence %d", l, err, fenceA)
	}
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "r", Token: "R2", Mode: backends.Read, TTL: time.Second}); !errors.Is(err, backends.ErrNotAcquired) {
		t.Errorf("RLOCK behind the writer waiting since before = %v; want not acquired", err)
	}
	for i := range 2 {
		if ok, err := b.Unlock(ctx, "k", "A"); !ok || err != nil {
			t.Errorf("UNLOCK %d of the hold made before = %v, %v", i+1, ok, err)
		}
	}
	l, err := bs[1].Lock(ctx, backends.LockRequest{Key: "k", Token: "B", TTL: 10 * time.Second})
	if err != nil || l.Fence <= uint64(fenceA) {
		t.Errorf("LOCK after the release = %+v, %v; want a fence above %d", l, err, fenceA)
	}
	long := longKey(t, "long", 65536, true)
	if _, err := b.Lock(ctx, backends.LockRequest{Key: long, Token: "L", TTL: 10 * time.Second}); err != nil {
		t.Errorf("LOCK of a 65536-byte key after the upgrade = %v", err)
	}

	// An earlier version's statements, as it sent them: its grant and its
	// waiting writer's marker name the old primary key in ON CONFLICT,
	// which no longer exists, and fail whatever the rows.
	for _, old := range []struct {
		name, sql string
		args      []any
	}{
		{"grant", `INSERT INTO ` + p + `holds (key, token, mode, holds, expires_at, fence)
VALUES ($1, $2, $3, 1, clock_timestamp() + $4 * interval '1 millisecond', nextval('` + p + `fence'))
ON CONFLICT (key, token, mode) DO UPDATE SET holds = 1, expires_at = EXCLUDED.expires_at, fence = EXCLUDED.fence
RETURNING fence`, []any{"k", "old", 0, 10000}},
		{"marker", `INSERT INTO ` + p + `waiting_writers (key, waiter, expires_at) VALUES ($1, $2, clock_timestamp() + $3 * interval '1 millisecond')
ON CONFLICT (key, waiter) DO UPDATE SET expires_at = EXCLUDED.expires_at`, []any{"k", "old", 3000}},
	} {
		_, err := conn.Exec(ctx, old.sql, old.args...)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "42P10" {
			t.Errorf("an earlier version's %s on the upgraded tables = %v; want SQLSTATE 42P10 (no unique constraint matching ON CONFLICT)", old.name, err)
		}
	}
	if _, held, err := b.Info(ctx, "k"); err != nil || !held {
		t.Errorf("LOCKINFO after the earlier version's grant = held %v, %v; want B's hold only", held, err)
	}
}

// TestSchemaMigrationRefusedWithoutRights: a role that may use the tables
// but not alter them, started on an earlier version's tables, is refused
// at start with what to do, and the tables are left as they were (an
// earlier version's instances keep working on them).
func TestSchemaMigrationRefusedWithoutRights(t *testing.T) {
	pg, p := testDB(t)
	execAll(t, pg, oldSchemaSQL(p)...)
	role := p + "user"
	execAll(t, pg,
		`CREATE ROLE `+role+` LOGIN`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON `+p+`holds, `+p+`waiting_writers TO `+role,
		`GRANT USAGE, UPDATE ON SEQUENCE `+p+`fence TO `+role)
	t.Cleanup(func() {
		execAll(t, pg, `DROP OWNED BY `+role, `DROP ROLE `+role)
	})
	b, err := New(Config{DSN: strings.Replace(pg.DSN(), "lockproxy@", role+"@", 1), TablePrefix: p, SweepInterval: time.Hour})
	if err == nil {
		b.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "must be upgraded") {
		t.Errorf("New with no right to alter an earlier version's tables = %v; want a refusal saying they must be upgraded", err)
	}
	var pks int
	if err := pg.Conn(t).QueryRow(context.Background(), `SELECT count(*) FROM pg_constraint WHERE contype = 'p' AND conrelid IN ($1::regclass, $2::regclass)`,
		p+"holds", p+"waiting_writers").Scan(&pks); err != nil || pks != 2 {
		t.Errorf("primary keys after the refusal = %d, %v; want both left", pks, err)
	}
}

// TestFailRefusedInput: a statement the database refused for the data it
// was given (SQLSTATE class 54, program limit exceeded, as an oversized
// index entry; class 22, data exception) is a plain error, not a
// NOQUORUM: the database is up and decided, so it must not count as an
// outage (no_quorum, the LockproxyNoQuorum alert).
func TestFailRefusedInput(t *testing.T) {
	b := &Backend{}
	for _, tt := range []struct {
		code, want string
	}{
		{"54000", "value too large"},
		{"54001", "program limit exceeded"},
		{"22021", "invalid byte sequence"},
		{"22001", "invalid data"},
	} {
		t.Run(tt.code, func(t *testing.T) {
			err := b.fail(context.Background(), fmt.Errorf("grant: %w", &pgconn.PgError{Code: tt.code}))
			var nq *quorum.NoQuorumError
			if errors.As(err, &nq) || errors.Is(err, quorum.ErrNoQuorum) {
				t.Errorf("fail(SQLSTATE %s) = %v; want a plain error, not a NOQUORUM", tt.code, err)
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("fail(SQLSTATE %s) = %v; want it to name %q", tt.code, err, tt.want)
			}
		})
	}
}
