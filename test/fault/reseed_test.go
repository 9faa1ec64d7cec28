package fault

import (
	"fmt"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/faultproxy"
	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestRestartedNodesReseeded: a key's last grants were made by nodes 0–2
// only (the instance's links to nodes 3 and 4 dropped everything), so
// nodes 3 and 4 lag behind its fence. Nodes 0 and 1 restart empty, sit out
// their quarantine while nobody locks the key, and vote again; then the
// key is locked with node 2 out of reach, so the grant's majority is
// nodes 0, 1, 3 and 4 and node 2, the only one left that knew the fence,
// is not in it. Only the re-seed at the end of the quarantine (fence
// counters read from the other nodes) keeps the new fence above the old.
//
// The restart row cannot show a re-seed missing: its workload locks every
// key on the three remaining nodes all through the quarantine, which
// brings all three up to every key's fence.
func TestRestartedNodesReseeded(t *testing.T) {
	// Its own nodes and instances: it runs beside the other single-purpose
	// tests once the rows are done (most of its time is spent waiting).
	t.Parallel()
	harness.RequireBinary(t, "redis-server", "redis-server")
	for _, tc := range []struct {
		name    string
		lagging int // grants made while nodes 3 and 4 are cut off
	}{
		{"nodes 3 and 4 one grant behind", 1},
		{"nodes 3 and 4 three grants behind", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newLinkEnv(t, 5, 1, fmt.Sprintf("LOCKPROXY_LOCKS_MAX_TTL=%dms", quarantineMaxTTL.Milliseconds()),
				fmt.Sprintf("LOCKPROXY_LOCKS_DEFAULT_TTL=%dms", ttlMS))
			cl := newClient(e.proxies[0].addr)
			defer func() { _ = cl.Close() }()
			const key = "reseed"
			take := func(what string) Grant {
				t.Helper()
				r, ok, err := setupLock(t, cl, key, "PX", ttlMS)
				enter := e.hist.Now()
				if err != nil || !ok {
					t.Fatalf("%s: LOCK %s = %v, %v; want a grant", what, key, ok, err)
				}
				g := Grant{Key: key, Token: r.Token, Fence: r.Fence, Client: "p0." + what, Enter: enter,
					Deadline: enter + time.Duration(r.ValidityMS)*time.Millisecond,
					TTL:      ttlMS * time.Millisecond, Validity: time.Duration(r.ValidityMS) * time.Millisecond}
				e.critical(key, &g)
				g.Exit = e.hist.Now()
				e.hist.Add(g)
				if n, err := cl.Do(lockclient.CtxFor(t, 5*time.Second), "UNLOCK", key, r.Token).Int64(); err != nil || n != 1 {
					t.Fatalf("%s: UNLOCK = %d, %v; want 1", what, n, err)
				}
				return g
			}

			take("before") // every node knows the key's fence
			e.on(nil, []int{3, 4}, (*faultproxy.Proxy).Blackhole)
			var last Grant
			for i := range tc.lagging {
				last = take(fmt.Sprintf("cut-%d", i))
			}
			time.Sleep(blackholeAfterGrant) // the attempts on nodes 3 and 4 time out
			e.on(nil, []int{3, 4}, (*faultproxy.Proxy).PassThrough)

			restartNode(t, e, 0)
			restartNode(t, e, 1)
			if _, err := waitNodeStates(e.env, map[int]string{0: "quarantined", 1: "quarantined"}, 5*time.Second); err != nil {
				t.Fatalf("restarted nodes not quarantined: %v", err)
			}
			if _, err := waitNodeStates(e.env, map[int]string{0: "ok", 1: "ok"}, quarantineMaxTTL+5*time.Second); err != nil {
				t.Fatalf("restarted nodes not back after their quarantine: %v", err)
			}

			e.on(nil, []int{2}, (*faultproxy.Proxy).Blackhole)
			next := take("after")
			e.on(nil, []int{2}, (*faultproxy.Proxy).PassThrough)

			t.Logf("fence %d on nodes 0-2 before the restarts; %d from nodes 0, 1, 3 and 4 after", last.Fence, next.Fence)
			if r := Check(e.hist.Grants()); r.Violations() > 0 {
				t.Errorf("fence from a majority without node 2 after nodes 0 and 1 restarted empty: %v", r)
			}
		})
	}
}
