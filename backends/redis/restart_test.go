package redis

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/test/harness"
)

// quarantine puts node n in quarantine as if it had restarted; with the
// backend's tiny period the re-seed is due at once.
func quarantine(t *testing.T, n *Node) {
	t.Helper()
	n.health.observe(serverInfo{runID: "before"})
	if !n.health.observe(serverInfo{runID: "after-" + strconv.Itoa(int(n.health.restart))}) {
		t.Fatalf("%s: no restart seen", n.Name())
	}
}

// TestReseed checks which other nodes a quarantined node is re-seeded from
// and when it must stay out.
func TestReseed(t *testing.T) {
	tests := []struct {
		name        string
		nodes       int
		quarantined []int // besides node 0
		down        []int
		fences      []map[string]string // per node, HSET before
		wantErr     bool
		want        map[string]string // node 0's fence hash after
	}{
		{
			name:  "max of the healthy nodes",
			nodes: 5,
			fences: []map[string]string{
				{"1": "1"}, {"1": "7", "2": "3"}, {"1": "9"}, {"2": "4"}, {"3": "2"},
			},
			want: map[string]string{"1": "9", "2": "4", "3": "2"},
		},
		{
			name:        "quarantined nodes are not read",
			nodes:       5,
			quarantined: []int{4},
			fences: []map[string]string{
				nil, {"1": "7"}, {"1": "9"}, {"2": "4"}, {"1": "100"},
			},
			want: map[string]string{"1": "9", "2": "4"},
		},
		{
			name:  "never lowers a counter",
			nodes: 3,
			fences: []map[string]string{
				{"1": "50"}, {"1": "7"}, {"1": "9"},
			},
			want: map[string]string{"1": "50"},
		},
		{
			name:    "too few answers: stays quarantined",
			nodes:   5,
			down:    []int{1, 2},
			fences:  []map[string]string{nil, nil, nil, {"1": "3"}, {"1": "4"}},
			wantErr: true,
			want:    map[string]string{},
		},
		{
			name:        "majority restarted: seeded from whatever answers",
			nodes:       5,
			quarantined: []int{1, 2},
			fences:      []map[string]string{nil, {"1": "1"}, nil, {"1": "3"}, {"1": "4"}},
			want:        map[string]string{"1": "4"},
		},
		{
			name:  "single node",
			nodes: 1,
			want:  map[string]string{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mrs := startNodes(t, tt.nodes)
			cfg := Config{Quarantine: true, MaxTTL: time.Nanosecond}
			for _, m := range mrs {
				cfg.Nodes = append(cfg.Nodes, NodeConfig{Addr: m.Addr(), KeyPrefix: "lp:"})
			}
			b, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.Close() })
			for i, f := range tt.fences {
				for k, v := range f {
					mrs[i].HSet("lp:fence", k, v)
				}
			}
			quarantine(t, b.nodes[0])
			for _, i := range tt.quarantined {
				quarantine(t, b.nodes[i])
			}
			for _, i := range tt.down {
				mrs[i].Close()
			}
			time.Sleep(time.Millisecond) // past the period
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err = b.reseed(ctx, 0)
			if (err != nil) != tt.wantErr {
				t.Fatalf("reseed = %v; want error %v", err, tt.wantErr)
			}
			if got := b.nodes[0].health.quarantined(); got != tt.wantErr {
				t.Errorf("quarantined after reseed = %v; want %v", got, tt.wantErr)
			}
			got := map[string]string{}
			keys, _ := mrs[0].HKeys("lp:fence") // an error when there is no hash
			for _, k := range keys {
				if k != fenceHashPad { // added by the writers' connections
					got[k] = mrs[0].HGet("lp:fence", k)
				}
			}
			if len(got) != len(tt.want) {
				t.Errorf("node 0 fences = %v; want %v", got, tt.want)
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("node 0 fence %s = %q; want %q (all: %v)", k, got[k], v, got)
				}
			}
		})
	}
}

