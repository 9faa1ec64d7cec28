package postgres

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// TestHotKeyUnderStrictDefaultIsolation: on a database whose
// default_transaction_isolation is serializable or repeatable read, two
// instances run many LOCK … WAIT (writers and readers), LOCKINFO, RENEW
// and UNLOCK on one hot key, with the /readyz check and waiting writers'
// markers (markWriter, as each waiting writer refreshes its own) beside
// them. Every statement the backend runs at the session's default
// isolation may be rolled back by PostgreSQL (SQLSTATE 40001, or 40P01
// for a deadlock) when it races the others on the key's rows or index
// pages; nothing of it stays, and run again it goes through (rerun). None
// may reach the client as an error, other than not acquired: before, the
// /readyz check and a waiting writer's marker were run once and failed
// with -NOQUORUM … transaction rolled back at serializable in most runs
// of this test (LOCKINFO likewise, more rarely: see
// TestReadsUnderSerializableDefault and
// TestWaitingWriterMarkerUnderSerializableDefault, which make each case
// every time). Bounded: 64 workers for stressFor, every call within its
// own deadline.
func TestHotKeyUnderStrictDefaultIsolation(t *testing.T) {
	for _, level := range []string{"serializable", "repeatable read"} {
		t.Run(strings.ReplaceAll(level, " ", "_"), func(t *testing.T) {
			errs, calls, retries := stressHotKey(t, level)
			t.Logf("%s: %d calls, retries %v", level, calls, retries)
			if len(errs) > 0 {
				var lines []string
				for op, e := range errs {
					lines = append(lines, fmt.Sprintf("%s: %d (e.g. %v)", op, e.n, e.first))
				}
				sort.Strings(lines)
				t.Errorf("client-visible errors at default_transaction_isolation = %s, of %d calls:\n%s",
					level, calls, strings.Join(lines, "\n"))
			}
		})
	}
}

// stressFor is how long each worker of stressHotKey runs.
const stressFor = 2 * time.Second

type opErrors struct {
	n     int
	first error
}

// stressHotKey runs TestHotKeyUnderStrictDefaultIsolation's load at
// level and returns the errors by operation (and SQLSTATE), the number of
// calls, and the statements run again (by op and SQLSTATE, both instances
// added up).
func stressHotKey(t *testing.T, level string) (errs map[string]*opErrors, calls int, retries map[string]int64) {
	pg, p := testDB(t)
	db := strings.TrimSuffix(p, "_") + "_iso"
	dsn := newDatabase(t, pg, db, "", "ALTER DATABASE "+db+" SET default_transaction_isolation = '"+level+"'")
	var bs [2]*Backend
	for i := range bs {
		b, err := New(Config{DSN: dsn, TablePrefix: p, SweepInterval: 200 * time.Millisecond,
			DriftFactor: 0.01, DriftMin: 2 * time.Millisecond, PoolSize: 12, OpTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		bs[i] = b
	}
	// Each change of a row takes 2 ms more, as on a loaded database: the
	// statements on the key overlap more often.
	execDSN(t, dsn, "CREATE FUNCTION "+p+"slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.002); RETURN NULL; END $$",
		"CREATE TRIGGER slow AFTER INSERT OR UPDATE OR DELETE ON "+bs[0].n.holds+" FOR EACH ROW EXECUTE FUNCTION "+p+"slow()",
		"CREATE TRIGGER slow AFTER INSERT OR UPDATE OR DELETE ON "+bs[0].n.waiters+" FOR EACH ROW EXECUTE FUNCTION "+p+"slow()")
	const key = "hot"
	ctx, cancel := context.WithTimeout(context.Background(), stressFor+20*time.Second)
	defer cancel()
	end := time.Now().Add(stressFor)

	var mu sync.Mutex
	errs = map[string]*opErrors{}
	count := func(op string, err error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if err == nil || errors.Is(err, backends.ErrNotAcquired) {
			return
		}
		if pe := pgCause(err); pe != nil {
			op += " (SQLSTATE " + pe.Code + ")"
		}
		e := errs[op]
		if e == nil {
			e = &opErrors{first: err}
			if pe := pgCause(err); pe != nil {
				e.first = fmt.Errorf("%w [%s; %s]", err, pe.Message, pe.Detail)
			}
			errs[op] = e
		}
		e.n++
	}
	var wg sync.WaitGroup
	worker := func(f func(b *Backend, i int)) {
		for i := range 16 {
			b := bs[i%2]
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(end) && ctx.Err() == nil {
					f(b, i)
				}
			}()
		}
	}
	// Writers and readers: LOCK … WAIT, then LOCKINFO, RENEW and UNLOCK
	// (three times over) when granted.
	for _, mode := range []backends.Mode{backends.Write, backends.Read} {
		worker(func(b *Backend, i int) {
			token := fmt.Sprintf("%v-%d-%d", mode, i, time.Now().UnixNano())
			_, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: token, Mode: mode, TTL: time.Second, Wait: 500 * time.Millisecond})
			count("LOCK WAIT ("+mode.String()+")", err)
			if err != nil {
				return
			}
			for range 3 {
				_, _, err = b.Info(ctx, key)
				count("LOCKINFO", err)
				_, err = b.Renew(ctx, key, token, time.Second)
				count("RENEW", err)
			}
			_, err = b.Unlock(ctx, key, token)
			count("UNLOCK", err)
		})
	}
	// LOCKINFO and /readyz pollers, and waiting writers' markers, each
	// refreshed as its writer does on every try.
	worker(func(b *Backend, i int) {
		_, _, err := b.Info(ctx, key)
		count("LOCKINFO", err)
		if i%4 == 0 {
			count("Ready", b.Ready(ctx))
		}
	})
	worker(func(b *Backend, i int) {
		marker := newID()
		for range 3 {
			count("markWriter", b.markWriter(ctx, key, marker))
		}
		b.unmarkWriter(ctx, key, marker)
	})
	wg.Wait()
	retries = map[string]int64{}
	for _, b := range bs {
		for k, v := range b.retryCounts() {
			retries[k] += v
		}
	}
	return errs, calls, retries
}

// execDSN runs statements on a direct connection to dsn's database.
func execDSN(t *testing.T, dsn string, stmts ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for _, q := range stmts {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// pgCause is the PostgreSQL error err reports, through a NOQUORUM's
// failures, or nil.
func pgCause(err error) *pgconn.PgError {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe
	}
	var nq *quorum.NoQuorumError
	if errors.As(err, &nq) {
		for _, f := range nq.Failures {
			if errors.As(f.Err, &pe) {
				return pe
			}
		}
	}
	return nil
}
