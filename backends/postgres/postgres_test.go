package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

func TestDecide(t *testing.T) {
	w := func(tok string, left time.Duration) row {
		return row{token: tok, mode: backends.Write, holds: 1, fence: 7, left: left}
	}
	r := func(tok string, left time.Duration) row {
		return row{token: tok, mode: backends.Read, holds: 1, fence: 8, left: left}
	}
	s := time.Second
	tests := []struct {
		name        string
		mode        backends.Mode
		noReentry   bool
		rows        []row
		writerWaits bool
		want        action
		wantLeft    time.Duration
	}{
		{"write, free", backends.Write, false, nil, false, actGrant, 0},
		{"write, free, a writer waits", backends.Write, false, nil, true, actGrant, 0},
		{"write, held by another", backends.Write, false, []row{w("b", 3*s)}, false, actBusy, 3 * s},
		{"write, readers hold: the shortest lease", backends.Write, false, []row{r("b", 5*s), r("c", 2*s)}, false, actBusy, 2 * s},
		{"write, own write: reentry", backends.Write, false, []row{w("a", s)}, false, actReenter, 0},
		{"write, own write, no reentry", backends.Write, true, []row{w("a", s)}, false, actBusy, 0},
		{"write, own read: upgrade", backends.Write, false, []row{r("a", s)}, false, actUpgrade, 0},
		{"write, own read and another's: upgrade", backends.Write, false, []row{r("a", s), r("b", s)}, false, actUpgrade, 0},
		{"write, downgraded token: reentry", backends.Write, false, []row{w("a", s), r("a", s)}, false, actReenter, 0},
		{"read, free", backends.Read, false, nil, false, actGrant, 0},
		{"read, readers hold: shared", backends.Read, false, []row{r("b", s)}, false, actGrant, 0},
		{"read, a writer holds", backends.Read, false, []row{w("b", 4*s)}, false, actBusy, 4 * s},
		{"read, a writer waits: behind it", backends.Read, false, []row{r("b", s)}, true, actBusy, 0},
		{"read, own read re-enters behind a waiting writer", backends.Read, false, []row{r("a", s)}, true, actReenter, 0},
		{"read, own read, no reentry", backends.Read, true, []row{r("a", s)}, false, actBusy, 0},
		{"read, own write: downgrade", backends.Read, false, []row{w("a", s)}, true, actGrant, 0},
		{"read, downgraded token: reentry", backends.Read, false, []row{w("a", s), r("a", s)}, false, actReenter, 0},
		{"expired lease left counts as 1ms", backends.Write, false, []row{w("b", 0)}, false, actBusy, time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := backends.LockRequest{Key: "k", Token: "a", TTL: s, Mode: tt.mode, NoReentry: tt.noReentry}
			got, left := decide(req, tt.rows, tt.writerWaits)
			if got != tt.want || left != tt.wantLeft {
				t.Errorf("decide = %v, left %v; want %v, left %v", got, left, tt.want, tt.wantLeft)
			}
		})
	}
}

func TestValidity(t *testing.T) {
	for _, tt := range []struct {
		ttl, elapsed time.Duration
		want         time.Duration
	}{
		{10 * time.Second, 5 * time.Millisecond, 10*time.Second - 5*time.Millisecond - 100*time.Millisecond - 2*time.Millisecond},
		{100 * time.Millisecond, 0, 100*time.Millisecond - time.Millisecond - 2*time.Millisecond},
		{10 * time.Millisecond, 20 * time.Millisecond, -10*time.Millisecond - 100*time.Microsecond - 2*time.Millisecond},
	} {
		if got := validity(tt.ttl, tt.elapsed, 0.01, 2*time.Millisecond); got != tt.want {
			t.Errorf("validity(%v, %v) = %v; want %v", tt.ttl, tt.elapsed, got, tt.want)
		}
	}
}

func TestSummarize(t *testing.T) {
	tests := []struct {
		name    string
		rows    []row
		ok      bool
		mode    backends.Mode
		holders []string
		ttl     time.Duration
		fence   uint64
	}{
		{"free", nil, false, 0, nil, 0, 0},
		{"readers", []row{
			{token: "a", mode: backends.Read, holds: 1, fence: 3, left: 5 * time.Second},
			{token: "b", mode: backends.Read, holds: 2, fence: 9, left: 2 * time.Second},
		}, true, backends.Read, []string{"a", "b"}, 2 * time.Second, 9},
		{"downgraded: write shown", []row{
			{token: "a", mode: backends.Write, holds: 1, fence: 4, left: 7 * time.Second},
			{token: "a", mode: backends.Read, holds: 1, fence: 5, left: time.Second},
		}, true, backends.Write, []string{"a"}, 7 * time.Second, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			info, ok := summarize(tt.rows)
			var toks []string
			for _, h := range info.Holders {
				toks = append(toks, h.Token)
			}
			if ok != tt.ok || info.Mode != tt.mode || fmt.Sprint(toks) != fmt.Sprint(tt.holders) || info.TTL != tt.ttl || info.Fence != tt.fence {
				t.Errorf("summarize = %+v, %v; want mode %v, holders %v, ttl %v, fence %d, ok %v", info, ok, tt.mode, tt.holders, tt.ttl, tt.fence, tt.ok)
			}
		})
	}
}

