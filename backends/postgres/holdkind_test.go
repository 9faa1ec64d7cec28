package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/test/harness"
)

// holdRow is one of a token's rows as the table has it.
type holdRow struct {
	holds int64
	left  time.Duration // until expires_at, by the database's clock
}

// tokenRows reads token's live rows of key from the table, by mode.
func tokenRows(t *testing.T, pg *harness.Postgres, prefix, key, token string) map[backends.Mode]holdRow {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := pg.Conn(t).Query(ctx, `SELECT mode, holds, (EXTRACT(EPOCH FROM expires_at - clock_timestamp()) * 1000)::bigint
FROM `+prefix+`holds WHERE key = $1 AND token = $2 AND expires_at > clock_timestamp()`, key, token)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[backends.Mode]holdRow{}
	for rows.Next() {
		var mode int16
		var r holdRow
		var ms int64
		if err := rows.Scan(&mode, &r.holds, &ms); err != nil {
			t.Fatal(err)
		}
		r.left = time.Duration(ms) * time.Millisecond
		out[backends.Mode(mode)] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestHoldKindLeavesOtherKind: a token holds a key for writing and for
// reading (a downgrade: a write row and a read row). Releasing or renewing
// its read hold (what a KEEPALIVE watchdog that keeps only the read hold
// does) must leave the write row and its lease as they were: the holder
// was told it holds the write lock for its whole validity. Before, the
// watchdog used UNLOCK's release, which takes the write row's hold first,
// and RENEW, which set both rows to the read TTL. Likewise releasing or
// renewing the write hold leaves the read row and never shortens it.
func TestHoldKindLeavesOtherKind(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const long, short = 10 * time.Second, 600 * time.Millisecond
	for _, tc := range []struct {
		name              string
		writeTTL, readTTL time.Duration
		act               func(t *testing.T, key string)
		// The rows left after act, by mode, with at least this lease.
		want map[backends.Mode]time.Duration
	}{
		{"renew read", long, short, func(t *testing.T, key string) {
			if v, err := b.RenewHold(ctx, key, "t", backends.Read, short); v <= 0 || err != nil {
				t.Fatalf("RenewHold(read) = %v, %v; want a validity", v, err)
			}
		}, map[backends.Mode]time.Duration{backends.Write: 9 * time.Second, backends.Read: 500 * time.Millisecond}},
		{"release read", long, short, func(t *testing.T, key string) {
			if ok, err := b.UnlockHold(ctx, key, "t", backends.Read); !ok || err != nil {
				t.Fatalf("UnlockHold(read) = %v, %v; want true", ok, err)
			}
			if ok, err := b.UnlockHold(ctx, key, "t", backends.Read); ok || err != nil {
				t.Fatalf("a second UnlockHold(read) = %v, %v; want false: no read hold left", ok, err)
			}
		}, map[backends.Mode]time.Duration{backends.Write: 9 * time.Second}},
		{"renew write", short, long, func(t *testing.T, key string) {
			if v, err := b.RenewHold(ctx, key, "t", backends.Write, short); v <= 0 || err != nil {
				t.Fatalf("RenewHold(write) = %v, %v; want a validity", v, err)
			}
		}, map[backends.Mode]time.Duration{backends.Write: 500 * time.Millisecond, backends.Read: 9 * time.Second}},
		// A write renewal carries a shorter read lease along.
		{"renew write past the read lease", short, short, func(t *testing.T, key string) {
			if v, err := b.RenewHold(ctx, key, "t", backends.Write, long); v <= 0 || err != nil {
				t.Fatalf("RenewHold(write) = %v, %v; want a validity", v, err)
			}
		}, map[backends.Mode]time.Duration{backends.Write: 9 * time.Second, backends.Read: 9 * time.Second}},
		{"release write", long, long, func(t *testing.T, key string) {
			if ok, err := b.UnlockHold(ctx, key, "t", backends.Write); !ok || err != nil {
				t.Fatalf("UnlockHold(write) = %v, %v; want true", ok, err)
			}
			if ok, err := b.UnlockHold(ctx, key, "t", backends.Write); ok || err != nil {
				t.Fatalf("a second UnlockHold(write) = %v, %v; want false: no write hold left", ok, err)
			}
		}, map[backends.Mode]time.Duration{backends.Read: 9 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "k-" + tc.name
			if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "t", TTL: tc.writeTTL}); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "t", TTL: tc.readTTL, Mode: backends.Read}); err != nil {
				t.Fatalf("the downgrade: %v", err)
			}
			tc.act(t, key)
			got := tokenRows(t, pg, p, key, "t")
			if len(got) != len(tc.want) {
				t.Errorf("rows %+v; want %v", got, tc.want)
			}
			for mode, min := range tc.want {
				if r, ok := got[mode]; !ok || r.holds != 1 || r.left < min {
					t.Errorf("%v row = %+v, %v; want one hold with a lease of at least %v (rows %+v)", mode, r, ok, min, got)
				}
			}
			if l, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "w", TTL: time.Second}); err == nil {
				t.Errorf("writer w granted (fence %d) while t holds the key", l.Fence)
			}
		})
	}
}

// TestHoldKindNotHeld: releasing or renewing a kind of hold the token does
// not have answers false or 0 and leaves the row it has as it was.
func TestHoldKindNotHeld(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, held := range []backends.Mode{backends.Write, backends.Read} {
		other := backends.Read
		if held == backends.Read {
			other = backends.Write
		}
		key := "only-" + held.String()
		if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "t", TTL: 10 * time.Second, Mode: held}); err != nil {
			t.Fatal(err)
		}
		if ok, err := b.UnlockHold(ctx, key, "t", other); ok || err != nil {
			t.Errorf("%v holder: UnlockHold(%v) = %v, %v; want false", held, other, ok, err)
		}
		if v, err := b.RenewHold(ctx, key, "t", other, 600*time.Millisecond); v != 0 || err != nil {
			t.Errorf("%v holder: RenewHold(%v) = %v, %v; want 0", held, other, v, err)
		}
		got := tokenRows(t, pg, p, key, "t")
		if r, ok := got[held]; len(got) != 1 || !ok || r.holds != 1 || r.left < 9*time.Second {
			t.Errorf("%v holder: rows %+v; want its one row of about 10 s left as it was", held, got)
		}
	}
}
