package redis_test

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends/redis"
)

// TestLateAcquireOnDelayedLinkKilled: where the acquire is still on its
// way when the writer reconnects (a link that delays it by 3 s, then
// heals), the roll-back alone would run first and the acquire land after
// it, keeping its key for its TTL. The kill sent ahead of the roll-back
// ends the old connection on the node before the acquire reaches it, so
// it never runs. Where the ACL refuses CLIENT KILL or CLIENT ID no kill
// is attempted, and the key may land late and stay, as before kills.
func TestLateAcquireOnDelayedLinkKilled(t *testing.T) {
	// Mostly waits for the delayed link: beside the other such tests,
	// each case on nodes of its own.
	t.Parallel()
	const delay = 3 * time.Second
	for _, tc := range []struct {
		user  redis.LateAcquireUser
		lands bool
	}{
		{redis.DefaultUser, false},
		{redis.NoKillUser, true},
		{redis.NoIDUser, true},
	} {
		t.Run(tc.user.Name, func(t *testing.T) {
			t.Parallel()
			b, rs, logs, p := backendWithN2Link(t, tc.user)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			const key = "late-delayed"
			const ttl = 10 * time.Second // node timeout 250 ms

			start := redis.LateAttempt(ctx, t, b, rs, key, ttl, func() { p.SetLatency(delay, 0) })
			p.PassThrough() // new bytes flow at once; the acquire keeps its delay
			first, last := redis.WatchLateKey(ctx, t, rs[2], key, start.Add(delay+time.Second))
			switch {
			case !tc.lands && !first.IsZero():
				t.Fatalf("the failed attempt's key landed on n2 %v after the LOCK, after the writer reconnected", first.Sub(start))
			case tc.lands && !first.IsZero():
				// Not asserted: whether the delayed bytes land depends on
				// how the proxy's link ends when the writer closes it.
				t.Logf("without the kill, the failed attempt's key was on n2 from %v to %v after the LOCK", first.Sub(start), last.Sub(start))
			}
			killed := logs.FilterMessage("killed a dropped connection").All()
			switch {
			case tc.user == redis.DefaultUser && (len(killed) == 0 || killed[0].ContextMap()["killed"] != int64(1)):
				t.Errorf("kills logged: %v; want the dropped connection killed (1)", killed)
			case tc.user != redis.DefaultUser && len(killed) > 0:
				t.Errorf("kills logged: %v; want none", killed)
			}
		})
	}
}
