package redis

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestFlushedBetweenChecksDoesNotVote: FLUSHALL on a node changes neither
// its run_id nor its role, and closes no connection, so only the node's
// data epoch (its epoch key, read after every batch and by every new
// writer connection) reveals it. A holds exactly a majority (nodes 0 and
// 2); node 2 is flushed between two checks; B's LOCK must not be granted
// by nodes 1 and 2, and node 2 is quarantined without a check. Rows: the
// writers' connections are kept (the batch's own read sees the epoch
// gone), or killed after the flush (the next connection's set-up finds a
// new epoch, written by its own SET NX); or a health check runs first,
// and reads the epoch gone.
func TestFlushedBetweenChecksDoesNotVote(t *testing.T) {
	tests := []struct {
		name  string
		kill  bool // CLIENT KILL the node's connections after the flush
		check bool // a health check runs after the flush, before B's LOCK
	}{
		{name: "flushall, connections kept"},
		{name: "flushall, connections made again", kill: true},
		{name: "flushall, seen by the next check", check: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, rs := newRealBackend(t, 3, func(cfg *Config) {
				// Checks by hand: the window is the time between two.
				cfg.Quarantine, cfg.MaxTTL, cfg.CheckInterval = true, time.Minute, 0
			})
			ctx := ctxTimeout(t, 20*time.Second)
			checkAll := holdOnNodes02(t, ctx, b, rs)
			direct := rs[2].Client(t)
			if err := direct.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if tt.kill {
				if err := direct.Do(ctx, "CLIENT", "KILL", "TYPE", "normal").Err(); err != nil {
					t.Fatal(err)
				}
			}
			if tt.check {
				checkAll()
				if st, _, _ := b.nodes[2].State(); st != stateQuarantined {
					t.Errorf("node 2 is %s after the check that followed its flush; want %s", st, stateQuarantined)
				}
			}
			if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "B", TTL: 30 * time.Second}); err == nil {
				t.Errorf("B was granted k while A holds it: node 2, flushed, voted before a check saw it")
			}
			// B's LOCK may be decided before node 2 answers (node 1's
			// answer late on a loaded host): its batch sees the flush
			// when it is answered.
			waitFor(t, "node 2 quarantined after its flush was seen", func() bool {
				st, _, _ := b.nodes[2].State()
				return st == stateQuarantined
			})
			for i := 0; i < 2; i++ {
				if st, _, _ := b.nodes[i].State(); st != stateOK {
					t.Errorf("node %d is %s; want %s", i, st, stateOK)
				}
			}
		})
	}
}

// TestEpochUnchangedKeepsVoting: the epoch check does not take a node out
// by itself: many batches, from several writers and two backends sharing
// the nodes (each instance's connections read the one epoch the first
// SET NX wrote), leave every node ok.
func TestEpochUnchangedKeepsVoting(t *testing.T) {
	b, rs := newRealBackend(t, 3, func(cfg *Config) {
		cfg.Quarantine, cfg.MaxTTL, cfg.CheckInterval = true, time.Minute, 0
		for i := range cfg.Nodes {
			cfg.Nodes[i].Workers = 4
		}
	})
	var nodes []*Node
	for _, r := range rs {
		n := newTestNode(t, r)
		nodes = append(nodes, n)
	}
	ctx := ctxTimeout(t, 20*time.Second)
	for i := 0; i < 50; i++ {
		key := string(rune('a'+i%26)) + "k"
		if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "A", TTL: 10 * time.Second}); err != nil {
			t.Fatalf("lock %d: %v", i, err)
		}
		for _, n := range nodes {
			if _, err := n.Acquire(ctx, quorum.Request{Key: "other" + key, Token: "X", TTL: time.Second}); err != nil {
				t.Fatalf("second instance's acquire: %v", err)
			}
		}
		if _, err := b.Unlock(ctx, key, "A"); err != nil {
			t.Fatalf("unlock %d: %v", i, err)
		}
	}
	for i, n := range append(b.nodes, nodes...) {
		if st, _, _ := n.State(); st != stateOK && st != stateDown {
			t.Errorf("node %d is %s; want it voting", i, st)
		}
	}
}

