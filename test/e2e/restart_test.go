package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// Restart without persistence (REFERENCE.md section 3, row 4). A holds a
// lock on exactly three of five nodes; one of them is killed and restarted
// empty; B then asks through another lockproxy instance. Without the
// quarantine the restarted node grants B's request along with the two
// nodes A never held, and B holds the lock while A's validity lasts. With
// it, the restarted node counts neither for nor against, B is refused, and
// after max TTL + drift the node is re-seeded and votes again.
//
// To make A hold exactly three nodes, the other two hold the key for a
// blocker (set directly on them) during A's LOCK, and lose it right after.
// Three nodes are restarted in turn, each after the previous quarantine.

const (
	restartNodes  = 5
	restartRounds = 3
	restartTTLMS  = 3000 // also locks.max_ttl: the quarantine is 3 s + drift
)

// restartEnv configures both lockproxy instances of the test.
func restartEnv(quarantine bool) []string {
	return []string{
		"LOCKPROXY_LOCKS_MAX_TTL=" + strconv.Itoa(restartTTLMS) + "ms",
		"LOCKPROXY_LOCKS_DEFAULT_TTL=" + strconv.Itoa(restartTTLMS) + "ms",
		"LOCKPROXY_REDLOCK_QUARANTINE=" + strconv.FormatBool(quarantine),
	}
}

// restartOutcome is what one run of the scenario measured.
type restartOutcome struct {
	rounds     int
	overlaps   int // rounds in which B was granted while A's validity lasted
	bGrants    int // grants to B while A's validity lasted, all rounds
	bAttempts  int // LOCKs B sent while A's validity lasted, all rounds
	fenceNotUp int // grants whose fence was not above every earlier one
}

func TestRestartQuarantine(t *testing.T) {
	t.Parallel()
	for _, quarantine := range []bool{true, false} {
		name := "on"
		if !quarantine {
			name = "off"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			out := runRestartScenario(t, quarantine)
			t.Logf("quarantine %s: %d rounds, %d with B granted while A held the lock (%d grants in %d attempts); %d grants with a fence not above every earlier one",
				name, out.rounds, out.overlaps, out.bGrants, out.bAttempts, out.fenceNotUp)
			if quarantine {
				if out.overlaps != 0 || out.fenceNotUp != 0 {
					t.Errorf("with the quarantine: %d overlapping rounds, %d fences not increasing; want 0 and 0", out.overlaps, out.fenceNotUp)
				}
			} else if out.overlaps == 0 {
				t.Errorf("without the quarantine (negative control): B was never granted while A held the lock in %d rounds; the scenario has no teeth", out.rounds)
			}
		})
	}
}

