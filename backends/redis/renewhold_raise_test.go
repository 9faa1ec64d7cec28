package redis

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestRenewHoldNeverShortens: RenewHold, a KEEPALIVE watchdog's renewal,
// renews every hold of the token of its kind, also one taken without
// KEEPALIVE on another connection (LOCK k PX 10000 TOKEN t, then LOCK k
// PX 600 TOKEN t KEEPALIVE): it raises the lease to its TTL but never
// shortens it, or the plain hold, told 10 s, would run out 0.6 s after a
// renewal. Before, the extend scripts set the lease to the renewal's TTL.
// RENEW (Renew) still sets the lease exactly, shorter too, as documented.
func TestRenewHoldNeverShortens(t *testing.T) {
	b, _ := newRealBackend(t, 3)
	ctx := ctxTimeout(t, 60*time.Second)
	const long, short = 10 * time.Second, 600 * time.Millisecond
	for _, tc := range []struct {
		name        string
		mode        backends.Mode
		held, ttl   time.Duration // the lease granted, the renewal's TTL
		renew       bool          // RENEW (Renew) rather than RenewHold
		least, most time.Duration // the token's lease of mode after it, on a majority
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
			sts := holdStates(t, ctx, b, key)
			if !onMajority(sts, func(st nodeLockState) bool {
				left := st.ttl
				if tc.mode == backends.Read {
					left = st.readers["t"].ttl
				}
				return st.held && left >= tc.least && left <= tc.most
			}) {
				t.Errorf("nodes %+v; want a majority with t's %v lease between %v and %v", sts, tc.mode, tc.least, tc.most)
			}
		})
	}
}
