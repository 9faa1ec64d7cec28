package postgres

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/quorum"
)

// TestRolledBack: what rerun runs again, by the error of a run. Only a
// rollback the database reported for a serialization failure (40001) or a
// deadlock (40P01), also wrapped; never the other SQLSTATEs (40003,
// statement completion unknown, may have been applied), an error the
// database did not send (a lost connection, a timeout, an ended context),
// nor a COMMIT whose outcome is unknown (errTakeBackUnknown), whatever it
// wraps.
func TestRolledBack(t *testing.T) {
	pg := func(code string) error { return &pgconn.PgError{Severity: "ERROR", Code: code, Message: "m"} }
	for _, tc := range []struct {
		name string
		err  error
		want string // the SQLSTATE counted, "" when not run again
	}{
		{"nil", nil, ""},
		{"serialization failure", pg("40001"), "40001"},
		{"deadlock", pg("40P01"), "40P01"},
		{"transaction integrity constraint violation", pg("40002"), ""},
		{"statement completion unknown", pg("40003"), ""},
		{"class 40 itself", pg("40000"), ""},
		{"lock not available", pg("55P03"), ""},
		{"unique violation", pg("23505"), ""},
		{"query canceled", pg("57014"), ""},
		{"admin shutdown", pg("57P01"), ""},
		{"connection failure", pg("08006"), ""},
		{"read-only transaction", pg("25006"), ""},
		{"wrapped serialization failure", fmt.Errorf("release of a write hold: %w", pg("40001")), "40001"},
		{"twice wrapped deadlock", fmt.Errorf("a: %w", fmt.Errorf("b: %w", pg("40P01"))), "40P01"},
		{"joined deadlock", errors.Join(errors.New("other"), pg("40P01")), "40P01"},
		{"take-back's commit outcome unknown", fmt.Errorf("%w: %w", errTakeBackUnknown, pg("40001")), ""},
		{"take-back's commit outcome unknown, wrapped", fmt.Errorf("x: %w", fmt.Errorf("%w: %w", errTakeBackUnknown, pg("40P01"))), ""},
		{"context deadline", context.DeadlineExceeded, ""},
		{"context deadline, wrapped", fmt.Errorf("waiting for this instance's try of the key before: %w", context.DeadlineExceeded), ""},
		{"context canceled", context.Canceled, ""},
		{"network timeout", &net.OpError{Op: "read", Net: "tcp", Err: errors.New("i/o timeout")}, ""},
		{"the text alone", errors.New("ERROR: could not serialize access (SQLSTATE 40001)"), ""},
		{"a NOQUORUM already (b.fail's)", &quorum.NoQuorumError{Total: 1, Failures: []quorum.NodeError{
			{Node: "postgres", Err: &unavailable{reason: "transaction rolled back", err: pg("40001")}}}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			i, ok := rolledBack(tc.err)
			got := ""
			if ok {
				got = retryCodes[i]
			}
			if got != tc.want {
				t.Errorf("rolledBack(%v) = %q; want %q", tc.err, got, tc.want)
			}
		})
	}
}

// TestRerunBounds: rerun runs a rolled-back statement again until it
// goes through, counting each run again by op and SQLSTATE; never one
// that failed otherwise; at most rerunMaxRuns times; never past its
// context's deadline.
func TestRerunBounds(t *testing.T) {
	serialization := &pgconn.PgError{Code: "40001"}
	deadlock := &pgconn.PgError{Code: "40P01"}
	newB := func() *Backend { return &Backend{log: zap.NewNop()} }

	t.Run("until it goes through", func(t *testing.T) {
		b := newB()
		runs := 0
		err := b.rerun(context.Background(), opMarkWriter, func() error {
			runs++
			switch runs {
			case 1, 2:
				return serialization
			case 3:
				return fmt.Errorf("wrapped: %w", deadlock)
			}
			return nil
		})
		if err != nil || runs != 4 {
			t.Errorf("rerun = %v after %d runs; want nil after 4", err, runs)
		}
		want := map[string]int64{"mark_writer 40001": 2, "mark_writer 40P01": 1}
		if got := b.retryCounts(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("retries counted %v; want %v", got, want)
		}
	})
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"other SQLSTATE", &pgconn.PgError{Code: "23505"}},
		{"statement completion unknown", &pgconn.PgError{Code: "40003"}},
		{"commit outcome unknown", fmt.Errorf("%w: %w", errTakeBackUnknown, serialization)},
		{"network error", errors.New("read tcp: connection reset by peer")},
	} {
		t.Run("once: "+tc.name, func(t *testing.T) {
			b := newB()
			runs := 0
			err := b.rerun(context.Background(), opTakeBack, func() error { runs++; return tc.err })
			if err != tc.err || runs != 1 {
				t.Errorf("rerun = %v after %d runs; want %v after 1", err, runs, tc.err)
			}
			if got := b.retryCounts(); len(got) != 0 {
				t.Errorf("retries counted %v; want none", got)
			}
		})
	}
	t.Run("at most rerunMaxRuns", func(t *testing.T) {
		b := newB()
		runs := 0
		err := b.rerun(context.Background(), opInfo, func() error { runs++; return serialization })
		if err != serialization || runs != rerunMaxRuns {
			t.Errorf("rerun = %v after %d runs; want the rollback after %d", err, runs, rerunMaxRuns)
		}
		if got := b.retryCounts()["info 40001"]; got != rerunMaxRuns-1 {
			t.Errorf("retries counted %d; want %d", got, rerunMaxRuns-1)
		}
	})
	t.Run("within the context's deadline", func(t *testing.T) {
		b := newB()
		const budget = 30 * time.Millisecond
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		start := time.Now()
		runs := 0
		err := b.rerun(ctx, opRenew, func() error { runs++; return deadlock })
		took := time.Since(start)
		// The last error, not the context's: it says why.
		if err != deadlock {
			t.Errorf("rerun = %v; want the deadlock error", err)
		}
		if took > budget+20*time.Millisecond || runs >= rerunMaxRuns {
			t.Errorf("rerun took %v and %d runs with a %v deadline; want it to stop before the deadline", took, runs, budget)
		}
	})
	t.Run("context ended", func(t *testing.T) {
		b := newB()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		runs := 0
		err := b.rerun(ctx, opRelease, func() error { runs++; return serialization })
		if err != serialization || runs != 1 {
			t.Errorf("rerun with an ended context = %v after %d runs; want the rollback after 1", err, runs)
		}
	})
}
