package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// PROTOCOL.md, WAIT: waiters on one instance are served first-come
// first-served and woken as soon as the lock is released, also by releases
// made through another instance.

// TestWaitWokenAcrossInstances: a waiter on instance B is granted soon
// after an UNLOCK through instance A, not after B's next retry.
func TestWaitWokenAcrossInstances(t *testing.T) {
	t.Parallel()
	eachSize(t, func(t *testing.T, n int) {
		cl := startCluster(t, n)
		a := startInstance(t, cl.addrs())
		b := startInstance(t, cl.addrs())
		ca := lc.NewClient(t, a.addr, 2)
		cb := lc.NewClient(t, b.addr, 2)
		infoB := lc.NewClient(t, b.addr, 2)

		const trials = 9
		var delays []time.Duration
		for i := 0; i < trials; i++ {
			key := fmt.Sprintf("wakex-%d-%s", i, lockclient.RandID())
			g1 := lc.MustLock(t, ca, key, "PX", 10000)
			type result struct {
				g   lockclient.Grant
				ok  bool
				err error
				at  time.Time
			}
			done := make(chan result, 1)
			go func() {
				g, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 15*time.Second), cb, key, "PX", 10000, "WAIT", 5000)
				done <- result{g, ok, err, time.Now()}
			}()
			waitBlocked(t, infoB, 1)
			// The subscription on the nodes follows the first waiter's
			// arrival; give it time to be active, as a real holder would.
			time.Sleep(50 * time.Millisecond)
			// Measured from before the UNLOCK is sent: the grant on B may
			// well arrive before A's reply does.
			unlocked := time.Now()
			if got := lc.Unlock(t, ca, key, g1.Token); got != 1 {
				t.Fatalf("UNLOCK %q through A = %d; want 1", key, got)
			}
			var r result
			select {
			case r = <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("LOCK %q WAIT 5000 on B did not return within 10 s", key)
			}
			if r.err != nil || !r.ok {
				t.Fatalf("LOCK %q WAIT 5000 on B = %+v, %v, %v; want a grant", key, r.g, r.ok, r.err)
			}
			if r.g.Fence <= g1.Fence {
				t.Errorf("fence on B %d; want > %d", r.g.Fence, g1.Fence)
			}
			delays = append(delays, r.at.Sub(unlocked))
			if got := lc.Unlock(t, cb, key, r.g.Token); got != 1 {
				t.Fatalf("UNLOCK %q through B = %d; want 1", key, got)
			}
		}
		t.Logf("grant on B after an UNLOCK through A, per trial: %v", delays)
		sort.Slice(delays, func(i, j int) bool { return delays[i] < delays[j] })
		// Without the release's announcement B would try again only when
		// A's lease ended (or every 20-200 ms where that is unknown): a
		// median this low means it was woken.
		if median := delays[trials/2]; median >= 50*time.Millisecond {
			t.Errorf("median delay %v from an UNLOCK through A to the grant on B; want < 50ms", median)
		} else {
			t.Logf("median %v", median)
		}
	})
}