// TestObserveEpoch: the first epoch is adopted, the same one changes
// nothing, another or none quarantines (a new generation, not a restart
// counted), and the first seen after a quarantine started, by a restart
// too, is adopted.
func TestObserveEpoch(t *testing.T) {
	now := time.Unix(1000, 0)
	h := newHealth(time.Minute, func() time.Time { return now })
	steps := []struct {
		v       string
		ok      bool
		changed bool
	}{
		{"", false, false}, // absent before any: nothing to compare with
		{"e1", true, false},
		{"e1", true, false},
		{"e2", true, true}, // replaced by another master's data
		{"e2", true, false},
		{"", false, true}, // flushed
		{"e3", true, false},
	}
	for i, s := range steps {
		gen := h.gen.Load()
		if got := h.observeEpoch(s.v, s.ok); got != s.changed {
			t.Fatalf("step %d (%q, %v): changed = %v; want %v", i, s.v, s.ok, got, s.changed)
		}
		if s.changed && (h.gen.Load() == gen || !h.restarting()) {
			t.Fatalf("step %d: a change must start a quarantine and a new generation", i)
		}
	}
	if _, _, restarts := h.status(); restarts != 0 {
		t.Errorf("restarts = %d; want 0 (no restart was seen)", restarts)
	}
	h.observe(serverInfo{runID: "r1"})
	h.observe(serverInfo{runID: "r2"}) // a restart forgets e3
	if h.observeEpoch("e4", true) {
		t.Errorf("the first epoch after a restart counted as a change")
	}
	// A check compares only, and not across a quarantine begun since its
	// read.
	gen, seq := h.gen.Load(), h.epochSince()
	if h.checkEpoch("e4", true, gen, seq) {
		t.Errorf("a check's same epoch counted as a change")
	}
	h.observeEpoch("", false) // flushed: a quarantine, the epoch forgotten
	if h.checkEpoch("e4", true, gen, seq) || h.checkEpoch("e5", true, h.gen.Load(), h.epochSince()) {
		t.Errorf("a check adopted an epoch, or compared across a quarantine")
	}
	if h.observeEpoch("e6", true) {
		t.Errorf("the first epoch after a quarantine counted as a change")
	}
	if !h.checkEpoch("", false, h.gen.Load(), h.epochSince()) {
		t.Errorf("a check that found the epoch gone did not count as a change")
	}
}

// TestEpochCheckRacingFirstConnect: a health check whose read found the
// epoch key absent (no writer had connected yet), answered after a
// writer's set-up created the key and adopted it, is no change: the node
// was quarantined ("data replaced") a second after lockproxy started in a
// CI run of test/transparent, and a release never reached it.
func TestEpochCheckRacingFirstConnect(t *testing.T) {
	h := newHealth(time.Second, time.Now)
	gen, seq := h.gen.Load(), h.epochSince() // the check's read begins: no epoch known
	if h.observeEpoch("e1", true) {          // a writer's set-up creates and adopts it
		t.Fatal("the first epoch counted as a change")
	}
	if h.checkEpoch("", false, gen, seq) {
		t.Errorf("a check begun before the epoch was known, finding it absent, counted as a change")
	}
	if h.restarting() {
		t.Errorf("node quarantined by a check that raced the first connection")
	}
	// A check begun after it compares.
	if !h.checkEpoch("", false, h.gen.Load(), h.epochSince()) {
		t.Errorf("a check begun with the epoch known, finding it gone, was no change")
	}
}

// BenchmarkAcquireRelease is one exclusive Acquire and its Release on a
// real node, for the allocations per pair (-benchmem).
func BenchmarkAcquireRelease(b *testing.B) {
	harness.RequireBinary(b, "redis-server", "redis-server")
	r := harness.StartRedis(b, harness.RedisOptions{})
	n := NewNode(NodeConfig{Addr: r.Addr, KeyPrefix: "lp:", Timeout: time.Second, Metrics: NewMetrics(nil)})
	b.Cleanup(func() { n.Close() })
	ctx := context.Background()
	req := quorum.Request{Key: "bench", Token: "t", TTL: time.Minute}
	b.ReportAllocs()
	for b.Loop() {
		if g, err := n.Acquire(ctx, req); err != nil || !g.Acquired {
			b.Fatalf("acquire: %+v, %v", g, err)
		}
		if ok, err := n.Release(ctx, "bench", "t", quorum.AnyHold); err != nil || !ok {
			b.Fatalf("release: %v, %v", ok, err)
		}
	}
}

// holdOnNodes02 runs a health check of every node, grants k to token A
// and takes it off node 1, so that A holds exactly a majority, nodes 0
// and 2, and checks every node again. It returns the check, which the
// data-epoch tests run by hand (CheckInterval 0).
func holdOnNodes02(t *testing.T, ctx context.Context, b *Backend, rs []*harness.Redis) (checkAll func()) {
	t.Helper()
	checkAll = func() {
		for _, n := range b.nodes {
			cctx, cancel := context.WithTimeout(ctx, checkTimeout)
			n.check(cctx)
			cancel()
		}
	}
	checkAll()
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "A", TTL: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if err := rs[1].Client(t).Del(ctx, "lp:lock:k", "lp:lockf:k", "lp:lockm:k").Err(); err != nil {
		t.Fatal(err)
	}
	checkAll()
	return checkAll
}
