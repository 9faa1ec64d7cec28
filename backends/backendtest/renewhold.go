// Package backendtest holds test bodies that every lock backend runs
// against its own real lock store: the cases are written once, and each
// backend's test checks the store's state in its own terms.
package backendtest

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// RenewHoldCase is one row of RunRenewHoldNeverShortens.
type RenewHoldCase struct {
	Name        string
	Mode        backends.Mode
	Held, TTL   time.Duration // the lease granted, the renewal's TTL
	Renew       bool          // RENEW (Backend.Renew) rather than RenewHold
	Least, Most time.Duration // the token's lease of Mode after the renewal
}

// RunRenewHoldNeverShortens checks that RenewHold, a KEEPALIVE watchdog's
// renewal, raises a hold's lease to its TTL but never shortens it: the
// watchdog renews every hold of the token of its kind, also one taken
// without KEEPALIVE on another connection (LOCK k PX 10000 TOKEN t, then
// LOCK k PX 600 TOKEN t KEEPALIVE), whose holder, told 10 s, would
// otherwise lose the key 0.6 s after a renewal. RENEW still sets the lease
// exactly, shorter too, as documented. For each case it locks a key of
// its own with token "t", renews it and calls lease, which must check
// that the store keeps t's lease of c.Mode between c.Least and c.Most.
func RunRenewHoldNeverShortens(t *testing.T, ctx context.Context, b backends.Backend,
	lease func(t *testing.T, key string, c RenewHoldCase)) {
	const long, short = 10 * time.Second, 600 * time.Millisecond
	for _, c := range []RenewHoldCase{
		{"RenewHold shorter, write", backends.Write, long, short, false, 9 * time.Second, long},
		{"RenewHold shorter, read", backends.Read, long, short, false, 9 * time.Second, long},
		{"RenewHold longer, write", backends.Write, short, long, false, 9 * time.Second, long},
		{"RenewHold longer, read", backends.Read, short, long, false, 9 * time.Second, long},
		{"RENEW shorter, write", backends.Write, long, short, true, 0, short},
		{"RENEW shorter, read", backends.Read, long, short, true, 0, short},
	} {
		t.Run(c.Name, func(t *testing.T) {
			key := "raise-" + c.Name
			if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "t", TTL: c.Held, Mode: c.Mode}); err != nil {
				t.Fatalf("LOCK %s: %v", key, err)
			}
			var v time.Duration
			var err error
			if c.Renew {
				v, err = b.Renew(ctx, key, "t", c.TTL)
			} else {
				v, err = backends.RenewHold(ctx, b, key, "t", c.Mode, c.TTL)
			}
			if v <= 0 || err != nil {
				t.Fatalf("renewal = %v, %v; want a validity", v, err)
			}
			lease(t, key, c)
		})
	}
}