// TestWaitFIFOThousand: a thousand waiters on one key through one instance
// are each granted exactly once, in the order they arrived, and the nodes
// see a bounded number of commands per grant (only the head tries).
func TestWaitFIFOThousand(t *testing.T) {
	t.Parallel()
	const (
		waiters = 1000
		nodes   = 3
	)
	cl := startCluster(t, nodes)
	in := startInstance(t, cl.addrs())
	ctl := lc.NewClient(t, in.addr, 2)
	key := "fifo-" + lockclient.RandID()

	// Hold the lock while the queue fills.
	first := lc.MustLock(t, ctl, key, "PX", 60000)
	before := nodeCommandCalls(t, cl)

	var (
		grants  atomic.Int64
		holding atomic.Bool
		results = make([]waitOutcome, waiters)
		wg      sync.WaitGroup
	)
	conns := make([]net.Conn, waiters)
	for i := range conns {
		c, err := net.DialTimeout("tcp", in.addr, 2*time.Second)
		if err != nil {
			t.Fatalf("dial waiter %d: %v", i, err)
		}
		t.Cleanup(func() { _ = c.Close() })
		conns[i] = c
	}
	testDeadline := time.Now().Add(90 * time.Second)
	start := time.Now()
	for i, c := range conns {
		// Waiter i is started only once waiter i-1 is queued, so the
		// arrival order is the start order.
		if _, err := c.Write([]byte(lockclient.Encode("LOCK", key, "PX", "10000", "WAIT", "60000"))); err != nil {
			t.Fatalf("waiter %d: write LOCK: %v", i, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = waitAndUnlock(c, key, testDeadline, &grants, &holding)
		}()
		waitBlocked(t, ctl, i+1)
	}
	queued := time.Since(start)
	if got := lc.Unlock(t, ctl, key, first.Token); got != 1 {
		t.Fatalf("UNLOCK %q by the first holder = %d; want 1", key, got)
	}
	released := time.Now()
	allDone := make(chan struct{})
	go func() { wg.Wait(); close(allDone) }()
	select {
	case <-allDone:
	case <-time.After(time.Until(testDeadline) + 5*time.Second):
		for _, c := range conns {
			_ = c.Close()
		}
		<-allDone
		t.Fatalf("the %d waiters did not all finish by the test deadline; %d granted", waiters, grants.Load())
	}
	drained := time.Since(released)
	after := nodeCommandCalls(t, cl)

	inversions := 0
	prevFence := first.Fence
	for i, r := range results {
		if r.err != nil {
			t.Errorf("waiter %d: %v", i, r.err)
			continue
		}
		if r.seq != int64(i+1) {
			inversions++
			if inversions <= 10 {
				t.Errorf("waiter %d (arrived %d.) was granted %d.; want first come, first served", i, i+1, r.seq)
			}
		}
		if r.fence <= prevFence {
			t.Errorf("waiter %d: fence %d; want > %d (the fence of the grant before)", i, r.fence, prevFence)
		}
		prevFence = r.fence
	}
	if got := grants.Load(); got != waiters {
		t.Errorf("%d grants; want %d, one per waiter", got, waiters)
	}
	if inversions > 0 {
		t.Errorf("%d of %d waiters granted out of arrival order", inversions, waiters)
	}

	total := int64(0)
	var parts []string
	for _, name := range countedCommands {
		d := after[name] - before[name]
		total += d
		if d != 0 {
			parts = append(parts, fmt.Sprintf("%s %d", name, d))
		}
	}
	perGrant := float64(total) / waiters
	t.Logf("%d waiters queued in %v, granted in turn in %v; node commands: %s; %.2f per grant on %d nodes (%.2f×N)",
		waiters, queued.Round(time.Millisecond), drained.Round(time.Millisecond), strings.Join(parts, ", "),
		perGrant, nodes, perGrant/nodes)
	// A grant's release is a script on each node (which PUBLISHes), N;
	// its acquire on a free key is plain SET NX PX + HINCRBY, not counted.
	// Each attempt that fails adds the acquire script where the key is
	// held, up to N, and its roll-back only where a node granted. A herd
	// would add one per waiter per release. The limit leaves room for
	// about one failed attempt per grant (a late announcement, a retry
	// timer on a busy machine).
	if limit := 2.5 * nodes; perGrant > limit {
		t.Errorf("%.2f node commands per grant; want ≤ %.1f (2.5×N): waiters other than the head are trying", perGrant, limit)
	}
}

// TestWaitDisconnectLeavesQueue: a waiter whose client goes away leaves
// the queue; the one behind it gets the lock, the gone one never does.
func TestWaitDisconnectLeavesQueue(t *testing.T) {
	t.Parallel()
	eachSize(t, func(t *testing.T, n int) {
		cl := startCluster(t, n)
		in := startInstance(t, cl.addrs())
		ctl := lc.NewClient(t, in.addr, 2)
		key := "gone-" + lockclient.RandID()
		holder := lc.MustLock(t, ctl, key, "PX", 30000)

		gone := lc.DialRaw(t, in.addr)
		gone.Write(lockclient.Encode("LOCK", key, "PX", "30000", "WAIT", "20000", "TOKEN", "gone-"+lockclient.RandID()))
		waitBlocked(t, ctl, 1)
		next := lc.DialRaw(t, in.addr)
		nextToken := "next-" + lockclient.RandID()
		next.Write(lockclient.Encode("LOCK", key, "PX", "30000", "WAIT", "20000", "TOKEN", nextToken))
		waitBlocked(t, ctl, 2)

		_ = gone.Conn.Close()
		waitBlocked(t, ctl, 1)

		if got := lc.Unlock(t, ctl, key, holder.Token); got != 1 {
			t.Fatalf("UNLOCK %q = %d; want 1", key, got)
		}
		r, err := next.Read()
		if err != nil {
			t.Fatalf("LOCK %q WAIT 20000 of the waiter behind: %v", key, err)
		}
		g, err := lockclient.ParseGrant(toAny(r))
		if err != nil {
			t.Fatalf("LOCK %q WAIT 20000 of the waiter behind = %v; want a grant (%v)", key, r, err)
		}
		if g.Token != nextToken {
			t.Fatalf("grant token %q; want %q", g.Token, nextToken)
		}
		if got := next.Do("UNLOCK", key, nextToken); got.Kind != ':' || got.Int != 1 {
			t.Fatalf("UNLOCK %q = %v; want :1", key, got)
		}
		// The waiter that went away must not take the free lock: give a
		// retry (the release's announcement, or 20-200 ms) several
		// chances, then check every node.
		time.Sleep(500 * time.Millisecond)
		for i := range cl.nodes {
			if v, ok := cl.lockValue(t, i, key); ok {
				t.Errorf("node %d holds %q for %q after every holder released it; want it free", i, key, v)
			}
		}
		waitBlocked(t, ctl, 0)
	})
}

// TestWaitExpiryAfterHandover: an expiry is announced by no one. The
// waiter that became the head when the one before it was granted must
// still find the lock free once that grant expires, by its retry timer.
func TestWaitExpiryAfterHandover(t *testing.T) {
	t.Parallel()
	eachSize(t, func(t *testing.T, n int) {
		cl := startCluster(t, n)
		in := startInstance(t, cl.addrs())
		ctl := lc.NewClient(t, in.addr, 2)
		key := "expire-" + lockclient.RandID()
		holder := lc.MustLock(t, ctl, key, "PX", 30000)

		// The first waiter takes a short lease and never releases it.
		first := lc.DialRaw(t, in.addr)
		first.Write(lockclient.Encode("LOCK", key, "PX", "300", "WAIT", "10000"))
		waitBlocked(t, ctl, 1)
		second := lc.DialRaw(t, in.addr)
		second.Write(lockclient.Encode("LOCK", key, "PX", "10000", "WAIT", "10000"))
		waitBlocked(t, ctl, 2)

		if got := lc.Unlock(t, ctl, key, holder.Token); got != 1 {
			t.Fatalf("UNLOCK %q = %d; want 1", key, got)
		}
		r, err := first.Read()
		if err != nil {
			t.Fatalf("LOCK %q PX 300 WAIT 10000: %v", key, err)
		}
		g1, err := lockclient.ParseGrant(toAny(r))
		if err != nil {
			t.Fatalf("LOCK %q PX 300 WAIT 10000 = %v; want a grant (%v)", key, r, err)
		}
		granted := time.Now()
		r, err = second.Read()
		if err != nil {
			t.Fatalf("LOCK %q WAIT 10000 behind an expiring grant: %v", key, err)
		}
		g2, err := lockclient.ParseGrant(toAny(r))
		if err != nil {
			t.Fatalf("LOCK %q WAIT 10000 behind an expiring grant = %v; want a grant (%v)", key, r, err)
		}
		// The lease runs 300 ms; the head tries again when it ends (the
		// refusal tells it how long is left), or every 20-200 ms where
		// that is unknown.
		waited := time.Since(granted)
		t.Logf("granted %v after the expiring grant", waited)
		if waited > 3*time.Second {
			t.Errorf("granted %v after a 300 ms grant before it; want within 3 s", waited)
		}
		if g2.Fence <= g1.Fence {
			t.Errorf("fence %d after the expired grant's %d; want greater", g2.Fence, g1.Fence)
		}
	})
}

// TestWaitWithoutChannelPermission: a node user whose ACL grants no pub/sub
// channel (Redis 7's default for new users) can still release, and waiters
// then find the release by their retry instead of an announcement.
func TestWaitWithoutChannelPermission(t *testing.T) {
	t.Parallel()
	nodes := harness.StartRedisN(t, 3, harness.RedisOptions{
		Args: []string{"--user", "lp", "on", ">lp-secret", "~*", "+@all", "resetchannels"},
	})
	cfg := filepath.Join(t.TempDir(), "lockproxy.yaml")
	if err := os.WriteFile(cfg, []byte("redlock:\n  username: lp\n  password: lp-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	in := startInstance(t, harness.Addrs(nodes), cfg)
	ctl := lc.NewClient(t, in.addr, 2)
	waiter := lc.NewClient(t, in.addr, 2)
	key := "noperm-" + lockclient.RandID()
	holder := lc.MustLock(t, ctl, key, "PX", 30000)

	type result struct {
		g   lockclient.Grant
		ok  bool
		err error
	}
	done := make(chan result, 1)
	go func() {
		g, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 15*time.Second), waiter, key, "PX", 10000, "WAIT", 5000)
		done <- result{g, ok, err}
	}()
	waitBlocked(t, ctl, 1)
	if got := lc.Unlock(t, ctl, key, holder.Token); got != 1 {
		t.Fatalf("UNLOCK %q with PUBLISH denied = %d; want 1", key, got)
	}
	unlocked := time.Now()
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("LOCK %q WAIT 5000 did not return within 10 s", key)
	}
	if r.err != nil || !r.ok {
		t.Fatalf("LOCK %q WAIT 5000 = %+v, %v, %v; want a grant", key, r.g, r.ok, r.err)
	}
	t.Logf("granted %v after the unannounced release", time.Since(unlocked))
	if got := lc.Unlock(t, waiter, key, r.g.Token); got != 1 {
		t.Errorf("UNLOCK %q = %d; want 1", key, got)
	}
}

