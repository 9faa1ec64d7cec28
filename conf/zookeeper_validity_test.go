package conf

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestZookeeperHorizonLeavesValidity: with the ZooKeeper backend every
// validity is capped by the session's horizon (2/3 of
// zookeeper.session_timeout less half of zookeeper.tick_time, which is
// taken as half the session timeout when unset) less the drift
// allowance. A session timeout, tick or drift that leaves less than the
// backend's least validity (1 ms) makes every LOCK fail, so Validate
// names it, as it names a locks.min_ttl that drift eats for RedLock.
func TestZookeeperHorizonLeavesValidity(t *testing.T) {
	tests := []struct {
		name    string
		backend string
		session time.Duration
		tick    time.Duration
		drift   time.Duration // redlock.drift_min, which ZooKeeper uses too
		want    string        // the key named, "" for none
	}{
		{"defaults", BackendZookeeper, 10 * time.Second, 0, 2 * time.Millisecond, ""},
		{"a tick given", BackendZookeeper, 4 * time.Second, 2 * time.Second, 2 * time.Millisecond, ""},
		{"a tiny session", BackendZookeeper, 3 * time.Millisecond, 0, 2 * time.Millisecond, "zookeeper.session_timeout"},
		{"drift above the horizon", BackendZookeeper, 10 * time.Second, 0, 5 * time.Second, "zookeeper.session_timeout"},
		{"drift above the horizon with a tick", BackendZookeeper, 10 * time.Second, 2 * time.Second, 6 * time.Second, "zookeeper.session_timeout"},
		{"no horizon at all", BackendZookeeper, 10 * time.Second, 14 * time.Second, 2 * time.Millisecond, "zookeeper.tick_time"},
		{"another backend", BackendRedlock, 3 * time.Millisecond, 0, 2 * time.Millisecond, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.Dev = true
			c.Backend = tt.backend
			c.Zookeeper.Servers = []string{"zk1:2181"}
			c.Zookeeper.SessionTimeout, c.Zookeeper.TickTime = tt.session, tt.tick
			c.Redlock.DriftMin = tt.drift
			// min_ttl above the drift, so that RedLock's own check stays quiet.
			c.Locks.MinTTL, c.Locks.DefaultTTL = 20*time.Second, 30*time.Second
			got := problems(t, c.Validate())
			var want []string
			if tt.want != "" {
				want = []string{tt.want}
			}
			var keys []string
			for _, p := range got {
				k, _, _ := strings.Cut(p, ": ")
				keys = append(keys, k)
			}
			if !slices.Equal(keys, want) {
				t.Errorf("Validate(session %v, tick %v, drift_min %v) = %q; want problems under %q", tt.session, tt.tick, tt.drift, got, want)
			}
		})
	}
}
