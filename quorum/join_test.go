package quorum_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
)

// TestOverlappingSameTokenAttemptsRunInTurn: exclusive attempts of one
// token on one key that may join its hold, made while another is under
// way, reach the nodes only once it has ended. Run side by side they met
// on the nodes in different orders (a fresh grant on one, a join on
// another, before the fresh grant's fence was stored there) and the
// token's one hold was told several fences (test/e2e
// TestConcurrentSameTokenGrantsShareOneFence). Attempts that cannot join
// that hold (another token, NoReentry, a read without TOKEN, another key)
// do not wait, nor does a waiting attempt past its context. (A read
// attempt with the token waits like an exclusive one: see enterJoin.)
func TestOverlappingSameTokenAttemptsRunInTurn(t *testing.T) {
	checkGoroutines(t)
	gate := make(chan struct{})
	nodes := makeNodes(t, 3, func(_ int, nd *fakeNode) {
		nd.fence, nd.holds = 5, 1
	})
	// The gate is closed by the test itself (makeNodes would close it
	// again at cleanup), or at its end if it fails first.
	for _, nd := range nodes {
		nd.gate = gate
	}
	var closeOnce sync.Once
	openGate := func() { closeOnce.Do(func() { close(gate) }) }
	t.Cleanup(openGate)
	cfg := defaultConfig()
	cfg.Clock = newFakeClock()
	q := newQuorum(t, cfg, nodes)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	req := quorum.Request{Key: "k", Token: "t", TTL: 10 * time.Second}
	type result struct {
		l   quorum.Lease
		err error
	}
	run := func(ctx context.Context, r quorum.Request) chan result {
		ch := make(chan result, 1)
		go func() {
			l, err := q.Acquire(ctx, r)
			ch <- result{l, err}
		}()
		return ch
	}
	first := run(ctx, req)
	awaitOps(nodes, "acquire", 1)
	second := run(ctx, req)
	shortCtx, shortCancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer shortCancel()
	gaveUp := run(shortCtx, req)
	others := []chan result{
		run(ctx, quorum.Request{Key: "k", Token: "u", TTL: 10 * time.Second}),
		run(ctx, quorum.Request{Key: "k", Token: "t", TTL: 10 * time.Second, NoReentry: true}),
		run(ctx, quorum.Request{Key: "k2", Token: "t", TTL: 10 * time.Second}),
		run(ctx, quorum.Request{Key: "k", Token: "t", TTL: 10 * time.Second, Mode: quorum.Shared, NoReentry: true}),
	}
	awaitOps(nodes, "acquire", 1+len(others))
	select {
	case r := <-gaveUp:
		if !errors.Is(r.err, context.DeadlineExceeded) {
			t.Errorf("an attempt waiting for its token's attempt past its context: %+v, %v; want %v", r.l, r.err, context.DeadlineExceeded)
		}
	case <-time.After(2 * time.Second):
		t.Errorf("an attempt waiting for its token's attempt did not end with its context")
	}
	for _, nd := range nodes {
		if got := len(nd.ops("acquire")); got != 1+len(others) {
			t.Fatalf("%s: %d acquires while the token's first attempt on the key is under way; want %d "+
				"(the first and the %d that cannot join its hold; not the token's second, nor the one that gave up)",
				nd.name, got, 1+len(others), len(others))
		}
	}
	openGate()
	r1 := <-first
	if r1.err != nil {
		t.Fatalf("first attempt: %v", r1.err)
	}
	r2 := <-second
	if r2.err != nil {
		t.Fatalf("second attempt: %v", r2.err)
	}
	for _, ch := range others {
		if r := <-ch; r.err != nil {
			t.Errorf("attempt that need not wait: %v", r.err)
		}
	}
	// A grant answers once a majority granted: the last node's call may
	// still be starting.
	awaitOps(nodes, "acquire", 2+len(others))
	for _, nd := range nodes {
		acq := nd.ops("acquire")
		if len(acq) != 2+len(others) {
			t.Errorf("%s: %d acquires in all; want %d", nd.name, len(acq), 2+len(others))
			continue
		}
		if last := acq[len(acq)-1]; last.key != "k" || last.token != "t" {
			t.Errorf("%s: last acquire %q/%q; want the token's second attempt k/t", nd.name, last.key, last.token)
		}
	}
}

