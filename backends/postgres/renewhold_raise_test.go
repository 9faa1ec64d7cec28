package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends/backendtest"
)

// TestRenewHoldNeverShortens runs backendtest.RunRenewHoldNeverShortens
// on real PostgreSQL and reads each lease from the token's row, which
// holds every hold of its mode. Before, renewHoldSQL set the row to the
// renewal's TTL.
func TestRenewHoldNeverShortens(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	backendtest.RunRenewHoldNeverShortens(t, ctx, b, func(t *testing.T, key string, c backendtest.RenewHoldCase) {
		got := tokenRows(t, pg, p, key, "t")
		if r, ok := got[c.Mode]; len(got) != 1 || !ok || r.left < c.Least || r.left > c.Most {
			t.Errorf("rows %+v; want t's %v row with a lease between %v and %v", got, c.Mode, c.Least, c.Most)
		}
	})
}
