package redis

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/test/harness"
)

// readyBackend is a backend over three real redis-servers whose
// quarantine outlasts any test: a node put in it stays out.
func readyBackend(t *testing.T, checkEvery time.Duration) (*Backend, []*harness.Redis) {
	t.Helper()
	b, rs := newRealBackend(t, 3, func(cfg *Config) {
		cfg.Quarantine, cfg.MaxTTL, cfg.CheckInterval = true, time.Hour, checkEvery
	})
	for _, n := range b.nodes {
		waitFor(t, n.Name()+": first run_id learned", func() bool {
			n.health.mu.Lock()
			defer n.health.mu.Unlock()
			return n.health.seen
		})
	}
	return b, rs
}

// TestReadyCountsVoters: Ready needs a majority of nodes that answer AND
// may vote AND take writes AND run scripts; one that answers PING while
// quarantined after a restart, out for its clock, refusing every write
// (maxmemory reached, too few replicas for min-replicas-to-write) or every
// script (an ACL without @scripting, or without EVALSHA, which every lock
// operation but a first grant's batch sends) grants nothing, so /readyz
// must not count it.
func TestReadyCountsVoters(t *testing.T) {
	tests := []struct {
		name        string
		quarantined []int               // put in quarantine as if restarted
		clockOut    []int               // taken out for their clock
		down        []int               // stopped
		config      map[int][][2]string // CONFIG SET parameter value, by node
		acl         map[int][]string    // ACL SETUSER default rules, by node
		wantOK      int                 // nodes that count; ready when >= 2
		wantErr     map[int]error       // by node; nil: any error (down)
		wantText    string              // in Ready's error, when not ""
	}{
		{name: "all vote", wantOK: 3},
		{name: "one quarantined", quarantined: []int{0}, wantOK: 2},
		{name: "one clock out", clockOut: []int{1}, wantOK: 2},
		{name: "two quarantined", quarantined: []int{0, 2}, wantOK: 1, wantErr: map[int]error{0: errQuarantined, 2: errQuarantined}},
		{name: "one quarantined, one clock out", quarantined: []int{0}, clockOut: []int{1}, wantOK: 1, wantErr: map[int]error{0: errQuarantined, 1: errClock}},
		{name: "one down, one quarantined", quarantined: []int{1}, down: []int{2}, wantOK: 1, wantErr: map[int]error{1: errQuarantined, 2: nil}},
		{name: "one out of memory", config: map[int][][2]string{0: {{"maxmemory-policy", "noeviction"}, {"maxmemory", "1"}}}, wantOK: 2},
		{name: "two out of memory", config: map[int][][2]string{
			0: {{"maxmemory-policy", "noeviction"}, {"maxmemory", "1"}},
			2: {{"maxmemory-policy", "noeviction"}, {"maxmemory", "1"}},
		}, wantOK: 1, wantErr: map[int]error{0: nil, 2: nil}, wantText: "OOM"},
		{name: "two without their replicas", config: map[int][][2]string{
			1: {{"min-replicas-to-write", "1"}},
			2: {{"min-replicas-to-write", "1"}},
		}, wantOK: 1, wantErr: map[int]error{1: nil, 2: nil}, wantText: "NOREPLICAS"},
		{name: "one without scripting", acl: map[int][]string{1: {"-@scripting"}}, wantOK: 2},
		{name: "two without scripting", acl: map[int][]string{0: {"-@scripting"}, 1: {"-@scripting"}},
			wantOK: 1, wantErr: map[int]error{0: nil, 1: nil}, wantText: "refuses scripts: NOPERM"},
		// EVAL alone would pass: the batches send EVALSHA.
		{name: "two without EVALSHA", acl: map[int][]string{1: {"-evalsha"}, 2: {"-evalsha"}},
			wantOK: 1, wantErr: map[int]error{1: nil, 2: nil}, wantText: "refuses scripts"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, rs := readyBackend(t, 0)
			for _, i := range tt.quarantined {
				quarantine(t, b.nodes[i])
			}
			for _, i := range tt.clockOut {
				b.nodes[i].health.setClockOut(true)
			}
			for _, i := range tt.down {
				rs[i].Kill()
			}
			ctx := ctxTimeout(t, 5*time.Second)
			for i, params := range tt.config {
				for _, p := range params {
					if err := rs[i].Client(t).ConfigSet(ctx, p[0], p[1]).Err(); err != nil {
						t.Fatalf("node %d: CONFIG SET %s %s: %v", i, p[0], p[1], err)
					}
				}
			}
			for i, rules := range tt.acl {
				// The default user is the backend's and the test's: the
				// rules take its existing connections too.
				args := []any{"ACL", "SETUSER", "default"}
				for _, r := range rules {
					args = append(args, r)
				}
				if err := rs[i].Client(t).Do(ctx, args...).Err(); err != nil {
					t.Fatalf("node %d: ACL SETUSER default %v: %v", i, rules, err)
				}
			}
			err := b.Ready(ctx)
			if tt.acl != nil {
				// What Ready promises: a lock can be granted now, or not.
				_, lerr := b.Lock(ctx, backends.LockRequest{Key: "ready", Token: "tok", TTL: 10 * time.Second})
				if (lerr == nil) != (err == nil) {
					t.Fatalf("Ready = %v but LOCK = %v", err, lerr)
				}
			}
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("Ready = %v; want nil (%d of 3 nodes vote)", err, tt.wantOK)
				}
				return
			}
			var nq *quorum.NoQuorumError
			if !errors.As(err, &nq) || !errors.Is(err, quorum.ErrNoQuorum) {
				t.Fatalf("Ready = %v; want a *quorum.NoQuorumError", err)
			}
			if nq.OK != tt.wantOK || nq.Total != 3 || len(nq.Failures) != len(tt.wantErr) {
				t.Fatalf("Ready = %v (%d/%d, %d failures); want %d/3, %d failures", err, nq.OK, nq.Total, len(nq.Failures), tt.wantOK, len(tt.wantErr))
			}
			// Failures come in the order the nodes answered.
			got := map[string]error{}
			for _, f := range nq.Failures {
				got[f.Node] = f.Err
			}
			for i, want := range tt.wantErr {
				name := b.nodes[i].Name()
				if err, ok := got[name]; !ok || want != nil && !errors.Is(err, want) {
					t.Errorf("Ready's failure for node %d = %v (listed %v); want %v", i, err, ok, want)
				}
			}
			if !strings.Contains(err.Error(), tt.wantText) {
				t.Errorf("Ready = %v; want %q in it", err, tt.wantText)
			}
		})
	}
}

