package redis

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/test/harness"
)

// startKind starts on n the operation kind names on key for token t (a
// lease of a minute), with ctx, and returns a channel with whether it
// succeeded and its error.
func startKind(n *Node, ctx context.Context, kind, key string) <-chan error {
	res := make(chan error, 1)
	answer := func(ok bool, err error) {
		if err == nil && !ok {
			err = errNotDone
		}
		res <- err
	}
	switch kind {
	case "release":
		n.StartRelease(ctx, key, "t", quorum.AnyHold, answer)
	case "renewal":
		n.StartExtend(ctx, key, "t", time.Minute, answer)
	case "acquire":
		n.StartAcquire(ctx, quorum.Request{Key: key, Token: "t", TTL: time.Minute, NoReentry: true},
			func(g quorum.NodeGrant, err error) { answer(g.Acquired, err) })
	}
	return res
}

type notDone struct{}

func (notDone) Error() string { return "answered, but not done" }

var errNotDone error = notDone{}

// TestOpsHandedOverPastQuorumDeadlineAcrossStop: an operation whose node
// context the quorum made right before the process stopped, and that was
// handed to the node only after the stop, past its deadline, is sent and
// answered as the node answers it: the deadline passed in lockproxy
// itself, between the quorum's setting it and the handing over (a stop
// inside the quorum's loop over the nodes). Before, the writer took it
// for its caller's lateness and gave it up unsent (an UNLOCK or RENEW
// across a stop of lockproxy answered NOQUORUM … timeout). An acquire so
// handed over is sent while the quorum still listens for its answer (its
// deadline and as much again, less answerSpare). A deadline the caller
// brought that had passed is still the caller's
// (TestRenewalPastItsCallersDeadlineGivenUp).
func TestOpsHandedOverPastQuorumDeadlineAcrossStop(t *testing.T) {
	harness.RequireBinary(t, "redis-server", "redis-server")
	const timeout = 200 * time.Millisecond
	n := realNode(t, timeout)
	ctx := ctxTimeout(t, 20*time.Second)
	for _, k := range []string{"release", "renewal"} {
		mustHold(ctx, t, n, k)
	}
	for _, tc := range []struct {
		kind string
		stop time.Duration
	}{
		{"release", 2 * timeout},
		{"renewal", 2 * timeout},
		// Within the time the quorum listens: its deadline and a node
		// timeout more.
		{"acquire", timeout + timeout/4},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			nodeCtx := quorum.NodeContext(context.Background(), timeout)
			harness.StopProcess(t, tc.stop)
			d, _ := nodeCtx.Deadline()
			if time.Now().Before(d) {
				t.Skipf("the stop of %v ended before the deadline it was to pass", tc.stop)
			}
			if tc.kind == "acquire" && time.Now().After(d.Add(timeout-answerSpare(timeout)-2*stoppedLate)) {
				t.Skipf("the stop of %v overran the time the quorum listens (a loaded host)", tc.stop)
			}
			if err := <-startKind(n, nodeCtx, tc.kind, tc.kind); err != nil {
				t.Fatalf("%s handed over after a stop that passed the deadline the quorum set before it: %v; want it done", tc.kind, err)
			}
		})
	}
}

