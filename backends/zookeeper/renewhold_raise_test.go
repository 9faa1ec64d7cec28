package zookeeper

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends/backendtest"
)

// TestRenewHoldNeverShortens runs backendtest.RunRenewHoldNeverShortens
// on real ZooKeeper and reads each lease from LOCKINFO. Before, a node
// with holds of one kind was renewed as RENEW renews it.
func TestRenewHoldNeverShortens(t *testing.T) {
	t.Parallel()
	root := testRoot(t)
	a := newBackend(t, []string{zkAddr}, root, 30*time.Second) // a horizon (12.5 s) past the leases
	ctx := ctxT(t, 60*time.Second)
	backendtest.RunRenewHoldNeverShortens(t, ctx, a, func(t *testing.T, key string, c backendtest.RenewHoldCase) {
		info, ok, err := a.Info(ctx, key)
		if err != nil || !ok || info.Mode != c.Mode || len(info.Holders) != 1 ||
			info.Holders[0].TTL < c.Least || info.Holders[0].TTL > c.Most {
			t.Errorf("LOCKINFO = %+v, %v, %v; want t's %v hold with a TTL between %v and %v", info, ok, err, c.Mode, c.Least, c.Most)
		}
	})
}