// TestReadyAfterRestarts restarts a majority of real redis-servers empty:
// they answer PING at once, but are quarantined, so Ready must fail for as
// long as the quarantine lasts, not only until the pools reconnect.
func TestReadyAfterRestarts(t *testing.T) {
	b, rs := readyBackend(t, 50*time.Millisecond)
	ctx := ctxTimeout(t, 20*time.Second)
	if err := b.Ready(ctx); err != nil {
		t.Fatalf("Ready before the restarts = %v; want nil", err)
	}
	rs[0].Restart()
	rs[1].Restart()
	for _, n := range b.nodes[:2] {
		waitFor(t, n.Name()+": restart seen", func() bool { return n.health.quarantined() })
	}
	// Several rounds: the first may fail on connections the restarts
	// broke; later ones reach the nodes on new connections.
	for i := 0; i < 20; i++ {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		err := b.Ready(rctx)
		cancel()
		if !errors.Is(err, quorum.ErrNoQuorum) {
			t.Fatalf("Ready %d after two of three nodes restarted = %v; want no quorum (quarantined)", i, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var nq *quorum.NoQuorumError
	if err := b.Ready(ctx); !errors.As(err, &nq) || len(nq.Failures) != 2 {
		t.Fatalf("Ready after the pools reconnected = %v; want two failures", err)
	}
	for _, f := range nq.Failures {
		if !errors.Is(f.Err, errQuarantined) {
			t.Errorf("Ready failure %v; want %v", f, errQuarantined)
		}
	}
}