// TestWaitUncontendedNoSubscription: a LOCK … WAIT that is granted at once
// costs the nodes what a LOCK does; only contention subscribes a key's
// release announcements.
func TestWaitUncontendedNoSubscription(t *testing.T) {
	t.Parallel()
	const (
		nodes  = 3
		rounds = 50
	)
	cl := startCluster(t, nodes)
	in := startInstance(t, cl.addrs())
	c := lc.NewClient(t, in.addr, 2)
	// The first release loads the script with EVAL: do that first.
	warm := "warm-" + lockclient.RandID()
	if got := lc.Unlock(t, c, warm, lc.MustLock(t, c, warm, "PX", 10000).Token); got != 1 {
		t.Fatalf("UNLOCK %q = %d; want 1", warm, got)
	}
	before := nodeCommandCalls(t, cl)
	for i := 0; i < rounds; i++ {
		key := fmt.Sprintf("alone-%d-%s", i, lockclient.RandID())
		g := lc.MustLock(t, c, key, "PX", 10000, "WAIT", 5000)
		if got := lc.Unlock(t, c, key, g.Token); got != 1 {
			t.Fatalf("UNLOCK %q = %d; want 1", key, got)
		}
	}
	after := nodeCommandCalls(t, cl)
	for _, name := range []string{"subscribe", "unsubscribe"} {
		if d := after[name] - before[name]; d != 0 {
			t.Errorf("%d %s calls on the nodes for %d uncontended LOCK … WAIT; want 0", d, name, rounds)
		}
	}
	total := int64(0)
	for _, name := range countedCommands {
		total += after[name] - before[name]
	}
	t.Logf("uncontended LOCK … WAIT + UNLOCK: %.2f node commands per grant on %d nodes", float64(total)/rounds, nodes)
}

