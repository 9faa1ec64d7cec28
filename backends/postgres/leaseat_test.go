package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends/backendtest"
)

// TestLeaseTellsWhenMeasured runs backendtest.RunLeaseTellsWhenMeasured on
// real PostgreSQL. Before, its grants left Lease.At zero.
func TestLeaseTellsWhenMeasured(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	backendtest.RunLeaseTellsWhenMeasured(t, ctx, b)
}