// TestQueuedBehindBatchAwaitedAcrossStop: an operation queued behind a
// batch whose answers the writer awaited when the process stopped, its
// deadline passing during the stop but before the batch's own, is sent
// and answered once the process runs again: the batch's answers came
// during the stop (read past its deadline), so the writer waited on
// lockproxy, not on the node, from the batch's write on. Before, only the
// span from the batch's deadline counted as lockproxy's, and the
// operation was given up (the residual UNLOCK or RENEW of
// TestUnlockAcrossProxyStop answered NOQUORUM … timeout).
func TestQueuedBehindBatchAwaitedAcrossStop(t *testing.T) {
	harness.RequireBinary(t, "redis-server", "redis-server")
	r := harness.StartRedis(t, harness.RedisOptions{})
	const timeout = 100 * time.Millisecond
	// One operation a batch: the second waits in the queue.
	n := NewNode(NodeConfig{Addr: r.Addr, KeyPrefix: "lp:", Timeout: timeout, MaxBatch: 1})
	t.Cleanup(func() { n.Close() })
	ctx := ctxTimeout(t, 20*time.Second)
	for _, k := range []string{"a", "b"} {
		mustHold(ctx, t, n, k)
	}
	for _, kind := range []string{"renewal", "release"} {
		t.Run(kind, func(t *testing.T) {
			// The node answers the first batch 60 ms after it was
			// written: during the stop, before its deadline.
			if err := r.Client(t).Do(ctx, "CLIENT", "PAUSE", 60, "ALL").Err(); err != nil {
				t.Fatalf("CLIENT PAUSE: %v", err)
			}
			first := startKind(n, quorum.NodeContext(context.Background(), 4*timeout), "renewal", "a")
			time.Sleep(10 * time.Millisecond) // written, its answer awaited
			// A deadline before the first batch's (a node timeout after
			// its write): half a node timeout from now.
			second := startKind(n, quorum.NodeContext(context.Background(), timeout/2), kind, "b")
			harness.StopProcess(t, 4*timeout)
			if err := <-first; err != nil {
				t.Fatalf("the batch awaited across the stop: %v; want it done", err)
			}
			if err := <-second; err != nil {
				t.Fatalf("%s queued behind a batch awaited across a stop: %v; want it done", kind, err)
			}
		})
	}
}

// TestExecCountsStopBeforeItLooks: a stop of the process after the
// writer took a batch, before it looked at the batch's deadlines (while
// it answered the batch before, or took this one), passed them for
// lockproxy: a renewal whose deadline passed then is sent. Before, the
// span the writer waited on no node ended when it took the batch.
func TestExecCountsStopBeforeItLooks(t *testing.T) {
	n, _ := nodeOnRedis(t)
	ctx := ctxTimeout(t, 10*time.Second)
	mustHold(ctx, t, n, "k")
	c, err := n.connect(ctx)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	now := time.Now()
	// Free since 300 ms ago, when it took the batch: then stopped.
	w := &writer{conn: c, waited: now.Add(-300 * time.Millisecond)}
	defer w.drop()
	res := make(chan opResult, 1)
	o := n.newOp(opExtend, "k", "t")
	o.ms = time.Minute.Milliseconds()
	o.start, o.deadline = now.Add(-350*time.Millisecond), now.Add(-100*time.Millisecond)
	o.done = func(r opResult) { res <- r }
	n.exec(w, []*op{o})
	if r := <-res; r.err != nil || r.n != extendedWrite {
		t.Fatalf("renewal whose deadline passed after the writer took it = %+v; want it renewed", r)
	}
}

// TestAcquiresQueuedAcrossStop: acquires handed to the node's writers
// right before the process stops for longer than their deadline are sent
// once it runs again, while the quorum still listens for their answers
// (their deadline and as much again, less answerSpare, see quorum's
// hearOut), and granted:
// before, a LOCK queued when lockproxy was stopped was answered NOQUORUM
// for a pause the nodes did not cause. Past that, they are still given up
// unsent: a refusal the quorum no longer hears would be rolled back.
func TestAcquiresQueuedAcrossStop(t *testing.T) {
	harness.RequireBinary(t, "redis-server", "redis-server")
	r := harness.StartRedis(t, harness.RedisOptions{})
	const timeout = 200 * time.Millisecond
	n := NewNode(NodeConfig{Addr: r.Addr, KeyPrefix: "lp:", Timeout: timeout, MaxBatch: 4})
	t.Cleanup(func() { n.Close() })
	ctx := ctxTimeout(t, 20*time.Second)
	mustHold(ctx, t, n, "warm")
	const keys = 16
	for _, tc := range []struct {
		name string
		stop time.Duration
		sent bool
	}{
		{"heard", timeout + timeout/4, true},
		{"no longer heard", 3 * timeout, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The first batch is answered 60 ms after it was written:
			// the others wait in the queue until the stop.
			if err := r.Client(t).Do(ctx, "CLIENT", "PAUSE", 60, "ALL").Err(); err != nil {
				t.Fatalf("CLIENT PAUSE: %v", err)
			}
			nodeCtx := quorum.NodeContext(context.Background(), timeout)
			var answers []<-chan error
			for k := 0; k < keys; k++ {
				answers = append(answers, startKind(n, nodeCtx, "acquire", tc.name+fmt.Sprint(k)))
			}
			harness.StopProcess(t, tc.stop)
			if d, _ := nodeCtx.Deadline(); tc.sent && time.Now().After(d.Add(timeout-answerSpare(timeout)-2*stoppedLate)) {
				t.Skipf("the stop of %v overran the time the quorum listens (a loaded host)", tc.stop)
			}
			unsent := 0
			for k, a := range answers {
				// Those the writer sent before the stop are granted
				// either way (their answers read after it).
				err := <-a
				switch {
				case quorum.Unsent(err) && !tc.sent:
					unsent++
				case err != nil:
					t.Errorf("acquire %d queued across a stop of %v: %v; want it granted", k, tc.stop, err)
				}
			}
			if !tc.sent && unsent == 0 {
				t.Errorf("no acquire queued across a stop of %v, past the time the quorum listens, was given up unsent; want those not sent before it", tc.stop)
			}
		})
	}
}

