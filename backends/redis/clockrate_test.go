package redis

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/lockproxy/lockproxy/quorum"
)

// Now makes fakeClock a quorum.Clock.
func (c *fakeClock) Now() time.Time { return c.now() }

var clockBase = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// reading is one TIME sample for the estimator: at local offset at (from
// clockBase), a round trip of rtt, the node's clock reading node (an
// offset from clockBase too).
type reading struct {
	at, rtt, node time.Duration
}

// steady gives n readings every step, from start, of a node clock running
// at rate with the given per-sample errors (cycled; none if empty).
func steady(n int, start, step time.Duration, rate float64, noise ...time.Duration) []reading {
	out := make([]reading, n)
	for i := range out {
		at := start + time.Duration(i)*step
		node := time.Duration(float64(at) * rate)
		if len(noise) > 0 {
			node += noise[i%len(noise)]
		}
		out[i] = reading{at: at, node: node}
	}
	return out
}

// withRTT gives every reading the round trip rtt.
func withRTT(rs []reading, rtt time.Duration) []reading {
	for i := range rs {
		rs[i].rtt = rtt
	}
	return rs
}

func feed(e *rateEstimator, rs []reading) (kept int) {
	for _, r := range rs {
		sent := clockBase.Add(r.at - r.rtt/2)
		if e.add(sent, sent.Add(r.rtt), clockBase.Add(r.node).UnixMicro()) {
			kept++
		}
	}
	return kept
}

func TestRateEstimator(t *testing.T) {
	cat := func(parts ...[]reading) []reading {
		var out []reading
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	// Large-RTT readings whose node time is far off: they must not count.
	slow := steady(10, 500*time.Millisecond, 2*time.Second, 1.5)
	for i := range slow {
		slow[i].rtt = 30 * time.Millisecond
	}
	tests := []struct {
		name     string
		readings []reading
		reset    bool // reset after the readings
		wantOK   bool
		want     float64 // rate
		tol      float64
		wantKept int // -1: all
		wantLen  int // samples in the window; -1: don't check
	}{
		{"exact slope 1", steady(20, 0, time.Second, 1), false, true, 1, 1e-9, -1, -1},
		{"exact fast clock", steady(20, 0, time.Second, 1.03), false, true, 1.03, 1e-9, -1, -1},
		{"exact slow clock", steady(20, 0, time.Second, 0.9), false, true, 0.9, 1e-9, -1, -1},
		{"noise of a few ms", steady(60, 0, time.Second, 1.02,
			3*time.Millisecond, -2*time.Millisecond, 0, 4*time.Millisecond, -5*time.Millisecond, time.Millisecond),
			false, true, 1.02, 2e-4, -1, -1},
		{"too few samples", steady(2, 0, 5*time.Second, 1), false, false, 0, 0, -1, -1},
		{"span too short", steady(6, 0, 300*time.Millisecond, 1), false, false, 0, 0, -1, -1},
		{"short round trips: an estimate after 2 s", withRTT(steady(3, 0, time.Second, 1.03), 200*time.Microsecond),
			false, true, 1.03, 1e-9, -1, -1},
		{"long round trips: none after 4 s", withRTT(steady(5, 0, time.Second, 1.03), 19*time.Millisecond),
			false, false, 0, 0, -1, -1},
		{"long round trips: one after 10 s", withRTT(steady(11, 0, time.Second, 1.03), 19*time.Millisecond),
			false, true, 1.03, 1e-9, -1, -1},
		{"large round trips ignored", cat(steady(12, 0, 2*time.Second, 1), slow), false, true, 1, 1e-9, 12, -1},
		{"clock standing still gives nothing", steady(10, 0, 0, 1), false, false, 0, 0, 1, -1},
		{"fast checks thinned to a sample a second", steady(200, 0, 250*time.Millisecond, 1.04), false, true, 1.04, 1e-9, 50, 50},
		{"window keeps the last 60", cat(steady(60, 0, time.Second, 1.2), steady(60, 60*time.Second, time.Second, 1)),
			false, true, 1, 1e-9, -1, 60},
		{"window keeps ten minutes", cat(steady(10, 0, time.Minute, 1.3), steady(12, 20*time.Minute, time.Second, 1)),
			false, true, 1, 1e-9, -1, 12},
		{"reset forgets", steady(20, 0, time.Second, 1.1), true, false, 0, 0, -1, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newRateEstimator()
			kept := feed(e, tc.readings)
			if tc.wantKept >= 0 && kept != tc.wantKept {
				t.Errorf("kept %d samples; want %d", kept, tc.wantKept)
			}
			if tc.reset {
				e.reset()
			}
			if tc.wantLen >= 0 && len(e.samples) != tc.wantLen {
				t.Errorf("window holds %d samples; want %d", len(e.samples), tc.wantLen)
			}
			got, ok := e.rate()
			if ok != tc.wantOK || (ok && math.Abs(got-tc.want) > tc.tol) {
				t.Fatalf("rate() = %.9f, %v; want %.9f ± %g, %v", got, ok, tc.want, tc.tol, tc.wantOK)
			}
			if ok {
				re, _ := e.rateError()
				if math.Abs(re-math.Abs(tc.want-1)) > tc.tol {
					t.Errorf("rateError() = %.9f; want %.9f", re, math.Abs(tc.want-1))
				}
			}
		})
	}
}