// waitOutcome is what one of many waiters saw.
type waitOutcome struct {
	seq   int64 // grant order, from 1
	fence int64
	err   error
}

// waitAndUnlock reads a waiter's LOCK reply on c, checks that no one else
// holds the lock, and UNLOCKs it.
func waitAndUnlock(c net.Conn, key string, deadline time.Time, grants *atomic.Int64, holding *atomic.Bool) (o waitOutcome) {
	br := bufio.NewReader(c)
	_ = c.SetDeadline(deadline)
	r, err := lockclient.ReadReply(br)
	if err != nil {
		o.err = fmt.Errorf("reading the LOCK reply: %w", err)
		return o
	}
	g, err := lockclient.ParseGrant(toAny(r))
	if err != nil {
		o.err = fmt.Errorf("LOCK reply %v: %w", r, err)
		return o
	}
	if !holding.CompareAndSwap(false, true) {
		o.err = fmt.Errorf("granted while another waiter held %q", key)
	}
	o.seq, o.fence = grants.Add(1), g.Fence
	// Hold it briefly.
	time.Sleep(100 * time.Microsecond)
	holding.Store(false)
	if _, err := c.Write([]byte(lockclient.Encode("UNLOCK", key, g.Token))); err != nil {
		o.err = fmt.Errorf("write UNLOCK: %w", err)
		return o
	}
	if r, err = lockclient.ReadReply(br); err != nil || r.Kind != ':' || r.Int != 1 {
		o.err = fmt.Errorf("UNLOCK = %v, %v; want :1", r, err)
	}
	return o
}

