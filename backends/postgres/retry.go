package postgres

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// Every statement and transaction the backend runs on the database goes
// through rerun (the listening connection's pings and waits for a
// notification aside: they run no transaction, and a failure only redials
// it). On a database whose default_transaction_isolation is repeatable
// read or serializable (a deployment may set it for its own reasons), a
// statement that lockproxy runs at the session's default isolation is
// rolled back by PostgreSQL with SQLSTATE 40001 whenever it met a row
// another transaction updated, or (at serializable) its reads and writes
// crossed those of transactions beside it on the same rows or index pages,
// even a lone SELECT (LOCKINFO, the /readyz check: "canceled on conflict
// out to pivot, during read"); and any transaction may be picked as a
// deadlock's victim (40P01). Nothing of it stays, and run again it goes
// through: before, a waiting writer's marker, LOCKINFO and /readyz were
// run once and answered -NOQUORUM … transaction rolled back (a LOCK … WAIT
// whose wait ended then among them). (The isolation is not set at connect:
// PgBouncer refuses startup parameters it does not know, and a session's
// SET does not stay with a client through it.)

// retryOp is what a statement run again (rerun) was for, as the retries
// metric names it.
type retryOp uint8

const (
	opLock         retryOp = iota // a LOCK try's transaction
	opRenew                       // RENEW, a KEEPALIVE watchdog's renewal
	opRelease                     // UNLOCK, a KEEPALIVE watchdog's release
	opMarkWriter                  // a waiting writer's marker, set or refreshed
	opUnmarkWriter                // the marker of a writer that gave up, removed
	opTakeBack                    // a grant answered no, taken back
	opInfo                        // LOCKINFO
	opReady                       // the /readyz check
	opSweep                       // the periodic sweep's DELETE
	opListen                      // the listening connection's LISTEN
	opSetup                       // New's schema checks and creation
	numRetryOps
)

var retryOpNames = [numRetryOps]string{
	"lock", "renew", "release", "mark_writer", "unmark_writer", "take_back", "info", "ready", "sweep", "listen", "setup",
}

func (o retryOp) String() string { return retryOpNames[o] }

// The SQLSTATEs rerun runs a statement again after, and their index in
// Backend.retries.
const (
	sqlstateSerialization = "40001" // serialization_failure
	sqlstateDeadlock      = "40P01" // deadlock_detected
)

var retryCodes = [...]string{sqlstateSerialization, sqlstateDeadlock}

// rolledBack reports whether err says the database rolled the statement's
// (or the transaction's) work back whole for a serialization failure or a
// deadlock, so that running it again is safe and may well succeed, and
// which of retryCodes it was (its index). Only those two: the other
// SQLSTATEs of class 40 are not retried, 40003 (statement completion
// unknown) least of all, as that one may have been applied. Never an error
// whose statement may have taken effect: one marked errTakeBackUnknown (a
// COMMIT that failed), whatever the PostgreSQL error inside; nor one the
// database did not send (a lost connection, a timeout, a context that
// ended), whose work may have been committed. The PostgreSQL error may
// be wrapped.
func rolledBack(err error) (code int, ok bool) {
	if err == nil || errors.Is(err, errTakeBackUnknown) {
		return 0, false
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return 0, false
	}
	for i, c := range retryCodes {
		if pe.Code == c {
			return i, true
		}
	}
	return 0, false
}

// rerunMaxRuns bounds the runs of one statement (rerun), besides its
// context: a statement rolled back this many times in a row on a very
// hot key answers the error rather than keep at it.
const rerunMaxRuns = 20

// rerunPauseMin and rerunPauseMax bound the growth of the longest pause
// before a rolled-back statement is run again (rerun): up to 2 ms after
// the first run, doubling each run, up to 50 ms.
const (
	rerunPauseMin = time.Millisecond
	rerunPauseMax = 50 * time.Millisecond
)

// rerun runs f, one statement or one whole transaction, and runs it again
// while the database rolls it back for a serialization failure or a
// deadlock (rolledBack: nothing of it stays), counted in b.retries under
// op, after a random pause that grows with each run (up to rerunPauseMax),
// so that the transactions that rolled each other back do not meet again.
// It stops with the last error after rerunMaxRuns runs, once ctx ended,
// or when the pause would not end before ctx's deadline. Not a handful of
// runs: on a key that several clients renew and release, now and then a
// statement is rolled back three times in a row, and the next run goes
// through.
//
// f must be safe to run again after such an error: a statement run alone,
// or a transaction begun and committed within f. A transaction's COMMIT
// whose outcome is unknown must come back marked (errTakeBackUnknown), or
// as an error the database did not send; either stops rerun.
func (b *Backend) rerun(ctx context.Context, op retryOp, f func() error) error {
	for runs := 1; ; runs++ {
		err := f()
		code, ok := rolledBack(err)
		if !ok || runs >= rerunMaxRuns || ctx.Err() != nil {
			return err
		}
		pause := rand.N(min(rerunPauseMin<<min(runs, 16), rerunPauseMax))
		if d, ok := ctx.Deadline(); ok && time.Until(d) <= pause {
			return err
		}
		b.retries[op][code].Add(1)
		b.log.Debug("postgres: statement rolled back; running it again",
			zap.Stringer("op", op), zap.Error(err), zap.Int("runs", runs))
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
	}
}

// retryCounts are the statements run again so far, by "op sqlstate",
// those never run again left out.
func (b *Backend) retryCounts() map[string]int64 {
	out := map[string]int64{}
	for op := range numRetryOps {
		for i, c := range retryCodes {
			if n := b.retries[op][i].Load(); n > 0 {
				out[op.String()+" "+c] = n
			}
		}
	}
	return out
}