// newClockBackend is a backend over miniredis nodes whose health checks
// the test runs itself, on a fake clock.
func newClockBackend(t *testing.T, nodes int, driftFactor, maxRateErr float64) (*Backend, []*miniredis.Miniredis, *fakeClock) {
	t.Helper()
	ms := startNodes(t, nodes)
	clk := &fakeClock{t: clockBase}
	cfg := Config{
		Quorum:            quorum.Config{DriftFactor: driftFactor, DriftMin: 2 * time.Millisecond, Clock: clk},
		MaxClockRateError: maxRateErr,
		Metrics:           NewMetrics(nil),
	}
	for _, m := range ms {
		cfg.Nodes = append(cfg.Nodes, NodeConfig{Addr: m.Addr(), KeyPrefix: "lp:", Metrics: cfg.Metrics})
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b, ms, clk
}

// TestDriftRule checks the extra drift for given per-node rate errors.
func TestDriftRule(t *testing.T) {
	const unknown = -1
	tests := []struct {
		name       string
		drift      float64
		bound      float64
		errs       []float64
		wantExtra  float64
		wantVoting []bool
	}{
		{"nothing measured", 0.01, 0.05, []float64{unknown, unknown, unknown}, 0, nil},
		{"all within the drift factor", 0.01, 0.05, []float64{0.001, 0.0099, 0}, 0, nil},
		{"one node beyond it", 0.01, 0.05, []float64{0.03, 0, 0}, 0.02, nil},
		{"largest voting error counts", 0.01, 0.05, []float64{0.03, 0.045, unknown}, 0.035, nil},
		{"out-of-bound nodes do not count", 0.01, 0.05, []float64{0.03, 0.2, 0}, 0.02, nil},
		{"at the bound still votes", 0.01, 0.05, []float64{0.05, 0, 0}, 0.04, nil},
		{"no bound: every error counts", 0.01, 0, []float64{0.2, 0, 0}, 0.19, nil},
		{"no drift factor", 0, 0.05, []float64{0.004, 0.001, 0.002}, 0.004, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, _, _ := newClockBackend(t, len(tc.errs), tc.drift, tc.bound)
			for i, e := range tc.errs {
				b.nodes[i].applyClock(e, e >= 0)
			}
			if got := b.ExtraDriftRatio(); math.Abs(got-tc.wantExtra) > 1e-12 {
				t.Errorf("ExtraDriftRatio() = %g; want %g", got, tc.wantExtra)
			}
			const ttl = 10 * time.Second
			want := time.Duration(float64(ttl)*tc.drift) + 2*time.Millisecond + time.Duration(float64(ttl)*tc.wantExtra)
			if got := b.q.Drift(ttl); got < want || got > want+time.Microsecond {
				t.Errorf("Drift(%v) = %v; want %v", ttl, got, want)
			}
			for i, e := range tc.errs {
				out := tc.bound > 0 && e > tc.bound
				if got := b.nodes[i].health.refuse(); (got != nil) != out {
					t.Errorf("node %d with rate error %g: refuse() = %v; want out %v", i, e, got, out)
				}
			}
		})
	}
}

