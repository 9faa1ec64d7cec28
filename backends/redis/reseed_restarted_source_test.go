package redis

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
)

// TestReseedIgnoresSourceThatRestartedDuringRead: a node re-seeded from
// the others must read N - majority + 1 nodes that kept their fences. A
// source that restarted empty since its last check is not known to have
// lost its state when the re-seed picks its sources; the read's own new
// connection reveals the restart (onConnect), but the HGETALL then runs on
// the new, empty server, and its empty answer used to count as one of the
// sources. With five nodes, a grant of fence 100 on {0, 1, 4}, node 0 and
// node 1 restarted, node 4 down: only nodes 2 and 3 are left that kept
// their state, which is not enough to know the fence (a majority of the
// fence's nodes is lost or away). The re-seed must fail and node 0 stay
// out; before the fix it was seeded from {1 (empty), 2, 3}, voted again,
// and the next grant of the key had fence 6.
func TestReseedIgnoresSourceThatRestartedDuringRead(t *testing.T) {
	b, rs := newRealBackend(t, 5, func(cfg *Config) {
		// A period of about DriftMin: the re-seed is due at once. No
		// periodic checks: the test runs them.
		cfg.Quarantine, cfg.MaxTTL, cfg.CheckInterval = true, time.Millisecond, 0
	})
	ctx := ctxTimeout(t, 20*time.Second)
	check := func(i int) {
		cctx, cancel := context.WithTimeout(ctx, checkTimeout)
		defer cancel()
		b.nodes[i].check(cctx)
	}
	for i := range b.nodes {
		check(i) // every node's run_id is known
	}
	field := strconv.Itoa(int(slot("k")))
	for i, v := range []string{"100", "100", "5", "5", "100"} {
		if err := rs[i].Client(t).HSet(ctx, "lp:fence", field, v).Err(); err != nil {
			t.Fatal(err)
		}
	}

	rs[0].Restart()
	check(0)
	if !b.nodes[0].health.restarting() {
		t.Fatal("node 0 not quarantined after its restart")
	}
	rs[1].Restart() // not checked yet: still counts as healthy
	rs[4].Kill()
	waitFor(t, "node 0's period over", b.nodes[0].health.seedDue)

	err := b.reseed(ctx, 0)
	t.Logf("reseed: %v; node 1 restarting now: %v", err, b.nodes[1].health.restarting())
	if err == nil {
		t.Errorf("reseed of node 0 from two nodes that kept their fences (and one that restarted) succeeded; want errSeedSources")
	}
	if !b.nodes[0].health.restarting() {
		t.Errorf("node 0 votes again without a fence from a node that kept it")
	}
	// What it costs: a grant of the key now.
	l, err := b.q.Acquire(ctx, quorum.Request{Key: "k", Token: "after", TTL: time.Second})
	if err == nil && l.Fence <= 100 {
		t.Errorf("grant after the re-seed has fence %d; a grant before had 100: fences went backwards", l.Fence)
	}
}