// TestQuarantineFailsFast: a quarantined node answers acquires, raises and
// extends with the "quarantined" reason at once, and still releases.
func TestQuarantineFailsFast(t *testing.T) {
	m := miniredis.RunT(t)
	n := NewNode(NodeConfig{Addr: m.Addr(), KeyPrefix: "lp:", Quarantine: time.Hour})
	t.Cleanup(func() { _ = n.Close() })
	ctx := ctxTimeout(t, 5*time.Second)
	if _, err := n.Acquire(ctx, quorum.Request{Key: "k", Token: "t", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	quarantine(t, n)
	m.Close() // no I/O may be needed for the answers below

	check := func(op string, err error) {
		t.Helper()
		if r := quorum.Reason(err); r != "quarantined" {
			t.Errorf("%s on a quarantined node: %v (reason %q); want reason quarantined", op, err, r)
		}
	}
	_, err := n.Acquire(ctx, quorum.Request{Key: "k2", Token: "t", TTL: time.Minute})
	check("Acquire", err)
	_, err = n.RaiseFence(ctx, "k", "t", 5)
	check("RaiseFence", err)
	_, err = n.Extend(ctx, "k", "t", time.Minute)
	check("Extend", err)
	errs := make(chan error, 3)
	n.StartAcquire(ctx, quorum.Request{Key: "k2", Token: "t", TTL: time.Minute}, func(_ quorum.NodeGrant, err error) { errs <- err })
	n.StartRaiseFence(ctx, "k", "t", 5, func(_ bool, err error) { errs <- err })
	n.StartExtend(ctx, "k", "t", time.Minute, func(_ bool, err error) { errs <- err })
	for _, op := range []string{"StartAcquire", "StartRaiseFence", "StartExtend"} {
		check(op, <-errs)
	}
	// Release is still sent: here it reaches a closed node and fails on
	// the network, not with the quarantine.
	if _, err := n.Release(ctx, "k", "t", quorum.AnyHold); err == nil || errors.Is(err, errQuarantined) {
		t.Errorf("Release on a quarantined, closed node = %v; want a network error", err)
	}
}

// TestRestartDetected restarts a real redis-server empty and checks that
// the first operation after it fails as quarantined (the new connection
// learns the new run_id before the command runs), that the node is re-seeded
// from the others after the period, and then votes again.
func TestRestartDetected(t *testing.T) {
	harness.RequireBinary(t, "redis-server", "redis-server")
	rs := harness.StartRedisN(t, 3, harness.RedisOptions{})
	const maxTTL = 500 * time.Millisecond
	cfg := Config{Quarantine: true, MaxTTL: maxTTL, CheckInterval: 50 * time.Millisecond,
		Quorum: quorum.Config{DriftFactor: 0.01, DriftMin: 2 * time.Millisecond}}
	for _, r := range rs {
		cfg.Nodes = append(cfg.Nodes, NodeConfig{Addr: r.Addr, KeyPrefix: "lp:", Metrics: NewMetrics(nil)})
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	ctx := ctxTimeout(t, 20*time.Second)
	var fence uint64
	for i := 0; i < 5; i++ {
		l, err := b.q.Acquire(ctx, quorum.Request{Key: "k", Token: "t" + strconv.Itoa(i), TTL: time.Second})
		if err != nil {
			t.Fatalf("Acquire %d: %v", i, err)
		}
		fence = l.Fence
		if _, err := b.q.Release(ctx, "k", l.Token, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	n := b.nodes[0]
	waitFor(t, "first run_id learned", func() bool { n.health.mu.Lock(); defer n.health.mu.Unlock(); return n.health.seen })

	rs[0].Restart()
	start := time.Now()
	_, err = n.Acquire(ctx, quorum.Request{Key: "other", Token: "x", TTL: time.Second})
	if r := quorum.Reason(err); r != "quarantined" {
		t.Fatalf("first Acquire after the restart = %v (reason %q); want reason quarantined", err, r)
	}
	if st, left, restarts := n.State(); st != stateQuarantined || left <= 0 || restarts != 1 {
		t.Errorf("State after the restart = %s, %d ms, %d; want quarantined, > 0, 1", st, left, restarts)
	}
	waitFor(t, "quarantine over", func() bool { return !n.health.quarantined() })
	if took := time.Since(start); took < maxTTL {
		t.Errorf("quarantine lasted %v; want at least max TTL %v", took, maxTTL)
	}
	direct := rs[0].Client(t)
	got, err := direct.HGet(ctx, "lp:fence", strconv.Itoa(int(slot("k")))).Uint64()
	if err != nil || got < fence {
		t.Errorf("re-seeded fence of k's slot = %d, %v; want >= %d", got, err, fence)
	}
	// The node votes again: it grants directly, and takes part in a
	// quorum's grant (which answers once a majority granted, so look at
	// the node itself).
	if g, err := n.Acquire(ctx, quorum.Request{Key: "direct", Token: "d", TTL: time.Second}); err != nil || !g.Acquired {
		t.Errorf("node Acquire after the quarantine = %+v, %v; want a grant", g, err)
	}
	l, err := b.q.Acquire(ctx, quorum.Request{Key: "k", Token: "after", TTL: 5 * time.Second})
	if err != nil || l.Fence <= fence {
		t.Fatalf("Acquire after the quarantine = %+v, %v; want a grant with fence > %d", l, err, fence)
	}
	waitFor(t, "the grant on the re-seeded node", func() bool {
		v, _ := direct.Get(ctx, "lp:lock:k").Result()
		return v == "after"
	})
}