func TestValidIdent(t *testing.T) {
	for _, tt := range []struct {
		s      string
		prefix bool
		want   bool
	}{
		{"public", false, true},
		{"", false, false},
		{"", true, true},
		{"lockproxy_", true, true},
		{"Locks", false, false},
		{`a"b`, true, false},
		{"a b", true, false},
		{"1abc", true, false},
		{strings.Repeat("a", 41), true, false},
		{strings.Repeat("a", 63), false, true},
		{strings.Repeat("a", 64), false, false},
	} {
		if got := ValidIdent(tt.s, tt.prefix); got != tt.want {
			t.Errorf("ValidIdent(%q, %v) = %v; want %v", tt.s, tt.prefix, got, tt.want)
		}
	}
}

// TestSQL: every statement names the configured schema and prefix, quoted,
// and the grant takes its fence from the sequence in the INSERT itself.
func TestSQL(t *testing.T) {
	n := newNames("locks", "app_")
	for _, tt := range []struct {
		name, sql string
		want      []string
	}{
		{"grant", n.grantSQL(), []string{`INSERT INTO "locks"."app_holds"`, `nextval('"locks"."app_fence"')`, "clock_timestamp() + $4"}},
		{"live holders", n.liveHoldersSQL(), []string{`FROM "locks"."app_holds"`, "expires_at > clock_timestamp()", "ORDER BY mode"}},
		{"writer waits", n.writerWaitsSQL(), []string{`"locks"."app_waiting_writers"`, "expires_at > clock_timestamp()"}},
		{"release", n.releaseSQL(), []string{"FOR UPDATE", "ORDER BY mode LIMIT 1", `pg_notify('app_released', md5($1))`}},
		{"renew", n.renewSQL(), []string{`UPDATE "locks"."app_holds"`, "expires_at > clock_timestamp()"}},
		{"sweep", n.sweepSQL(n.holds), []string{`DELETE FROM "locks"."app_holds"`, "LIMIT $1", "pg_notify('app_released'"}},
		{"schema", strings.Join(n.schemaSQL(), ";"), []string{
			`CREATE SEQUENCE IF NOT EXISTS "locks"."app_fence"`,
			`CREATE TABLE IF NOT EXISTS "locks"."app_holds"`,
			`CREATE INDEX IF NOT EXISTS "app_holds_expires_at" ON "locks"."app_holds"`,
			`CREATE TABLE IF NOT EXISTS "locks"."app_waiting_writers"`,
			`CREATE UNIQUE INDEX IF NOT EXISTS "app_holds_key" ON "locks"."app_holds" (pg_catalog.sha256(`,
			`CREATE UNIQUE INDEX IF NOT EXISTS "app_waiting_writers_key" ON "locks"."app_waiting_writers" (pg_catalog.sha256(`,
		}},
	} {
		for _, w := range tt.want {
			if !strings.Contains(tt.sql, w) {
				t.Errorf("%s SQL lacks %q:\n%s", tt.name, w, tt.sql)
			}
		}
	}
	if n.channelIdent != `"app_released"` {
		t.Errorf("LISTEN channel %s; want \"app_released\"", n.channelIdent)
	}
	if got := keyTag("k"); got != "8ce4b16b22b58894aa86c421e8759df3" {
		t.Errorf("keyTag(k) = %s; want md5 hex, as SQL's md5() gives", got)
	}
}

// TestFail: database errors become a NOQUORUM naming postgres and the
// cause; the caller's context errors stay as they are.
func TestFail(t *testing.T) {
	b := &Backend{}
	for _, tt := range []struct {
		name    string
		err     error
		noQuo   bool
		wantMsg string
	}{
		{"refused", fmt.Errorf("failed to connect to `user=lp database=db`: 127.0.0.1:5432 (127.0.0.1): dial error: dial tcp 127.0.0.1:5432: connect: connection refused"), true, "postgres connection refused"},
		{"auth", &pgconn.PgError{Code: "28P01", Message: "password authentication failed for user \"lp\""}, true, "postgres password authentication failed"},
		{"no database", &pgconn.PgError{Code: "3D000"}, true, "postgres database does not exist"},
		{"permission", &pgconn.PgError{Code: "42501"}, true, "postgres permission denied"},
		{"shutdown", &pgconn.PgError{Code: "57P01"}, true, "postgres server shutting down"},
		{"standby", &pgconn.PgError{Code: "25006"}, true, "postgres read-only transaction"},
		{"connection class", &pgconn.PgError{Code: "08006"}, true, "postgres connection failure"},
		{"other SQLSTATE", &pgconn.PgError{Code: "XX000"}, true, "postgres SQLSTATE XX000"},
		{"closed", errors.New("conn closed"), true, "postgres connection closed"},
		{"eof", fmt.Errorf("read: %w", errors.New("unexpected EOF")), true, "postgres connection closed"},
		{"op timeout", fmt.Errorf("timeout: %w", context.DeadlineExceeded), true, "postgres timeout"},
		{"closed backend", errClosed, false, "backend closed"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := b.fail(context.Background(), tt.err)
			if got := errors.Is(err, quorum.ErrNoQuorum); got != tt.noQuo {
				t.Errorf("fail(%v) NOQUORUM = %v; want %v", tt.err, got, tt.noQuo)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("fail(%v) = %q; want it to contain %q", tt.err, err, tt.wantMsg)
			}
		})
	}
}

func TestFailCallerContext(t *testing.T) {
	b := &Backend{}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.fail(ctx, errors.New("conn closed")); !errors.Is(err, context.Canceled) {
		t.Errorf("fail with the caller's context canceled = %v; want context.Canceled", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), -time.Second)
	defer cancel()
	if err := b.fail(ctx, fmt.Errorf("timeout: %w", context.DeadlineExceeded)); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, quorum.ErrNoQuorum) {
		t.Errorf("fail past the caller's deadline = %v; want context.DeadlineExceeded", err)
	}
}
