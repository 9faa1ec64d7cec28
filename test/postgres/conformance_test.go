package postgres

import (
	"testing"

	"github.com/lockproxy/lockproxy/test/suite"
)

// TestConformance checks PROTOCOL.md's lock commands option by option on
// PostgreSQL (test/e2e runs it on RedLock).
func TestConformance(t *testing.T) {
	// Mostly waiting on leases, on tables of its own: it runs beside the
	// package's other long tests (see Makefile: make test's last slot).
	t.Parallel()
	suite.RunConformance(t, func(t *testing.T) string {
		return startInstance(t, shared.DSN(), newPrefix()).addr
	})
}