// TestOverlappingSameTokenReadsRunInTurn: a read attempt with a TOKEN
// waits for another attempt of its token on the key, as an exclusive one
// does: a node keeps one attempt mark per reader token, so two
// overlapping read attempts that both failed where their answers were
// lost would leave one of their read holds behind (see enterJoin).
func TestOverlappingSameTokenReadsRunInTurn(t *testing.T) {
	nodes, openGate := gatedNodes(t, 3)
	q := newQuorum(t, defaultConfig(), nodes)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := quorum.Request{Key: "k", Token: "r", TTL: 10 * time.Second, Mode: quorum.Shared}
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := q.Acquire(ctx, req)
			errs <- err
		}()
		awaitOps(nodes, "acquire", 1)
	}
	time.Sleep(50 * time.Millisecond)
	for _, nd := range nodes {
		if got := len(nd.ops("acquire")); got != 1 {
			t.Errorf("%s: %d read acquires of the token while its first was under way; want 1", nd.name, got)
		}
	}
	openGate()
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("read attempt: %v", err)
		}
	}
}

// TestJoinWaitEndsAtJoinByAndHandsOverInOrder: an attempt queued behind
// its token's attempt under way gives up at its JoinBy (LOCK … WAIT's
// end), or a node timeout from its call when it has none (a LOCK without
// WAIT), with ErrNotAcquired and without reaching a node; and an ending
// attempt hands the key to the attempts waiting behind it one at a time,
// first come first served, instead of waking them all to race for it.
func TestJoinWaitEndsAtJoinByAndHandsOverInOrder(t *testing.T) {
	checkGoroutines(t)
	nodes, openGate := gatedNodes(t, 3)
	cfg := defaultConfig()
	cfg.TimeoutMax = 40 * time.Millisecond
	q := newQuorum(t, cfg, nodes)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	req := func(attempt string, joinBy time.Time) quorum.Request {
		return quorum.Request{Key: "k", Token: "t", TTL: 10 * time.Second, Attempt: attempt, JoinBy: joinBy}
	}
	run := func(r quorum.Request) chan error {
		ch := make(chan error, 1)
		go func() {
			_, err := q.Acquire(ctx, r)
			ch <- err
		}()
		return ch
	}
	first := run(req("first", time.Time{}))
	awaitOps(nodes, "acquire", 1)

	for _, tc := range []struct {
		name   string
		joinBy time.Time
	}{
		{"no JoinBy: the node timeout", time.Time{}},
		{"JoinBy", time.Now().Add(60 * time.Millisecond)},
	} {
		select {
		case err := <-run(req("gives-up", tc.joinBy)):
			if !errors.Is(err, quorum.ErrNotAcquired) {
				t.Errorf("%s: an attempt queued past its bound: %v; want %v", tc.name, err, quorum.ErrNotAcquired)
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("%s: an attempt queued behind its token's attempt did not give up", tc.name)
		}
		if got := quorum.JoinWaiting(q, "k", "t"); got != 0 {
			t.Errorf("%s: %d attempts left waiting after the one that gave up; want 0", tc.name, got)
		}
	}

	later := time.Now().Add(10 * time.Second)
	var waiters []chan error
	for i, name := range []string{"w1", "w2", "w3"} {
		waiters = append(waiters, run(req(name, later)))
		for deadline := time.Now().Add(3 * time.Second); quorum.JoinWaiting(q, "k", "t") < i+1; {
			if time.Now().After(deadline) {
				t.Fatalf("%s did not queue", name)
			}
			time.Sleep(time.Millisecond)
		}
	}
	for _, nd := range nodes {
		if got := len(nd.ops("acquire")); got != 1 {
			t.Fatalf("%s: %d acquires while the first was under way; want 1", nd.name, got)
		}
	}
	openGate()
	if err := <-first; err != nil {
		t.Fatalf("first attempt: %v", err)
	}
	for i, ch := range waiters {
		if err := <-ch; err != nil {
			t.Fatalf("waiter %d: %v", i+1, err)
		}
	}
	awaitOps(nodes, "acquire", 4)
	for _, nd := range nodes {
		var order []string
		for _, c := range nd.ops("acquire") {
			order = append(order, c.attempt)
		}
		if want := []string{"first", "w1", "w2", "w3"}; !slices.Equal(order, want) {
			t.Errorf("%s: attempts reached the node as %v; want %v (first come, first served)", nd.name, order, want)
		}
	}
	if got := quorum.JoinWaiting(q, "k", "t"); got != -1 {
		t.Errorf("the gate still holds the key and token (%d waiting) after every attempt ended", got)
	}
}

// gatedNodes returns n granting nodes whose acquires wait for one gate,
// and the func that opens it (once; the test's cleanup opens it too).
func gatedNodes(t *testing.T, n int) ([]*fakeNode, func()) {
	gate := make(chan struct{})
	nodes := makeNodes(t, n, nil)
	for _, nd := range nodes {
		nd.gate = gate // closed here, not by makeNodes's cleanup
	}
	var closeOnce sync.Once
	openGate := func() { closeOnce.Do(func() { close(gate) }) }
	t.Cleanup(openGate)
	return nodes, openGate
}
