package postgres

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestValidityUnderOneMsRefused: replies give validities in whole
// milliseconds, so a grant with a validity in (0, 1 ms) would answer
// validity_ms 0, and such a renewal a RENEW of 0 ("no longer held"), or,
// unrounded, a KEEPALIVE watchdog would take it as held. Every grant or
// renewal with a TTL of 3 ms (locks.min_ttl allows it) has less than
// 1 ms: 3 ms less the drift of 2.03 ms leaves 0.97 ms before any time is
// spent. A grant must be refused and leave no hold (a first grant no row,
// a reentry the holds as they were), a renewal answer 0. Before, they were
// taken whenever the database answered within 0.97 ms, as a renewal's one
// statement mostly does: each case is tried several times.
func TestValidityUnderOneMsRefused(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const short, long = 3 * time.Millisecond, 30 * time.Second
	const tries = 20
	conn := pg.Conn(t)
	rows := func(key string) (n, holds int64) {
		t.Helper()
		if err := conn.QueryRow(ctx, `SELECT count(*), coalesce(sum(holds), 0) FROM `+p+`holds WHERE key = $1`, key).Scan(&n, &holds); err != nil {
			t.Fatal(err)
		}
		return n, holds
	}
	lock := func(key string, ttl time.Duration, mode backends.Mode) (string, error) {
		l, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "T", TTL: ttl, Mode: mode})
		if !errors.Is(err, backends.ErrNotAcquired) {
			return fmt.Sprintf("granted %+v", l), err
		}
		return "", nil
	}
	renewed := func(v time.Duration, err error) (string, error) {
		if err != nil || v != 0 {
			return "renewed for " + v.String(), err
		}
		return "", nil
	}
	for _, tc := range []struct {
		name  string
		holds bool                             // T holds the key for writing and reading (a downgrade) first
		try   func(key string) (string, error) // "" when refused, as it must be
		rows  int64                            // T's rows after the try, of 1 hold each; -1: not checked
	}{
		{"first grant", false, func(key string) (string, error) { return lock(key, short, backends.Write) }, 0},
		{"write reentry", true, func(key string) (string, error) { return lock(key, short, backends.Write) }, 2},
		{"read reentry", true, func(key string) (string, error) { return lock(key, short, backends.Read) }, 2},
		{"Renew", true, func(key string) (string, error) { return renewed(b.Renew(ctx, key, "T", short)) }, -1},
		{"RenewHold write", true, func(key string) (string, error) {
			return renewed(b.RenewHold(ctx, key, "T", backends.Write, short))
		}, 2},
		{"RenewHold read", true, func(key string) (string, error) {
			return renewed(b.RenewHold(ctx, key, "T", backends.Read, short))
		}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range tries {
				key := fmt.Sprintf("%s-%d", tc.name, i)
				if tc.holds {
					for _, mode := range []backends.Mode{backends.Write, backends.Read} {
						if l, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "T", TTL: long, Mode: mode}); err != nil || l.Validity < time.Second {
							t.Fatalf("%v LOCK PX %v = %+v, %v; want a grant", mode, long, l, err)
						}
					}
				}
				got, err := tc.try(key)
				if err != nil {
					t.Fatalf("try %d: %v", i, err)
				}
				if got != "" {
					t.Fatalf("try %d with a TTL of %v (a validity under 1 ms): %s; want refused (0)", i, short, got)
				}
				if tc.rows < 0 {
					continue
				}
				// A first grant's row may be dropped in the background.
				n, holds := rows(key)
				for deadline := time.Now().Add(5 * time.Second); n != tc.rows && time.Now().Before(deadline); {
					time.Sleep(10 * time.Millisecond)
					n, holds = rows(key)
				}
				if n != tc.rows || holds != tc.rows {
					t.Fatalf("try %d: T's rows after it = %d, of %d holds; want %d, of 1 hold each", i, n, holds, tc.rows)
				}
			}
		})
	}
}
