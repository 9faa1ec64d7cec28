package postgres

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockproxy/lockproxy/quorum"
)

// unavailable is the error of an operation the database did not decide:
// it could not be reached, refused the role, was shutting down, or failed
// the statement. It reads as a NOQUORUM naming postgres and the cause, as
// a RedLock backend without a majority does, so clients see why.
type unavailable struct {
	reason string
	err    error
}

func (e *unavailable) Error() string  { return "postgres: " + e.reason + ": " + e.err.Error() }
func (e *unavailable) Reason() string { return e.reason }
func (e *unavailable) Unwrap() error  { return e.err }

// fail turns a pgx error into the one a caller whose context is ctx gets:
// its context's error when that ended; a plain error when the database
// refused the statement for what it was given (refusedInput), as that is
// no outage and another try gets the same answer; else a NOQUORUM whose
// reason names the cause (an operation that ran out of OpTimeout reads
// "timeout").
func (b *Backend) fail(ctx context.Context, err error) error {
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, errClosed):
		return err
	case refusedInput(err):
		return fmt.Errorf("postgres: the database refused the request's data: %s: %w", reason(err), err)
	}
	return &quorum.NoQuorumError{OK: 0, Total: 1, Failures: []quorum.NodeError{
		{Node: "postgres", Err: &unavailable{reason: reason(err), err: err}},
	}}
}

// refusedInput reports an error of SQLSTATE class 22 (data exception: a
// value the column or function does not take) or 54 (program limit
// exceeded: a value too large for an index entry, a NOTIFY payload, …):
// the database is up and decided, against the request's key, token or
// TTL. Read as a NOQUORUM it would count as an outage (no_quorum, the
// LockproxyNoQuorum alert) and tell the client to look at the database.
func refusedInput(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "54"))
}

// sqlStates names the SQLSTATEs and classes an operator meets; the rest
// are shown by code.
var sqlStates = []struct{ code, reason string }{
	{"28P01", "password authentication failed"},
	{"28", "authorization failed"},
	{"3D000", "database does not exist"},
	{"3F000", "schema does not exist"},
	{"42501", "permission denied"},
	{"42P01", "lock tables missing"},
	{"57P01", "server shutting down"},
	{"57P02", "server crashed"},
	{"57P03", "server starting up"},
	{"53300", "too many connections"},
	{"53", "insufficient resources"},
	{"08", "connection failure"},
	{"25006", "read-only transaction (a standby?)"},
	{"40", "transaction rolled back"},
	{"57014", "statement canceled"},
	{"54000", "value too large (program limit exceeded)"},
	{"54", "program limit exceeded"},
	{"22021", "invalid byte sequence"},
	{"22", "invalid data"},
}

// reason is a short cause for err: its SQLSTATE's name, or what the
// network said.
func reason(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		for _, s := range sqlStates {
			if strings.HasPrefix(pe.Code, s.code) {
				return s.reason
			}
		}
		return "SQLSTATE " + pe.Code
	}
	s := err.Error()
	switch {
	case errors.Is(err, context.DeadlineExceeded), strings.Contains(s, "i/o timeout"), strings.Contains(s, "timeout:"):
		return "timeout"
	case strings.Contains(s, "connection refused"):
		return "connection refused"
	case strings.Contains(s, "connection reset"):
		return "connection reset"
	case strings.Contains(s, "no such host"):
		return "unknown host"
	case strings.Contains(s, "EOF"), strings.Contains(s, "broken pipe"), strings.Contains(s, "closed"):
		return "connection closed"
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return "network error"
	}
	return "error"
}
