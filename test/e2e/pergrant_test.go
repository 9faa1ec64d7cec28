package e2e

import (
	"bufio"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// What a grant costs the nodes, read from INFO commandstats on every node
// (which counts the commands scripts run, too). lockproxy's own calls to
// a node are the scripts (evalsha, eval on a node that lost its script
// cache) and the release subscriptions (subscribe, unsubscribe); the
// node's background checks (INFO, TIME) are left out.

// nodeCalls are the commands lockproxy sends to a node for lock traffic.
var nodeCalls = []string{"evalsha", "eval", "subscribe", "unsubscribe"}

// grantCost is the difference of two nodeCommandCalls snapshots, per grant.
type grantCost struct {
	grants int
	nodes  int
	delta  map[string]int64
}

func newGrantCost(before, after map[string]int64, grants, nodes int) grantCost {
	d := map[string]int64{}
	for k, v := range after {
		if v-before[k] != 0 {
			d[k] = v - before[k]
		}
	}
	return grantCost{grants: grants, nodes: nodes, delta: d}
}

// callsPerNode is lockproxy's calls per node per grant.
func (g grantCost) callsPerNode() float64 {
	var n int64
	for _, c := range nodeCalls {
		n += g.delta[c]
	}
	return float64(n) / float64(g.grants*g.nodes)
}

// per is one command's count per grant over all nodes.
func (g grantCost) per(cmd string) float64 { return float64(g.delta[cmd]) / float64(g.grants) }

func (g grantCost) String() string {
	var inner []string
	for k, v := range g.delta {
		switch k {
		case "evalsha", "eval", "subscribe", "unsubscribe", "info", "time", "ping", "hello", "client", "config", "hgetall":
			continue
		}
		inner = append(inner, fmt.Sprintf("%s %.2f", k, float64(v)/float64(g.grants)))
	}
	sort.Strings(inner)
	return fmt.Sprintf("%d grants on %d nodes: %.2f node calls per node per grant (evalsha %.2f, eval %.2f, subscribe %.2f, unsubscribe %.2f per grant over all nodes); inside scripts per grant: %s",
		g.grants, g.nodes, g.callsPerNode(), g.per("evalsha"), g.per("eval"), g.per("subscribe"), g.per("unsubscribe"),
		strings.Join(inner, ", "))
}

// TestCommandsPerGrant measures node commands per grant for uncontended
// cycles of each kind and for contended WAIT workloads, logs them (the
// README's figures come from here) and checks loose upper bounds only.
func TestCommandsPerGrant(t *testing.T) {
	t.Parallel()
	const nodes = 3
	cl := startCluster(t, nodes)
	inA := startSemInstance(t, cl)
	inB := startSemInstance(t, cl)
	c := lc.NewClient(t, inA.addr, 2)

	uncontended := []struct {
		name   string
		cycle  func(t *testing.T, key string)
		before func(t *testing.T, key string) // once, before counting
		limit  float64                        // node calls per node per grant
	}{
		{name: "LOCK+UNLOCK", limit: 3, cycle: func(t *testing.T, key string) {
			lc.Unlock(t, c, key, lc.MustLock(t, c, key, "PX", 10000).Token)
		}},
		{name: "LOCK WAIT+UNLOCK", limit: 3, cycle: func(t *testing.T, key string) {
			lc.Unlock(t, c, key, lc.MustLock(t, c, key, "PX", 10000, "WAIT", 5000).Token)
		}},
		{name: "RLOCK+UNLOCK", limit: 3, cycle: func(t *testing.T, key string) {
			lc.Unlock(t, c, key, lc.MustRLock(t, c, key, "PX", 10000).Token)
		}},
		{name: "reentrant LOCK+UNLOCK (second hold)", limit: 3,
			before: func(t *testing.T, key string) { lc.MustLock(t, c, key, "PX", 60000, "TOKEN", "first-hold") },
			cycle: func(t *testing.T, key string) {
				lc.MustLock(t, c, key, "PX", 60000, "TOKEN", "first-hold")
				lc.Unlock(t, c, key, "first-hold")
			}},
	}
	const cycles = 200
	for _, u := range uncontended {
		key := "cost-" + lockclient.RandID()
		if u.before != nil {
			u.before(t, key)
		}
		before := nodeCommandCalls(t, cl)
		for i := 0; i < cycles; i++ {
			u.cycle(t, key)
		}
		cost := newGrantCost(before, nodeCommandCalls(t, cl), cycles, nodes)
		t.Logf("uncontended %s: %v", u.name, cost)
		if cost.callsPerNode() > u.limit {
			t.Errorf("uncontended %s: %.2f node calls per node per grant; want ≤ %.0f", u.name, cost.callsPerNode(), u.limit)
		}
		if s := cost.delta["subscribe"]; s != 0 {
			t.Errorf("uncontended %s: %d subscribe calls; want none (only contended keys are watched)", u.name, s)
		}
	}

	contended := []struct {
		name  string
		split []*instance // waiter i queues on split[i%len(split)]
		limit float64
	}{
		{"50 waiters on one instance", []*instance{inA}, 4},
		// Loose: each instance's head tries on every release, and the
		// roll-backs of split attempts are announced like releases and
		// wake the heads again (TestPerGrantWaiterDoesNotSpinOnRollbacks),
		// which has measured 3.4 to 12.4 here depending on the machine's
		// load. A herd (all 50 waiters trying on every release) would be
		// over 50.
		{"50 waiters over two instances", []*instance{inA, inB}, 40},
	}
	for _, tc := range contended {
		const waiters = 50
		key := "cost-contended-" + lockclient.RandID()
		first := lc.MustLock(t, c, key, "PX", 30000)
		before := nodeCommandCalls(t, cl)
		var (
			grants  atomic.Int64
			holding atomic.Bool
			wg      sync.WaitGroup
			results = make([]error, waiters)
			// undecided counts UNLOCKs answered NOQUORUM (nodes slower
			// than the node timeout on a loaded machine): that lock
			// runs out instead, and the next waiter finds it by its retry.
			undecided atomic.Int64
		)
		deadline := time.Now().Add(60 * time.Second)
		for i := 0; i < waiters; i++ {
			conn, err := net.DialTimeout("tcp", tc.split[i%len(tc.split)].addr, 2*time.Second)
			if err != nil {
				t.Fatalf("dial waiter %d: %v", i, err)
			}
			t.Cleanup(func() { _ = conn.Close() })
			if _, err := conn.Write([]byte(lockclient.Encode("LOCK", key, "PX", "3000", "WAIT", "40000"))); err != nil {
				t.Fatalf("waiter %d: write LOCK: %v", i, err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i] = takeAndRelease(conn, key, deadline, &grants, &holding, &undecided)
			}()
		}
		// Every waiter is queued before the lock is released.
		for _, in := range tc.split {
			want := int64(waiters / len(tc.split))
			ic := lc.NewClient(t, in.addr, 2)
			if err := eventually(400, 25*time.Millisecond, func() error {
				if li := mustLockInfo(t, ic, key, ""); li.Waiters != want {
					return fmt.Errorf("LOCKINFO on %s = %+v; want %d waiters", in.addr, li, want)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		lc.Unlock(t, c, key, first.Token)
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(time.Until(deadline) + 5*time.Second):
			t.Fatalf("%s: %d of %d waiters granted by the deadline", tc.name, grants.Load(), waiters)
		}
		for i, err := range results {
			if err != nil {
				t.Errorf("%s: waiter %d: %v", tc.name, i, err)
			}
		}
		if n := undecided.Load(); n > 0 {
			t.Logf("%s: %d UNLOCKs answered NOQUORUM", tc.name, n)
		}
		// Let the last unsubscriptions reach the nodes.
		time.Sleep(200 * time.Millisecond)
		cost := newGrantCost(before, nodeCommandCalls(t, cl), waiters, nodes)
		t.Logf("contended, %s: %v", tc.name, cost)
		if got := grants.Load(); got != waiters {
			t.Errorf("%s: %d grants; want %d", tc.name, got, waiters)
		}
		if cost.callsPerNode() > tc.limit {
			t.Errorf("%s: %.2f node calls per node per grant; want ≤ %.0f", tc.name, cost.callsPerNode(), tc.limit)
		}
	}
}

// takeAndRelease reads a waiter's LOCK reply on c, checks that no one else
// holds the lock, and UNLOCKs it. An UNLOCK answered NOQUORUM is counted
// in undecided, not an error: the lock then runs out.
func takeAndRelease(c net.Conn, key string, deadline time.Time, grants *atomic.Int64, holding *atomic.Bool, undecided *atomic.Int64) error {
	br := bufio.NewReader(c)
	_ = c.SetDeadline(deadline)
	r, err := lockclient.ReadReply(br)
	if err != nil {
		return fmt.Errorf("reading the LOCK reply: %w", err)
	}
	g, err := lockclient.ParseGrant(toAny(r))
	if err != nil {
		return fmt.Errorf("LOCK reply %v: %w", r, err)
	}
	if !holding.CompareAndSwap(false, true) {
		return fmt.Errorf("granted while another waiter held %q", key)
	}
	grants.Add(1)
	time.Sleep(100 * time.Microsecond)
	holding.Store(false)
	if _, err := c.Write([]byte(lockclient.Encode("UNLOCK", key, g.Token))); err != nil {
		return fmt.Errorf("write UNLOCK: %w", err)
	}
	r, err = lockclient.ReadReply(br)
	switch {
	case err != nil:
		return fmt.Errorf("reading the UNLOCK reply: %w", err)
	case r.Kind == '-' && strings.HasPrefix(r.Str, "NOQUORUM"):
		undecided.Add(1)
	case r.Kind != ':' || r.Int != 1:
		return fmt.Errorf("UNLOCK = %v; want :1", r)
	}
	return nil
}

// TestPerGrantWaiterDoesNotSpinOnRollbacks: a waiter's failed attempts
// must not feed themselves. The holder's grant missed node 0 (a key set
// there by hand while it locked, removed after), which RedLock allows. A
// waiter's attempt is then granted by node 0 and refused by the others,
// and rolled back on node 0. The waiter should try again on a release or
// on its jittered retry timer (20–200 ms), so in 2 s at most about 100
// attempts of 3 acquires and 1 roll-back each.
//
// This fails on the current implementation: the roll-back on node 0 is
// announced on the release channel like a real release, the waiter's own
// instance hears it and wakes the waiter at once, which tries again, is
// rolled back again, and so on: measured 26,304 EVALSHA and 6,576 PUBLISH
// in 2 s for one LOCK … WAIT 2000 (about 3,300 attempts a second, as long
// as the lock is held).
func TestPerGrantWaiterDoesNotSpinOnRollbacks(t *testing.T) {
	t.Parallel()
	const waitMS = 2000
	// At most one attempt per retry_min (20 ms), 3 acquires and 1
	// roll-back each, and as much again for slack.
	const limit = 2 * (waitMS / 20) * 4
	cases := []struct {
		cmd string
		// missNode0 makes the holder's grant miss node 0; without it the
		// holder is on every node (the control: every attempt is refused
		// everywhere, nothing is rolled back).
		missNode0 bool
	}{
		{"LOCK", false},
		{"LOCK", true},
		{"RLOCK", true},
	}
	for _, tc := range cases {
		cmd := tc.cmd
		name := cmd + "/holder on every node"
		if tc.missNode0 {
			name = cmd + "/holder missed node 0"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cl := startCluster(t, 3)
			in := startSemInstance(t, cl)
			c := lc.NewClient(t, in.addr, 2)
			key := "spin-" + lockclient.RandID()
			lockKey := keyPrefix + "lock:" + key
			if !tc.missNode0 {
				h := cl.lockOnAllNodes(t, c, key, "PX", 30000)
				countWaiterCalls(t, cl, c, cmd, key, waitMS, limit)
				lc.Unlock(t, c, key, h.Token)
				return
			}
			if err := cl.clients[0].Set(lockclient.CtxFor(t, 5*time.Second), lockKey, "blocker", 10*time.Second).Err(); err != nil {
				t.Fatalf("node 0: SET blocker: %v", err)
			}
			h := lc.MustLock(t, c, key, "PX", 30000)
			if n := cl.holders(t, key, h.Token); n != 2 {
				t.Fatalf("the holder is on %d nodes; want nodes 1 and 2", n)
			}
			if err := cl.clients[0].Del(lockclient.CtxFor(t, 5*time.Second), lockKey).Err(); err != nil {
				t.Fatalf("node 0: DEL blocker: %v", err)
			}
			countWaiterCalls(t, cl, c, cmd, key, waitMS, limit)
			if got := lc.Unlock(t, c, key, h.Token); got != 1 {
				t.Errorf("UNLOCK by the holder = %d; want 1", got)
			}
		})
	}
}

// countWaiterCalls runs one cmd … WAIT waitMS on key, which must stay
// held, and checks the EVALSHA calls it cost the nodes against limit.
func countWaiterCalls(t *testing.T, cl *cluster, c lockclient.Doer, cmd, key string, waitMS, limit int64) {
	t.Helper()

	before := nodeCommandCalls(t, cl)
	if _, ok, err := lockclient.TryAcquire(lockclient.CtxFor(t, 20*time.Second), c, cmd, key, "PX", 5000, "WAIT", waitMS); err != nil || ok {
		t.Fatalf("%s … WAIT %d while held = %v, %v; want nil", cmd, waitMS, ok, err)
	}
	after := nodeCommandCalls(t, cl)
	evalsha, publish := after["evalsha"]-before["evalsha"], after["publish"]-before["publish"]
	t.Logf("%s … WAIT %d on a held key: %d EVALSHA, %d PUBLISH on the nodes", cmd, waitMS, evalsha, publish)
	if evalsha > limit {
		t.Errorf("%d EVALSHA on the nodes during one %s … WAIT %d; want ≤ %d (attempts paced by releases and the retry timer, not by the waiter's own roll-backs)",
			evalsha, cmd, waitMS, limit)
	}
}