// TestStopBetweenDeadlineAndWriteOfAcquireBatch: a stop of the process
// after a batch with an acquire set its deadline and before it was
// written passes that deadline: the batch is written late, and its
// answers are read for as long as the deadline gave them from the write,
// but no longer than the quorum surely listens for the acquire (its
// deadline and as much again, less answerSpare). Before, a batch with an
// acquire was read only until its deadline, already passed: the first
// read looked before the node could answer, and the whole batch failed, the release in it too (an UNLOCK
// answered NOQUORUM in test/fault's sigstop-lockproxy-short-repeated).
func TestStopBetweenDeadlineAndWriteOfAcquireBatch(t *testing.T) {
	harness.RequireBinary(t, "redis-server", "redis-server")
	// Long enough for a loaded host's node to answer in the time left.
	const timeout = 600 * time.Millisecond
	n := realNode(t, timeout)
	ctx := ctxTimeout(t, 20*time.Second)
	mustHold(ctx, t, n, "held")
	stops := make(chan struct{}, 1)
	stops <- struct{}{}
	var resumed time.Time
	n.beforeWrite = func() {
		select {
		case <-stops:
			// Past the batch's deadline (a node timeout), within the
			// time the quorum listens for its acquire (two).
			harness.StopProcess(t, timeout+timeout/4)
			resumed = time.Now()
		default:
		}
	}
	nodeCtx := quorum.NodeContext(context.Background(), timeout)
	d, _ := nodeCtx.Deadline()
	release := startKind(n, nodeCtx, "release", "held")
	acquire := startKind(n, nodeCtx, "acquire", "fresh")
	errA, errR := <-acquire, <-release
	if heard := d.Add(timeout - answerSpare(timeout)); heard.Sub(resumed) < 2*stoppedLate {
		t.Skipf("the stop overran the time the quorum listens (resumed %v before its end; a loaded host)", heard.Sub(resumed))
	}
	if errA != nil || errR != nil {
		t.Fatalf("batch written after a stop that passed its deadline (resumed %v after it): acquire %v, release %v; want both done", resumed.Sub(d), errA, errR)
	}
}