// toAny turns a raw reply into what go-redis would return, for parseGrant.
func toAny(r lockclient.Reply) any {
	switch {
	case r.Null:
		return nil
	case r.Kind == ':':
		return r.Int
	case r.Kind == '*':
		out := make([]any, len(r.Elems))
		for i, e := range r.Elems {
			out[i] = toAny(e)
		}
		return out
	case r.Kind == '%':
		m := map[any]any{}
		for i := 0; i+1 < len(r.Elems); i += 2 {
			m[toAny(r.Elems[i])] = toAny(r.Elems[i+1])
		}
		return m
	default:
		return r.Str
	}
}

// waitBlocked polls INFO until lockproxy reports want blocked clients
// (LOCK … WAIT calls queued), for at most 5 s.
func waitBlocked(t *testing.T, c *redis.Client, want int) {
	t.Helper()
	got := -1
	for i := 0; i < 5000; i++ {
		got = blockedClients(t, c)
		if got == want {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("INFO blocked_clients = %d after 5 s; want %d", got, want)
}

func blockedClients(t *testing.T, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(lockclient.CtxFor(t, 5*time.Second), "clients").Result()
	if err != nil {
		t.Fatalf("INFO clients: %v", err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "blocked_clients:"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("INFO blocked_clients %q: %v", v, err)
			}
			return n
		}
	}
	t.Fatalf("INFO clients has no blocked_clients:\n%s", info)
	return 0
}

// countedCommands are the node commands that lock traffic consists of.
// countedCommands are the script calls lockproxy sends the nodes and the
// waiters' subscriptions. (INFO commandstats also counts the commands
// scripts run, such as the release announcement's PUBLISH, together with
// the plain SET and HINCRBY of an acquire, so those are left out.)
var countedCommands = []string{"evalsha", "eval", "subscribe", "unsubscribe"}

// nodeCommandCalls sums, over the nodes, the calls of countedCommands in
// INFO commandstats (commands run by scripts included).
func nodeCommandCalls(t *testing.T, cl *cluster) map[string]int64 {
	t.Helper()
	sum := map[string]int64{}
	for i, c := range cl.clients {
		stats, err := c.Info(context.Background(), "commandstats").Result()
		if err != nil {
			t.Fatalf("node %d: INFO commandstats: %v", i, err)
		}
		for _, line := range strings.Split(stats, "\r\n") {
			name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":calls=")
			if !ok {
				continue
			}
			calls, _, _ := strings.Cut(rest, ",")
			n, err := strconv.ParseInt(calls, 10, 64)
			if err != nil {
				t.Fatalf("node %d: commandstats line %q: %v", i, line, err)
			}
			sum[name] += n
		}
	}
	return sum
}
