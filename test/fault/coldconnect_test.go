package fault

import (
	"fmt"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/faultproxy"
	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestConnectOverSlowLinks: every link from lockproxy to the nodes has a
// 60 ms round trip, well within the 100 ms node timeout of a 2 s lease
// (an acquisition over connections already open takes about 62 ms). An
// instance whose node connections are made while the links are slow must
// still grant: the connection's set-up must not be bounded by (and lost
// with) the first operation's node timeout, or the instance never grants
// at all, and an instance that loses its connections (a node restart, a
// link reset) never gets them back.
func TestConnectOverSlowLinks(t *testing.T) {
	// Its own nodes and instances: it runs beside the other single-purpose
	// tests once the rows are done (most of its time is spent waiting).
	t.Parallel()
	harness.RequireBinary(t, "redis-server", "redis-server")
	const delay = 30 * time.Millisecond // each way
	for _, tc := range []struct {
		name string
		warm bool // connections opened before the links slow down
	}{
		{"connections opened before the links slowed", true},
		{"connections opened over the slow links", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newLinkEnv(t, 5, 1)
			cl := newClient(e.proxies[0].addr)
			defer func() { _ = cl.Close() }()
			if tc.warm {
				r, ok, err := setupLock(t, cl, "warm", "PX", ttlMS)
				if err != nil || !ok {
					t.Fatalf("warm-up LOCK = %v, %v", ok, err)
				}
				_ = cl.Do(lockclient.CtxFor(t, 5*time.Second), "UNLOCK", "warm", r.Token).Err()
			}
			e.on(nil, []int{0, 1, 2, 3, 4}, func(p *faultproxy.Proxy) {
				if !tc.warm {
					// The writers connect when the instance starts: the
					// links reset those connections, so the next ones
					// are made over the slow links.
					p.Reset()
				}
				p.SetLatency(delay, 0)
			})
			start := time.Now()
			granted, tries := 0, 0
			var first time.Duration
			var last error
			// Three grants show the instance grants; none in 5 s, that it
			// never does.
			for time.Since(start) < 5*time.Second && granted < 3 {
				tries++
				key := fmt.Sprintf("slow-%d", tries)
				r, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 5*time.Second), cl, key, "PX", ttlMS)
				switch {
				case ok:
					if granted == 0 {
						first = time.Since(start)
					}
					granted++
					_ = cl.Do(lockclient.CtxFor(t, 5*time.Second), "UNLOCK", key, r.Token).Err()
				case err != nil:
					last = err
				}
				time.Sleep(50 * time.Millisecond)
			}
			t.Logf("%s: %d of %d LOCKs granted in %v (first after %v); last error: %v", tc.name, granted, tries, time.Since(start).Round(time.Millisecond), first.Round(time.Millisecond), last)
			if granted == 0 {
				t.Errorf("no LOCK PX %d granted in 5s over links with a %v round trip (node timeout 100 ms); last error: %v",
					ttlMS, 2*delay, last)
			}
		})
	}
}