// TestLateAcquireAnsweredBeforeQuorumLimit: an acquire sent past its
// deadline after a stop of the process is answered with time to spare
// before the quorum stops listening for it (its deadline and the longest
// node timeout after it, quorum's hearOut), not up to that very limit.
// An answer read at the limit reaches the quorum as its timer fires, and
// one the quorum did not hear gets a plain roll-back: a refusal because
// the token already held the key (a transparent SET NX with the same
// value) loses that hold on the node. Before, the batch was read until
// the deadline and a whole node timeout more, which for a TTL of 5 s or
// more (node timeout at TimeoutMax) is the quorum's limit itself; now
// answerSpare less.
func TestLateAcquireAnsweredBeforeQuorumLimit(t *testing.T) {
	n, r := nodeOnRedis(t)
	ctx := ctxTimeout(t, 10*time.Second)
	mustHold(ctx, t, n, "warm")
	c, err := n.connect(ctx)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	// The node answers 490 ms from now, 540 ms after the acquire's
	// deadline: within its node timeout (550 ms) after it, but not
	// answerSpare before that ends.
	if err := r.Client(t).Do(ctx, "CLIENT", "PAUSE", 490, "ALL").Err(); err != nil {
		t.Fatalf("CLIENT PAUSE: %v", err)
	}
	now := time.Now()
	// Free since 600 ms ago, when it took the batch: then stopped.
	w := &writer{conn: c, waited: now.Add(-600 * time.Millisecond)}
	defer w.drop()
	res := make(chan opResult, 1)
	o := n.newOp(opAcquire, "k", "t")
	o.ms = time.Minute.Milliseconds()
	o.noReentry = true
	start, deadline := now.Add(-600*time.Millisecond), now.Add(-50*time.Millisecond)
	o.start, o.deadline = start, deadline
	o.done = func(r opResult) { res <- r }
	n.exec(w, []*op{o})
	got := <-res
	answered := time.Since(deadline)
	// The quorum's limit, with its node timeout at TimeoutMax: one
	// that fires on time would not hear an answer given later.
	limit := deadline.Sub(start)
	if got.err == nil && answered > limit-2*stoppedLate {
		t.Fatalf("acquire sent past its deadline answered %v after it (%+v), within %v of when the quorum stops listening (%v after it); want it answered earlier, or failed", answered, got, 2*stoppedLate, limit)
	}
}

// TestOpHandedOverPastQuorumDeadlineAfterWriterRan: a renewal handed to
// the node after the deadline the quorum set for it passed (lockproxy
// itself did not run in between: a stop inside the quorum's loop over the
// nodes) is sent, even where the node's writer ran a batch between that
// deadline and the handing over. Its deadline passed before it reached
// the node: the node cannot have kept it waiting, whatever its writer did
// meanwhile. Before, the writer sent it only if its own record of the
// spans it waited on no node covered the deadline, and a batch answered
// after the stop (or answers still read from the socket's buffer when
// the process stopped) left it out: the renewal was given up unsent (a
// flake of TestOpsHandedOverPastQuorumDeadlineAcrossStop).
func TestOpHandedOverPastQuorumDeadlineAfterWriterRan(t *testing.T) {
	harness.RequireBinary(t, "redis-server", "redis-server")
	const timeout = 50 * time.Millisecond
	n := realNode(t, timeout)
	ctx := ctxTimeout(t, 10*time.Second)
	mustHold(ctx, t, n, "k")
	// The quorum sets the deadline, then lockproxy does not run past it
	// (a sleep here: the node tells it from a stop by nothing it sees).
	nodeCtx := quorum.NodeContext(context.Background(), timeout)
	time.Sleep(2 * timeout)
	// The key's writer runs a batch meanwhile (another caller's).
	if ok, err := n.Extend(ctx, "k", "t", time.Minute); err != nil || !ok {
		t.Fatalf("Extend = %v, %v", ok, err)
	}
	if err := <-startKind(n, nodeCtx, "renewal", "k"); err != nil {
		t.Fatalf("renewal handed over past the deadline the quorum set, after the writer ran a batch: %v; want it done", err)
	}
}

// realNode is a Node with node timeout timeout over a redis-server of its
// own, closed at the end of the test.
func realNode(t *testing.T, timeout time.Duration) *Node {
	t.Helper()
	r := harness.StartRedis(t, harness.RedisOptions{})
	n := NewNode(NodeConfig{Addr: r.Addr, KeyPrefix: "lp:", Timeout: timeout})
	t.Cleanup(func() { n.Close() })
	return n
}

// mustHold acquires key for token "t" on n for a minute, or fails the
// test: the node's connection is made and the key held.
func mustHold(ctx context.Context, t *testing.T, n *Node, key string) {
	t.Helper()
	if g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: "t", TTL: time.Minute, NoReentry: true}); err != nil || !g.Acquired {
		t.Fatalf("Acquire %s = %+v, %v", key, g, err)
	}
}
