package fault

import (
	"fmt"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/faultproxy"
	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestValiditySlowMajority probes validity (probeValidity) while every
// node of any majority is slow, but within the node timeout (100 ms for
// the 2 s TTL): the slow-2-nodes row leaves three fast nodes, which form
// every grant's majority and answer in well under the 22 ms drift
// allowance, so there a validity counted from the replies instead of from
// the requests still ends before the keys do. Here the acquisition takes
// 60 ms or more, so a validity that leaves the elapsed time out outlasts
// the keys on the nodes.
func TestValiditySlowMajority(t *testing.T) {
	// Its own nodes and instances: it runs beside the other single-purpose
	// tests once the rows are done (most of its time is spent waiting).
	t.Parallel()
	harness.RequireBinary(t, "redis-server", "redis-server")
	for _, tc := range []struct {
		name  string
		nodes []int
		delay time.Duration // each way
	}{
		{"3 of 5 nodes 30ms slow", []int{0, 1, 2}, 30 * time.Millisecond},
		{"5 of 5 nodes 30ms slow", []int{0, 1, 2, 3, 4}, 30 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newLinkEnv(t, 5, 1)
			// lockproxy's connections to the nodes are made on first use,
			// which takes more round trips than a node timeout allows
			// once the links are slow: warm them up first.
			warm := newClient(e.proxies[0].addr)
			defer func() { _ = warm.Close() }()
			for i := range 3 {
				key := fmt.Sprintf("warm-%d", i)
				r, ok, err := setupLock(t, warm, key, "PX", ttlMS)
				if err != nil || !ok {
					t.Fatalf("warm-up LOCK %s = %v, %v", key, ok, err)
				}
				_ = warm.Do(lockclient.CtxFor(t, 5*time.Second), "UNLOCK", key, r.Token).Err()
			}
			e.on(nil, tc.nodes, func(p *faultproxy.Proxy) { p.SetLatency(tc.delay, 0) })
			notes := &rowNotes{}
			probeValidity(t, e, notes)
			e.on(nil, tc.nodes, (*faultproxy.Proxy).PassThrough)
			t.Logf("%s: %s", tc.name, notes.String())
		})
	}
}
