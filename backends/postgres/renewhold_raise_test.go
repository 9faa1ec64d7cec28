package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestRenewHoldNeverShortens: RenewHold, a KEEPALIVE watchdog's renewal,
// renews the token's row of its mode, which holds every hold of that
// mode, also one taken without KEEPALIVE on another connection (LOCK k PX
// 10000 TOKEN t, then LOCK k PX 600 TOKEN t KEEPALIVE): it raises the
// lease to its TTL but never shortens it, or the plain hold, told 10 s,
// would run out 0.6 s after a renewal. Before, renewHoldSQL set the row to
// the renewal's TTL. RENEW (Renew) still sets the lease exactly, shorter
// too, as documented.
func TestRenewHoldNeverShortens(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const long, short = 10 * time.Second, 600 * time.Millisecond
	for _, tc := range []struct {
		name        string
		mode        backends.Mode
		held, ttl   time.Duration // the lease granted, the renewal's TTL
		renew       bool          // RENEW (Renew) rather than RenewHold
		least, most time.Duration // the row's lease after it
	}{
		{"RenewHold shorter, write", backends.Write, long, short, false, 9 * time.Second, long},
		{"RenewHold shorter, read", backends.Read, long, short, false, 9 * time.Second, long},
		{"RenewHold longer, write", backends.Write, short, long, false, 9 * time.Second, long},
		{"RenewHold longer, read", backends.Read, short, long, false, 9 * time.Second, long},
		{"RENEW shorter, write", backends.Write, long, short, true, 0, short},
		{"RENEW shorter, read", backends.Read, long, short, true, 0, short},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "raise-" + tc.name
			if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "t", TTL: tc.held, Mode: tc.mode}); err != nil {
				t.Fatal(err)
			}
			var v time.Duration
			var err error
			if tc.renew {
				v, err = b.Renew(ctx, key, "t", tc.ttl)
			} else {
				v, err = b.RenewHold(ctx, key, "t", tc.mode, tc.ttl)
			}
			if v <= 0 || err != nil {
				t.Fatalf("renewal = %v, %v; want a validity", v, err)
			}
			got := tokenRows(t, pg, p, key, "t")
			if r, ok := got[tc.mode]; len(got) != 1 || !ok || r.left < tc.least || r.left > tc.most {
				t.Errorf("rows %+v; want t's %v row with a lease between %v and %v", got, tc.mode, tc.least, tc.most)
			}
		})
	}
}
