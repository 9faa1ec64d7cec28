package quorum_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestHearOutAcrossStop: a failed attempt's roll-back skips a node whose
// refusal comes right after the process was stopped past the limit that
// hearing the nodes out has (the node timeout and the longest node timeout
// after it). The refusal was on its way when the process stopped (in
// backends/redis: read from the socket when it runs again); the limit,
// found passed well after it was due, waits the longest node timeout
// more. Before, the node got the release unheard, which where its refusal
// was its own value's hold (a transparent SET NX) takes that hold.
func TestHearOutAcrossStop(t *testing.T) {
	nodes := makeNodes(t, 3, func(i int, nd *fakeNode) { nd.refuse = true })
	gate := make(chan struct{})
	nodes[2].gate = gate // set after makeNodes: the test closes it
	cfg := defaultConfig()
	cfg.TimeoutMin, cfg.TimeoutMax = 20*time.Millisecond, 100*time.Millisecond
	q := newQuorum(t, cfg, nodes)
	r := req
	r.NoReentry = true
	errc := make(chan error, 1)
	go func() {
		_, err := q.Acquire(context.Background(), r)
		errc <- err
	}()
	// Decided by two refusals at once; the third is heard out, until 100
	// ms past the node timeout's end, which passes during the stop.
	time.Sleep(30 * time.Millisecond)
	harness.StopProcess(t, 400*time.Millisecond)
	time.Sleep(10 * time.Millisecond)
	close(gate)
	if err := <-errc; !errors.Is(err, quorum.ErrNotAcquired) {
		t.Fatalf("Acquire = %v; want ErrNotAcquired", err)
	}
	for _, nd := range nodes {
		if rel := nd.ops("release"); len(rel) > 0 {
			t.Errorf("%s refused, and got %d Release calls; want none", nd.name, len(rel))
		}
	}
}
