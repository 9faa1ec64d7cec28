package zookeeper

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestRenewHoldNeverShortens: RenewHold, a KEEPALIVE watchdog's renewal,
// renews every hold of the token's node, also one taken without KEEPALIVE
// on another connection (LOCK k PX 10000 TOKEN t, then LOCK k PX 600
// TOKEN t KEEPALIVE): it raises the lease to its TTL but never shortens
// it, or the plain hold, told 10 s, would run out 0.6 s after a renewal.
// Before, a node with holds of one kind was renewed as RENEW renews it.
// RENEW (Renew) still sets the lease exactly, shorter too, as documented.
func TestRenewHoldNeverShortens(t *testing.T) {
	t.Parallel()
	root := testRoot(t)
	a := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	ctx := ctxT(t, 60*time.Second)
	const long, short = 10 * time.Second, 600 * time.Millisecond
	for _, tc := range []struct {
		name        string
		mode        backends.Mode
		held, ttl   time.Duration // the lease granted, the renewal's TTL
		renew       bool          // RENEW (Renew) rather than RenewHold
		least, most time.Duration // LOCKINFO's TTL after it
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
			mustLock(t, a, key, "t", tc.held, tc.mode)
			var v time.Duration
			var err error
			if tc.renew {
				v, err = a.Renew(ctx, key, "t", tc.ttl)
			} else {
				v, err = a.RenewHold(ctx, key, "t", tc.mode, tc.ttl)
			}
			if v <= 0 || err != nil {
				t.Fatalf("renewal = %v, %v; want a validity", v, err)
			}
			info, ok, err := a.Info(ctx, key)
			if err != nil || !ok || info.Mode != tc.mode || len(info.Holders) != 1 ||
				info.Holders[0].TTL < tc.least || info.Holders[0].TTL > tc.most {
				t.Errorf("LOCKINFO = %+v, %v, %v; want t's %v hold with a TTL between %v and %v", info, ok, err, tc.mode, tc.least, tc.most)
			}
		})
	}
}