func runRestartScenario(t *testing.T, quarantine bool) restartOutcome {
	cl := startCluster(t, restartNodes)
	env := restartEnv(quarantine)
	in1 := startInstanceEnv(t, cl.addrs(), env)
	in2 := startInstanceEnv(t, cl.addrs(), env)
	c1 := lc.NewClient(t, in1.addr, 2)
	c2 := lc.NewClient(t, in2.addr, 2)
	key := "restart-" + lockclient.RandID()
	lockKey := keyPrefix + "lock:" + key
	var out restartOutcome

	var lastFence int64
	fence := func(who string, g lockclient.Grant) {
		t.Helper()
		if g.Fence <= lastFence {
			out.fenceNotUp++
			t.Logf("%s: fence %d not above the earlier %d", who, g.Fence, lastFence)
		}
		if g.Fence > lastFence {
			lastFence = g.Fence
		}
	}

	// Both instances learn every node's run_id before any restart.
	for _, in := range []*instance{in1, in2} {
		waitNodeStates(t, in, func(i int, st nodeState) bool { return st.state == "ok" }, "every node ok at start")
	}
	// A few grants on all nodes, so every fence counter has a history.
	for i := 0; i < 3; i++ {
		g := cl.lockOnAllNodes(t, c1, key, "PX", restartTTLMS)
		fence("warm-up", g)
		if got := lc.Unlock(t, c1, key, g.Token); got != 1 {
			t.Fatalf("UNLOCK %q = %d; want 1", key, got)
		}
		waitKeyGone(t, cl, key)
	}

	for round := 0; round < restartRounds; round++ {
		out.rounds++
		victim := restartNodes/2 - round // 2, 1, 0
		holders := []int{victim, (victim + 1) % restartNodes, (victim + 2) % restartNodes}
		others := []int{(victim + 3) % restartNodes, (victim + 4) % restartNodes}

		for _, i := range others {
			if err := cl.clients[i].Set(lockclient.CtxFor(t, 5*time.Second), lockKey, "blocker", 10*time.Second).Err(); err != nil {
				t.Fatalf("node %d: SET blocker: %v", i, err)
			}
		}
		sent := time.Now()
		a := lc.MustLock(t, c1, key, "PX", restartTTLMS)
		aEnd := sent.Add(time.Duration(a.ValidityMS) * time.Millisecond) // no later than A's real end
		fence(fmt.Sprintf("round %d: A", round), a)
		for _, i := range holders {
			if v, ok := cl.lockValue(t, i, key); !ok || v != a.Token {
				t.Fatalf("round %d: node %d has %q, %v; want A's token: A must hold nodes %v", round, i, v, ok, holders)
			}
		}
		for _, i := range others {
			if err := cl.clients[i].Del(lockclient.CtxFor(t, 5*time.Second), lockKey).Err(); err != nil {
				t.Fatalf("node %d: DEL blocker: %v", i, err)
			}
		}

		cl.nodes[victim].Restart() // kill -9, then start empty on the same port
		if _, ok := cl.lockValue(t, victim, key); ok {
			t.Fatalf("round %d: node %d still has the key after an empty restart", round, victim)
		}

		// B asks through the other instance until A's validity is nearly
		// over (minus a margin for the round trip).
		granted := false
		for i := 0; i < 200 && time.Until(aEnd) > 100*time.Millisecond; i++ {
			out.bAttempts++
			b, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 5*time.Second), c2, key, "PX", restartTTLMS)
			if err != nil {
				t.Logf("round %d: B's LOCK: %v", round, err)
			}
			if ok && time.Now().Before(aEnd) {
				out.bGrants++
				granted = true
				fence(fmt.Sprintf("round %d: B (while A held the lock)", round), b)
				t.Logf("round %d: B granted %v before A's validity ended (A's fence %d, B's %d)", round, time.Until(aEnd), a.Fence, b.Fence)
				lc.Unlock(t, c2, key, b.Token)
				waitKeyGone(t, cl, key, holders...)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if granted {
			out.overlaps++
		}

		if quarantine {
			st := nodeStates(t, in2)[victim]
			if st.state != "quarantined" || st.leftMS <= 0 || st.restarts < 1 {
				t.Errorf("round %d: INFO of instance 2 says node %d is %+v; want quarantined with time left and a restart", round, victim, st)
			}
			if v := metricValue(t, in2, fmt.Sprintf("lockproxy_node_quarantined{node=%q}", cl.nodes[victim].Addr)); v != "1" {
				t.Errorf("round %d: lockproxy_node_quarantined of node %d = %q; want 1", round, victim, v)
			}
			// Both instances let the node vote again after the period,
			// once re-seeded.
			for _, in := range []*instance{in2, in1} {
				waitNodeStates(t, in, func(i int, st nodeState) bool { return i != victim || st.state == "ok" },
					fmt.Sprintf("round %d: node %d back to ok", round, victim))
			}
			if v := metricValue(t, in2, fmt.Sprintf("lockproxy_node_restarts_total{node=%q}", cl.nodes[victim].Addr)); v != "1" {
				t.Errorf("round %d: lockproxy_node_restarts_total of node %d = %q; want 1", round, victim, v)
			}
			checkReseeded(t, cl, victim)
		}
		if d := time.Until(aEnd); d > -50*time.Millisecond {
			time.Sleep(d + 50*time.Millisecond) // A's key expired everywhere
		}

		// A later grant has a higher fence and, with the quarantine, the
		// restarted node takes part in it again.
		c := lc.MustLock(t, c2, key, "PX", restartTTLMS)
		fence(fmt.Sprintf("round %d: C (after A)", round), c)
		if quarantine {
			var v string
			var ok bool
			for i := 0; i < 20; i++ {
				if v, ok = cl.lockValue(t, victim, key); ok && v == c.Token {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if !ok || v != c.Token {
				t.Errorf("round %d: the restarted node %d has %q, %v after the quarantine; want C's grant", round, victim, v, ok)
			}
		}
		if got := lc.Unlock(t, c2, key, c.Token); got != 1 {
			t.Fatalf("round %d: UNLOCK %q = %d; want 1", round, key, got)
		}
		// UNLOCK answers once a majority released; the next round's LOCK
		// must not overtake the releases still on their way.
		waitKeyGone(t, cl, key)
	}
	return out
}

// waitKeyGone polls (every 10 ms, at most 2 s) until no node but those in
// except holds key.
func waitKeyGone(t *testing.T, cl *cluster, key string, except ...int) {
	t.Helper()
	skip := map[int]bool{}
	for _, i := range except {
		skip[i] = true
	}
	for try := 0; try < 200; try++ {
		held := -1
		for i := range cl.nodes {
			if _, ok := cl.lockValue(t, i, key); ok && !skip[i] {
				held = i
				break
			}
		}
		if held < 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%q still held on a node 2 s after UNLOCK", key)
}

// checkReseeded checks that node victim's fence counters are at least the
// other nodes' for every slot.
func checkReseeded(t *testing.T, cl *cluster, victim int) {
	t.Helper()
	fenceKey := keyPrefix + "fence"
	mine, err := cl.clients[victim].HGetAll(lockclient.CtxFor(t, 5*time.Second), fenceKey).Result()
	if err != nil {
		t.Fatalf("node %d: HGETALL %s: %v", victim, fenceKey, err)
	}
	for i := range cl.nodes {
		if i == victim {
			continue
		}
		theirs, err := cl.clients[i].HGetAll(lockclient.CtxFor(t, 5*time.Second), fenceKey).Result()
		if err != nil {
			t.Fatalf("node %d: HGETALL %s: %v", i, fenceKey, err)
		}
		for f, v := range theirs {
			want, _ := strconv.ParseInt(v, 10, 64)
			got, _ := strconv.ParseInt(mine[f], 10, 64)
			if got < want {
				t.Errorf("restarted node %d: fence slot %s = %d after the re-seed; node %d has %d", victim, f, got, i, want)
			}
		}
	}
}

// nodeState is one lockproxy_node<i> line of INFO.
type nodeState struct {
	addr     string
	state    string
	leftMS   int64
	restarts int64
	// ratePPM is the node's measured clock rate error, -1 until measured.
	ratePPM int64
}

// nodeStates reads the per-node lines of INFO lockproxy.
func nodeStates(t *testing.T, in *instance) []nodeState {
	t.Helper()
	c := lc.NewClient(t, in.addr, 2)
	defer c.Close()
	info, err := c.Info(lockclient.CtxFor(t, 5*time.Second), "lockproxy").Result()
	if err != nil {
		t.Fatalf("INFO lockproxy: %v", err)
	}
	var out []nodeState
	for i := 0; ; i++ {
		prefix := fmt.Sprintf("lockproxy_node%d:", i)
		var line string
		for _, l := range strings.Split(info, "\r\n") {
			if strings.HasPrefix(l, prefix) {
				line = strings.TrimPrefix(l, prefix)
			}
		}
		if line == "" {
			break
		}
		st := nodeState{ratePPM: -2} // -2: missing
		for _, kv := range strings.Split(line, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "addr":
				st.addr = v
			case "state":
				st.state = v
			case "quarantine_left_ms":
				st.leftMS, _ = strconv.ParseInt(v, 10, 64)
			case "restarts":
				st.restarts, _ = strconv.ParseInt(v, 10, 64)
			case "rate_error_ppm":
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatalf("INFO lockproxy node line %q: rate_error_ppm %q: %v", line, v, err)
				}
				st.ratePPM = n
			}
		}
		// The restart checks measure the node's clock too. A local
		// redis-server's clock is ours, so its true rate error is zero,
		// and what is reported is the estimate's noise from the TIME
		// round trips: the fit over the latest samples admits up to 1 %
		// of it (recentMaxUncertainty), and a race build's round trips
		// on a busy host come near 0.1 %.
		if st.ratePPM < -1 || st.ratePPM > 10000 {
			t.Fatalf("INFO lockproxy node line %q: rate_error_ppm %d; want -1 (not yet measured) or at most 10000", line, st.ratePPM)
		}
		out = append(out, st)
	}
	if len(out) != restartNodes {
		t.Fatalf("INFO lockproxy has %d node lines; want %d:\n%s", len(out), restartNodes, info)
	}
	return out
}

// waitNodeStates polls INFO (every 100 ms, at most 10 s) until ok holds for
// every node.
func waitNodeStates(t *testing.T, in *instance, ok func(i int, st nodeState) bool, what string) {
	t.Helper()
	var sts []nodeState
	for try := 0; try < 100; try++ {
		sts = nodeStates(t, in)
		all := true
		for i, st := range sts {
			all = all && ok(i, st)
		}
		if all {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: not within 10 s; INFO says %+v", what, sts)
}