// TestExtraDriftKeepsCallersHook checks that a caller's own ExtraDrift is
// still added.
func TestExtraDriftKeepsCallersHook(t *testing.T) {
	ms := startNodes(t, 1)
	b, err := New(Config{
		Quorum: quorum.Config{DriftFactor: 0.01, ExtraDrift: func(time.Duration) time.Duration { return time.Second }},
		Nodes:  []NodeConfig{{Addr: ms[0].Addr()}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	b.nodes[0].applyClock(0.11, true)
	if got, want := b.q.Drift(10*time.Second), 100*time.Millisecond+time.Second+time.Second; got != want {
		t.Errorf("Drift(10s) = %v; want %v", got, want)
	}
}

// TestClockOutFailsFast checks that a node whose clock is out of bound
// refuses votes without I/O, with reason "clock", still sends releases,
// and that a restart's quarantine names itself first.
func TestClockOutFailsFast(t *testing.T) {
	m := miniredis.RunT(t)
	n := NewNode(NodeConfig{Addr: m.Addr(), KeyPrefix: "lp:", Quarantine: time.Hour, MaxClockRateError: 0.05})
	t.Cleanup(func() { _ = n.Close() })
	ctx := ctxTimeout(t, 5*time.Second)
	if _, err := n.Acquire(ctx, quorum.Request{Key: "k", Token: "t", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	n.applyClock(0.08, true)
	if st, _, _ := n.State(); st != stateClock {
		t.Errorf("State() = %s; want %s", st, stateClock)
	}
	if ok, err := n.Release(ctx, "k", "t", quorum.AnyHold); err != nil || !ok {
		t.Errorf("Release on a clock-out node = %v, %v; want true, nil", ok, err)
	}
	m.Close() // no I/O may be needed for the answers below
	check := func(op string, err error, want string) {
		t.Helper()
		if r := quorum.Reason(err); r != want {
			t.Errorf("%s = %v (reason %q); want reason %s", op, err, r, want)
		}
	}
	_, err := n.Acquire(ctx, quorum.Request{Key: "k2", Token: "t", TTL: time.Minute})
	check("Acquire", err, "clock")
	_, err = n.RaiseFence(ctx, "k", "t", 5)
	check("RaiseFence", err, "clock")
	_, err = n.Extend(ctx, "k", "t", time.Minute)
	check("Extend", err, "clock")
	errs := make(chan error, 1)
	n.StartAcquire(ctx, quorum.Request{Key: "k2", Token: "t", TTL: time.Minute}, func(_ quorum.NodeGrant, err error) { errs <- err })
	check("StartAcquire", <-errs, "clock")
	if reasonLabel(errClock) != "clock" {
		t.Errorf("reasonLabel(errClock) = %q; want clock", reasonLabel(errClock))
	}

	n.learn(serverInfo{runID: "before"})
	if !n.learn(serverInfo{runID: "after"}) {
		t.Fatal("no restart seen")
	}
	_, err = n.Acquire(ctx, quorum.Request{Key: "k2", Token: "t", TTL: time.Minute})
	check("Acquire, restarted too", err, "quarantined")
	if e, ok := n.ClockRateError(); ok {
		t.Errorf("rate error after a restart = %g; want none (samples reset)", e)
	}
	// The restart reset the estimate: the next check brings the node back
	// as far as its clock goes.
	n.applyClock(0, false)
	if !n.health.restarting() || n.health.blocked.Load()&blockClock != 0 {
		t.Errorf("blocked = %b; want the restart bit only", n.health.blocked.Load())
	}
}

// TestClockMeasuredOnChecks drives three miniredis nodes' clocks at given
// rates against the proxy's fake clock, runs the health checks, and checks
// the estimates, the exclusion, the extra drift and INFO.
func TestClockMeasuredOnChecks(t *testing.T) {
	b, ms, clk := newClockBackend(t, 3, 0.01, 0.05)
	ctx := ctxTimeout(t, 20*time.Second)
	rates := []float64{1, 1.03, 1.10}
	nodeAt := make([]time.Time, len(ms))
	for i := range nodeAt {
		nodeAt[i] = clockBase.Add(time.Duration(i) * time.Hour) // offsets don't matter
	}
	step := func(rates []float64, n int) {
		for range n {
			clk.advance(time.Second)
			for i, m := range ms {
				nodeAt[i] = nodeAt[i].Add(time.Duration(float64(time.Second) * rates[i]))
				m.SetTime(nodeAt[i])
				b.nodes[i].check(ctx)
			}
		}
	}
	step(rates, sampleMinSamples-1)
	for i, n := range b.nodes {
		if e, ok := n.ClockRateError(); ok {
			t.Fatalf("node %d has an estimate %g after %d samples", i, e, sampleMinSamples-1)
		}
	}
	step(rates, 15)
	for i, n := range b.nodes {
		e, ok := n.ClockRateError()
		if !ok || math.Abs(e-math.Abs(rates[i]-1)) > 1e-6 {
			t.Errorf("node %d: ClockRateError() = %g, %v; want %g", i, e, ok, math.Abs(rates[i]-1))
		}
	}
	if got := b.ExtraDriftRatio(); math.Abs(got-0.02) > 1e-6 {
		t.Errorf("ExtraDriftRatio() = %g; want 0.02 (node 1 at 3 %%; node 2 is out)", got)
	}
	_, err := b.nodes[2].Acquire(ctx, quorum.Request{Key: "k", Token: "t", TTL: time.Second})
	if r := quorum.Reason(err); r != "clock" {
		t.Errorf("Acquire on the 10 %% node = %v (reason %q); want reason clock", err, r)
	}
	states := b.NodeStates()
	for i, want := range []string{"state=ok", "state=ok", "state=clock"} {
		if !strings.Contains(states[i], ","+want+",") {
			t.Errorf("NodeStates()[%d] = %q; want %s", i, states[i], want)
		}
	}
	if !strings.HasSuffix(states[1], ",rate_error_ppm=30000") {
		t.Errorf("NodeStates()[1] = %q; want rate_error_ppm=30000", states[1])
	}
	// The quorum still grants with two voters of three.
	if _, err := b.q.Acquire(ctx, quorum.Request{Key: "k", Token: "t", TTL: 10 * time.Second}); err != nil {
		t.Errorf("quorum Acquire with one clock-out node: %v", err)
	}

	// The fast clocks are fixed: once the window has moved on, node 2
	// votes again and the extra drift is gone.
	step([]float64{1, 1, 1}, sampleWindow)
	if err := b.nodes[2].health.refuse(); err != nil {
		t.Errorf("node 2 after its clock was fixed: %v; want it voting", err)
	}
	if got := b.ExtraDriftRatio(); got > 1e-6 {
		t.Errorf("ExtraDriftRatio() after the clocks were fixed = %g; want 0", got)
	}
}

// TestClockRateRealRedis samples a real redis-server's TIME (whose clock is
// ours) at a fast interval and checks that the measured rate error is tiny.
func TestClockRateRealRedis(t *testing.T) {
	n, _ := nodeOnRedis(t)
	// Instead of 10 s and a sample a second, to fit a unit test.
	n.clock.est.minSpan, n.clock.est.minGap = time.Second, 0
	ctx := ctxTimeout(t, 10*time.Second)
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		n.check(ctx)
		time.Sleep(20 * time.Millisecond)
	}
	e, ok := n.ClockRateError()
	if !ok || e > 0.001 {
		t.Fatalf("ClockRateError() of a local redis-server = %g, %v; want < 0.1 %%", e, ok)
	}
	t.Logf("local redis-server: rate error %.1f ppm over %d samples", e*1e6, len(n.clock.est.samples))
}

// TestCheckHasNoPerCommandCost checks that operations do not touch the
// clock sampler: only health checks add samples.
func TestCheckHasNoPerCommandCost(t *testing.T) {
	ms := startNodes(t, 1)
	n := NewNode(NodeConfig{Addr: ms[0].Addr(), KeyPrefix: "lp:"})
	t.Cleanup(func() { _ = n.Close() })
	ctx := ctxTimeout(t, 5*time.Second)
	for i := range 10 {
		if _, err := n.Acquire(ctx, quorum.Request{Key: "k", Token: "t", TTL: time.Duration(i+1) * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(n.clock.est.samples); got != 0 {
		t.Errorf("%d clock samples after 10 operations; want 0", got)
	}
	n.check(context.Background())
	if got := len(n.clock.est.samples); got != 1 {
		t.Errorf("%d clock samples after one check; want 1", got)
	}
}

// BenchmarkDrift measures the drift computation every acquisition makes,
// with the measured extra drift (one atomic load) and without any hook.
func BenchmarkDrift(b *testing.B) {
	plain, err := quorum.New([]quorum.Node{nil}, quorum.Config{DriftFactor: 0.01, DriftMin: 2 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	be := &Backend{}
	be.extraRatio.Store(math.Float64bits(0.02))
	hooked, err := quorum.New([]quorum.Node{nil}, quorum.Config{DriftFactor: 0.01, DriftMin: 2 * time.Millisecond, ExtraDrift: be.extraDrift})
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		q    *quorum.Quorum
	}{{"plain", plain}, {"measured", hooked}} {
		b.Run(bc.name, func(b *testing.B) {
			var sink time.Duration
			for i := 0; b.Loop(); i++ {
				sink += bc.q.Drift(time.Duration(i&1023) * time.Millisecond)
			}
			_ = sink
		})
	}
}

// TestRateChangeSeenSoon: a node whose clock turns fast after a minute at
// the right rate. The whole window's fit follows slowly; the error the
// estimator reports (the larger of it and the latest samples' fit) shows
// the new rate within three samples, two seconds.
func TestRateChangeSeenSoon(t *testing.T) {
	e := newRateEstimator()
	before := withRTT(steady(60, 0, time.Second, 1), 200*time.Microsecond)
	feed(e, before)
	if re, ok := e.rateError(); !ok || re > 1e-6 {
		t.Fatalf("rateError before the change = %g, %v; want about 0", re, ok)
	}
	// From 60 s on the node's clock runs 1.5× fast, continuing from where
	// it was.
	last := before[len(before)-1]
	for i := 1; i <= 3; i++ {
		at := last.at + time.Duration(i)*time.Second
		node := last.node + time.Duration(float64(at-last.at)*1.5)
		feed(e, []reading{{at: at, node: node, rtt: 200 * time.Microsecond}})
		re, ok := e.rateError()
		full, _ := e.rate()
		t.Logf("%d s after the change: window fit %.4f, reported error %.4f", i, full, re)
		if i == 1 && ok && re > 0.3 {
			t.Errorf("one sample after the change the error is already %.3f; the recent fit needs two seconds", re)
		}
		if i >= 2 && (!ok || math.Abs(re-0.5) > 1e-3) {
			t.Errorf("%d s after the change: rateError = %g, %v; want 0.5", i, re, ok)
		}
	}
}
