package redis

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/backends/backendtest"
)

// TestRenewHoldNeverShortens runs backendtest.RunRenewHoldNeverShortens
// on three real nodes and reads each lease from the nodes themselves.
// Before, the extend scripts set the lease to the renewal's TTL.
func TestRenewHoldNeverShortens(t *testing.T) {
	b, _ := newRealBackend(t, 3)
	ctx := ctxTimeout(t, 60*time.Second)
	backendtest.RunRenewHoldNeverShortens(t, ctx, b, func(t *testing.T, key string, c backendtest.RenewHoldCase) {
		sts := holdStates(t, ctx, b, key)
		if !onMajority(sts, func(st nodeLockState) bool {
			left := st.ttl
			if c.Mode == backends.Read {
				left = st.readers["t"].ttl
			}
			return st.held && left >= c.Least && left <= c.Most
		}) {
			t.Errorf("nodes %+v; want a majority with t's %v lease between %v and %v", sts, c.Mode, c.Least, c.Most)
		}
	})
}
