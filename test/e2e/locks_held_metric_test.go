package e2e

import (
	"regexp"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestLocksHeldCountsHolds: on real nodes, a lock that still has a hold
// after an UNLOCK (a reentrant LOCK's, a downgrade's read hold) is still
// held, as LOCKINFO shows: lockproxy_locks_held (in /metrics and INFO)
// must not drop and its holding time must not be observed until the last
// hold goes. Before, the first UNLOCK took the lock off both.
func TestLocksHeldCountsHolds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		second string // the second acquisition with the same token
	}{
		{"reentrant LOCK", "LOCK"},
		{"downgrade to RLOCK", "RLOCK"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := startCluster(t, 3)
			in := startInstance(t, cl.addrs())
			c := lc.NewClient(t, in.addr, 2)
			key := "held-" + lockclient.RandID()
			tok := "tok-" + lockclient.RandID()
			lc.MustLock(t, c, key, "PX", 20000, "TOKEN", tok)
			lc.MustAcquire(t, c, tc.second, key, "PX", 20000, "TOKEN", tok)
			if got := lc.Unlock(t, c, key, tok); got != 1 {
				t.Fatalf("UNLOCK = %d; want 1", got)
			}
			info, err := c.Do(lockclient.CtxFor(t, 5*time.Second), "LOCKINFO", key).Result()
			if err != nil || info == nil {
				t.Fatalf("LOCKINFO after one UNLOCK = %v, %v; want the remaining hold", info, err)
			}
			if got := metricValue(t, in, "lockproxy_locks_held"); got != "1" {
				t.Errorf("lockproxy_locks_held = %q with one hold left (LOCKINFO %v); want 1", got, info)
			}
			if got := metricValue(t, in, "lockproxy_lock_held_duration_seconds_count"); got != "0" {
				t.Errorf("lockproxy_lock_held_duration_seconds_count = %q before the last hold was released; want 0", got)
			}
			text, err := c.Do(lockclient.CtxFor(t, 5*time.Second), "INFO").Text()
			if err != nil {
				t.Fatalf("INFO: %v", err)
			}
			if m := regexp.MustCompile(`lockproxy_locks_held:(\d+)`).FindStringSubmatch(text); m == nil || m[1] != "1" {
				t.Errorf("INFO lockproxy_locks_held = %v with one hold left; want 1", m)
			}
			if got := lc.Unlock(t, c, key, tok); got != 1 {
				t.Fatalf("second UNLOCK = %d; want 1", got)
			}
			if got := metricValue(t, in, "lockproxy_locks_held"); got != "0" {
				t.Errorf("lockproxy_locks_held = %q after the last UNLOCK; want 0", got)
			}
			if got := metricValue(t, in, "lockproxy_lock_held_duration_seconds_count"); got != "1" {
				t.Errorf("lockproxy_lock_held_duration_seconds_count = %q after the last UNLOCK; want 1", got)
			}
		})
	}
}
