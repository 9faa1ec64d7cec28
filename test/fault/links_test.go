package fault

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/faultproxy"
	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// Network faults: every lockproxy instance reaches every node through its
// own faultproxy (links[instance][node]), so a fault can hit one node for
// everyone, or only one instance's view of the cluster.

// linkEnv is an env whose instances talk to the nodes through proxies.
type linkEnv struct {
	*env
	links [][]*faultproxy.Proxy
}

// newLinkEnv starts n nodes and p lockproxy instances, each with its own
// proxy to each node; environ is added to every instance's environment.
func newLinkEnv(t *testing.T, n, p int, environ ...string) *linkEnv {
	t.Helper()
	e := &linkEnv{env: &env{
		nodes:  harness.StartRedisN(t, n, harness.RedisOptions{}),
		hist:   NewHistory(),
		ledger: NewLedger(true, false),
	}}
	for range p {
		var row []*faultproxy.Proxy
		var addrs []string
		for _, node := range e.nodes {
			fp := newFaultProxy(t, node.Addr)
			row = append(row, fp)
			addrs = append(addrs, fp.Addr())
		}
		e.links = append(e.links, row)
		e.proxies = append(e.proxies, startProxy(t, addrs, environ...))
	}
	return e
}

func newFaultProxy(t *testing.T, upstream string) *faultproxy.Proxy {
	t.Helper()
	fp, err := faultproxy.New(upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fp.Close() })
	return fp
}

// on applies f to the links from the given instances (nil: all) to the
// given nodes and returns how many links it touched.
func (e *linkEnv) on(instances, nodes []int, f func(*faultproxy.Proxy)) int {
	if instances == nil {
		for i := range e.links {
			instances = append(instances, i)
		}
	}
	n := 0
	for _, i := range instances {
		for _, j := range nodes {
			f(e.links[i][j])
			n++
		}
	}
	return n
}

// healAll puts every link back to pass-through.
func (e *linkEnv) healAll() {
	for _, row := range e.links {
		for _, fp := range row {
			fp.PassThrough()
		}
	}
}

// Timing of the rows (TTL 2 s, lockproxy's defaults otherwise).
const (
	faultFor = 3 * time.Second
	// driftMS is lockproxy's default drift for the TTL: TTL·0.01 + 2 ms.
	driftMS = ttlMS/100 + 2
	// cutGrace: a grant may still arrive this long after a cut began, from
	// replies the nodes sent before it (the node timeout is 100 ms).
	cutGrace = 200 * time.Millisecond
)

// linkRow is one network-fault row.
type linkRow struct {
	name string
	// environ for the lockproxy instances.
	environ []string
	// fault injects, waits, runs its own scenarios, and returns the fault
	// events; the runner heals every link afterwards.
	fault  func(t *testing.T, e *linkEnv, out *rowNotes) int
	expect expect
	// after runs extra checks once the workload ended.
	after func(t *testing.T, e *linkEnv, windows []faultWindow, gs []Grant)
	// soakGrants, when set, is the grants per client at soak size, for a
	// row whose fault stops all progress while it lasts: such a row makes
	// grants only in the second between faults, and 10,000 per client
	// would take it past its time limit.
	soakGrants int
	// soakCycles, when set, caps how many times the fault is injected at
	// soak size, for a row whose fault keeps lockproxy from granting for
	// a while after it healed.
	soakCycles int
}

// rowNotes collects a row's scenario results for its log line.
type rowNotes struct {
	mu    sync.Mutex
	notes []string
	// cutAt is when a fault that started late in its row began.
	cutAt time.Duration
	// windows, if set, are the row's fault windows (it healed between
	// them), instead of one from cutAt or the row's start to its end.
	windows []faultWindow
	// cycle is which injection of the fault this is (soak runs repeat it).
	cycle int
	// closed counts scenario rounds lockproxy refused because it failed
	// closed, as the row allows (see fastClockRow).
	closed int
}

// faultWindow is when one injection of a row's fault was on.
// faultWindow is when a fault was in force, on the history's clock.
type faultWindow struct{ from, to time.Duration }

// grantsDuring counts the grants that entered while a fault was in force,
// in all and by the lockproxy instance their client used.
func grantsDuring(gs []Grant, windows []faultWindow) (int, map[string]int) {
	during, byProxy := 0, map[string]int{}
	for _, g := range gs {
		for _, w := range windows {
			if g.Enter >= w.from && g.Enter <= w.to {
				during++
				byProxy[strings.SplitN(g.Client, ".", 2)[0]]++
				break
			}
		}
	}
	return during, byProxy
}

func (n *rowNotes) add(format string, args ...any) {
	n.mu.Lock()
	n.notes = append(n.notes, fmt.Sprintf(format, args...))
	n.mu.Unlock()
}

func (n *rowNotes) String() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := n.notes
	if n.closed > 0 {
		out = append(out[:len(out):len(out)], fmt.Sprintf("%d injections found the fast majority still out: long holds refused (NOQUORUM, failing closed)", n.closed))
	}
	return strings.Join(out, "; ")
}

// sleepFault waits out the rest of a fault that began at from.
func sleepFault(e *linkEnv, from time.Duration) {
	if d := faultFor - (e.hist.Now() - from); d > 0 {
		time.Sleep(d)
	}
}

var linkRows = []linkRow{
	{
		name: "minority-partitioned",
		fault: func(t *testing.T, e *linkEnv, notes *rowNotes) int {
			from := e.hist.Now()
			n := e.on(nil, []int{3, 4}, (*faultproxy.Proxy).Blackhole)
			time.Sleep(500 * time.Millisecond)
			partitionProbe(t, e, []int{0, 1, 2}, notes)
			sleepFault(e, from)
			return n
		},
		expect: expect{progress: true, blocked: -1},
	},
	{
		name: "instance-cut-off-from-majority",
		fault: func(t *testing.T, e *linkEnv, notes *rowNotes) int {
			return cutOffInstance(t, e, notes)
		},
		expect: expect{progress: true, blocked: 1},
		after: func(t *testing.T, e *linkEnv, windows []faultWindow, gs []Grant) {
			noGrantsWhileCut(t, 1, windows, gs)
		},
	},
	renewCutRow,
	{
		name: "slow-2-nodes-75ms",
		fault: func(t *testing.T, e *linkEnv, notes *rowNotes) int {
			from := e.hist.Now()
			n := e.on(nil, []int{3, 4}, func(p *faultproxy.Proxy) { p.SetLatency(75*time.Millisecond, 50*time.Millisecond) })
			probeValidity(t, e, notes)
			// Evidence that the latency took: lockproxy's commands to
			// nodes 3 and 4 (the workload's, the health checks) wait in
			// their links.
			held := 0
			for e.hist.Now()-from < faultFor {
				for _, row := range e.links {
					held = max(held, row[3].Held()+row[4].Held())
				}
				time.Sleep(10 * time.Millisecond)
			}
			if held == 0 {
				t.Errorf("no chunk to or from nodes 3 and 4 was held by their links' latency")
			}
			notes.add("up to %d chunks at once held in the links to nodes 3 and 4", held)
			return n
		},
		expect: expect{progress: true, blocked: -1},
	},
	{
		name: "slow-3-nodes-1500ms",
		fault: func(t *testing.T, e *linkEnv, _ *rowNotes) int {
			n := e.on(nil, []int{0, 1, 2}, func(p *faultproxy.Proxy) { p.SetLatency(1500*time.Millisecond, 0) })
			time.Sleep(faultFor)
			return n
		},
		expect: expect{blocked: -1},
		// About 150 faults at soak size.
		soakGrants: 2000,
		after: func(t *testing.T, e *linkEnv, windows []faultWindow, gs []Grant) {
			// A majority cannot answer within the node timeout: only
			// LOCKs answered before the latency began may enter.
			for i := range e.proxies {
				noGrantsWhileCut(t, i, windows, gs)
			}
			// Commands already delayed by 1.5 s reach the nodes after the
			// heal. A late acquire can still land after its roll-back (a
			// reconnect puts them on different connections), and an UNLOCK
			// that timed out leaves its key to the TTL, so what is checked
			// is that no lock key outlives its lease: one TTL after the
			// delayed commands landed and the workload stopped, none may
			// be left.
			d := windows[len(windows)-1].to + 1600*time.Millisecond - e.hist.Now()
			time.Sleep(max(d, 0) + ttlMS*time.Millisecond)
			checkNoLockKeys(t, e)
		},
	},
	fastClockRow(1),
	fastClockRow(2),
	fastClockRow(3),
	{
		name:    "half-open-keepalive-client",
		environ: []string{"LOCKPROXY_LOCKS_KEEPALIVE_IDLE=500ms"},
		fault: func(t *testing.T, e *linkEnv, notes *rowNotes) int {
			return halfOpenClient(t, e, notes)
		},
		expect: expect{progress: true, blocked: -1},
	},
}

// TestLinkFaults runs the workload under each network fault and checks its
// history like TestFaults.
func TestLinkFaults(t *testing.T) {
	harness.RequireBinary(t, "redis-server", "redis-server")
	harness.BuildLockproxy(t)
	for _, row := range linkRows {
		t.Run(row.name, func(t *testing.T) {
			rowSlot(t)
			runLinkRow(t, row)
		})
	}
}

func runLinkRow(t *testing.T, row linkRow) {
	clients, grants, cycles, limit := rowSize()
	if soak() && row.soakGrants > 0 {
		grants = row.soakGrants
	}
	if soak() && row.soakCycles > 0 {
		cycles = row.soakCycles
	}
	e := newLinkEnv(t, 5, 2, row.environ...)
	res := watchResources(t, e.proxies)
	w := workload{clients: clients, grants: grants, keys: rowKeys, limit: limit, tokens: soak(), readers: true}
	healed := make(chan struct{})
	start := time.Now()
	c, wait := w.run(t, e.env, healed)

	// Under load before the fault. Soak runs repeat the fault, a second
	// apart, until the clients made their grants.
	time.Sleep(300 * time.Millisecond)
	notes := &rowNotes{}
	holds, holdsDuring := longHoldsDuring(row.expect)
	var holdsDone func() string
	var windows []faultWindow
	events, attemptsDuring := 0, int64(0)
	for cycle := 0; anotherCycle(cycle, cycles, c.grants.Load(), int64(clients*grants), start, limit); cycle++ {
		if cycle > 0 {
			time.Sleep(time.Second)
		}
		notes.cutAt, notes.windows, notes.cycle = 0, nil, cycle
		from, sent := e.hist.Now(), c.attempts()
		if cycle == 0 && holds && holdsDuring {
			holdsDone = startLongHolds(t, e.env, rowLongHolds, "during the fault")
		}
		events += row.fault(t, e, notes)
		to := e.hist.Now()
		attemptsDuring += c.attempts() - sent
		if notes.cutAt > 0 {
			from = notes.cutAt // the row ran a scenario before its fault began
		}
		e.healAll()
		if notes.windows != nil {
			windows = append(windows, notes.windows...) // the row healed between its own windows
		} else {
			windows = append(windows, faultWindow{from, to})
		}
	}
	if holds && !holdsDuring {
		holdsDone = startLongHolds(t, e.env, rowLongHolds, "after the heal")
	}
	close(healed)
	wait()
	if holdsDone != nil {
		notes.add("%s", holdsDone())
	}
	run := rowRun{name: row.name, clients: clients, grants: grants, windows: windows, events: events,
		attemptsDuring: attemptsDuring, c: c, took: time.Since(start), res: res.finish(t), notes: notes.String()}
	judge(t, e.env, run, row.expect)
	if row.after != nil {
		row.after(t, e, windows, e.hist.Grants())
	}
}

// probeValidity sends single LOCKs (no WAIT, fresh keys) through instance
// 0 while the fault is on. Each grant's validity must be in (0, TTL −
// drift], and, counted from the reply (as lockproxy promises it, and as
// the checker's Enter counts it), must end before the key expires on a
// majority of nodes: the lease on the nodes outlives the promise. The expiry is read directly
// from each node as an absolute time (PEXPIRETIME, Unix ms on the node's
// clock, which is this host's clock), so the check holds however late the
// client, lockproxy or the read is scheduled. The client's own elapsed
// time is only logged: on a loaded host it includes queueing lockproxy
// cannot see, so validity + elapsed ≤ TTL is no assertion.
func probeValidity(t *testing.T, e *linkEnv, notes *rowNotes) {
	t.Helper()
	cl := newClient(e.proxies[0].addr)
	defer func() { _ = cl.Close() }()
	nodes := make([]*redis.Client, len(e.nodes))
	for i, node := range e.nodes {
		nodes[i] = node.Client(t)
	}
	n, maxSum, maxElapsed, minMargin := 0, time.Duration(0), time.Duration(0), time.Duration(1<<62)
	for i := range 20 {
		key := fmt.Sprintf("probe-%d", i)
		sent := time.Now()
		r, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 5*time.Second), cl, key, "PX", ttlMS)
		replied := time.Now()
		elapsed := replied.Sub(sent)
		// Rounded up: the promise only gets later.
		repliedMS := (replied.UnixNano() + int64(time.Millisecond) - 1) / int64(time.Millisecond)
		if err != nil || !ok {
			continue // a slow moment: no grant is fine
		}
		n++
		validity := time.Duration(r.ValidityMS) * time.Millisecond
		maxSum, maxElapsed = max(maxSum, validity+elapsed), max(maxElapsed, elapsed)
		if r.ValidityMS <= 0 || r.ValidityMS > ttlMS-driftMS {
			t.Errorf("probe %s: validity %d ms; want 0 < validity ≤ %d − %d ms", key, r.ValidityMS, ttlMS, driftMS)
		}
		promiseMS := repliedMS + r.ValidityMS
		var margins []time.Duration
		var seen []int64
		for _, nc := range nodes {
			at, err := nc.Do(lockclient.CtxFor(t, 3*time.Second), "PEXPIRETIME", "lockproxy:lock:"+key).Int64()
			seen = append(seen, at)
			if err == nil && at > 0 && at >= promiseMS {
				margins = append(margins, time.Duration(at-promiseMS)*time.Millisecond)
			}
		}
		if len(margins) <= len(nodes)/2 {
			t.Errorf("probe %s: validity %v from the reply (promise %d) outlasts the key on all but %d of %d nodes (expiry times %v); want a majority",
				key, validity, promiseMS, len(margins), len(nodes), seen)
		} else {
			slices.Sort(margins)
			// The majority whose keys last longest: its shortest margin.
			minMargin = min(minMargin, margins[len(margins)-(len(nodes)/2+1)])
		}
		_ = cl.Do(lockclient.CtxFor(t, 5*time.Second), "UNLOCK", key, r.Token).Err()
		time.Sleep(50 * time.Millisecond)
	}
	notes.add("%d/20 validity probes granted, the key outlived validity on a majority by ≥ %v; max validity + client-side elapsed %v, max elapsed %v",
		n, minMargin.Round(time.Millisecond), maxSum.Round(time.Millisecond), maxElapsed.Round(time.Millisecond))
	if n == 0 {
		t.Errorf("no validity probe was granted with 3 of 5 nodes fast")
	}
}

// partitionProbe is the evidence that a partition took on the links
// lockproxy uses: a LOCK through each instance must land on exactly the
// nodes it still reaches (read on the nodes directly), where without the
// cut it lands on all of them. The grants go into the history, under a
// name that leaves them out of the row's availability count.
func partitionProbe(t *testing.T, e *linkEnv, reached []int, notes *rowNotes) {
	t.Helper()
	var on [][]int
	for i, p := range e.proxies {
		// A key of its own per instance: one probe's UNLOCK need not have
		// landed for the next to be granted.
		key := fmt.Sprintf("partition-probe-%d-p%d", notes.cycle, i)
		cl := newClient(p.addr)
		r, ok, err := setupLock(t, cl, key, "PX", ttlMS)
		enter := e.hist.Now()
		if err != nil || !ok {
			_ = cl.Close()
			t.Errorf("partition probe through p%d: LOCK %s = %v, %v; want a grant from nodes %v", i, key, ok, err, reached)
			continue
		}
		got := nodesWith(t, e.env, key, r.Token)
		e.hist.Add(Grant{Key: key, Token: r.Token, Fence: r.Fence, Client: fmt.Sprintf("partition-probe.p%d", i),
			Enter: enter, Deadline: enter + time.Duration(r.ValidityMS)*time.Millisecond, Exit: e.hist.Now(),
			TTL: ttlMS * time.Millisecond, Validity: time.Duration(r.ValidityMS) * time.Millisecond})
		_ = cl.Do(lockclient.CtxFor(t, 5*time.Second), "UNLOCK", key, r.Token).Err()
		_ = cl.Close()
		if !slices.Equal(got, reached) {
			t.Errorf("partition probe through p%d: the lock landed on nodes %v; want exactly %v (the partition did not cut the others off)", i, got, reached)
		}
		on = append(on, got)
	}
	notes.add("a LOCK through each instance during the partition landed on nodes %v", on)
}

// checkNoLockKeys fails if any node still holds a lock key.
func checkNoLockKeys(t *testing.T, e *linkEnv) {
	t.Helper()
	for i, node := range e.nodes {
		cl := node.Client(t)
		keys, err := cl.Keys(lockclient.CtxFor(t, 3*time.Second), "lockproxy:lock:*").Result()
		if err != nil {
			t.Errorf("node %d: KEYS: %v", i, err)
			continue
		}
		for _, k := range keys {
			pttl, _ := cl.PTTL(lockclient.CtxFor(t, 3*time.Second), k).Result()
			t.Errorf("node %d still holds %s (PTTL %v) after the run", i, k, pttl)
		}
	}
}

// fastClockRow: node clocks run 1.5× fast on the first n nodes (TTLs
// there run out 1.5× sooner, and their TIME runs 1.5× fast). Besides the
// workload, a holder keeps a lock for 90 % of its validity while a client
// of the other instance waits for it: with a majority of fast nodes the
// lock runs out on them after TTL/1.5, and the waiter gets it while the
// holder still holds it.
//
// With a minority of fast nodes the long holds start once every instance
// has measured those clocks and taken the nodes out (INFO state=clock).
// Before that, RedLock alone is not safe with even one fast node: two
// majorities can share only fast nodes (holder granted by F1, F2, N1 while
// the previous holder's release is still on its way to N2 and N3; the
// waiter, after TTL/1.5, by F1, F2, N2), and the workload's grants in that
// window are judged like the others, so a row can show it. The row notes
// how long detection took.
func fastClockRow(n int) linkRow {
	nodes := make([]int, n)
	for i := range nodes {
		nodes[i] = i
	}
	row := linkRow{
		name: fmt.Sprintf("fast-clock-1.5x-on-%d-nodes", n),
		fault: func(t *testing.T, e *linkEnv, notes *rowNotes) int {
			from := e.hist.Now()
			events := e.on(nil, nodes, func(p *faultproxy.Proxy) { p.FastClock(1.5) })
			majority := n >= len(e.nodes)/2+1
			if notes.cycle == 0 {
				// Before the detector can take the fast nodes out
				// (later injections may find a fast majority still out).
				fastClockProbe(t, e, nodes, notes)
			}
			if !majority {
				waitClockOut(t, e, nodes, notes)
			}
			// A fast majority that the detector took out in an earlier
			// injection may still be out (its estimate has not recovered
			// in the second between faults): lockproxy then fails closed
			// and the long holds cannot start. The first injection must
			// get them.
			longHolds(t, e, notes, 2, majority && notes.cycle > 0)
			sleepFault(e, from)
			return events
		},
		expect: expect{progress: true, blocked: -1, unsafe: true},
		// unsafe for every n: the workload runs from the injection on,
		// before detection (see above); the long holds of a minority row
		// run after it.
	}
	if n >= 3 {
		// Of the 5 nodes a majority is fast, and once the detector has
		// it out nothing is granted: with the fault repeated a second
		// apart the estimates never come back in bounds (a soak run made
		// 3,356 grants in 30 min). At soak size the row injects once
		// and its clients then make their 10,000 grants each.
		row.soakCycles = 1
	}
	return row
}

// fastClockProbe is the evidence that the fast clocks took on the links
// lockproxy uses: a LOCK PX ttlMS through instance 0, read on every node
// directly, must expire within ttlMS/1.5 of its reply on the fast nodes,
// and no sooner than ttlMS after it was sent on the others. Nothing else
// in the three-node row depends on it: its overlaps are only logged. The
// expiry is read as an absolute time (PEXPIRETIME, on this host's clock,
// as probeValidity reads it), so a slow read cannot blur the two. The
// grant goes into the history, under a name that leaves it out of the
// row's availability count.
func fastClockProbe(t *testing.T, e *linkEnv, fast []int, notes *rowNotes) {
	t.Helper()
	const key = "fast-clock-probe"
	cl := newClient(e.proxies[0].addr)
	defer func() { _ = cl.Close() }()
	sent := time.Now().UnixMilli()
	r, ok, err := setupLock(t, cl, key, "PX", ttlMS)
	replied := time.Now().UnixMilli() + 1 // rounded up
	enter := e.hist.Now()
	if err != nil || !ok {
		t.Errorf("fast-clock probe: LOCK %s PX %d = %v, %v; want a grant", key, ttlMS, ok, err)
		return
	}
	left := make([]int64, len(e.nodes)) // expiry − sent, ms
	seen := 0                           // fast nodes seen holding it shortened
	for i, node := range e.nodes {
		at, err := node.Client(t).Do(lockclient.CtxFor(t, 3*time.Second), "PEXPIRETIME", "lockproxy:lock:"+key).Int64()
		// The latest the node can have set it: a node outside the
		// majority that answered the LOCK may take its grant after the
		// reply (a CI run saw a fast node's expiry 1,335 ms after it).
		read := time.Now().UnixMilli() + 1 // rounded up
		if err != nil || at <= 0 {
			left[i] = -1 // not there (a node may miss a grant)
			continue
		}
		left[i] = at - sent
		switch isFast := slices.Contains(fast, i); {
		case isFast && at > read+ttlMS*2/3+1:
			t.Errorf("fast-clock probe: fast node %d expires the lock %d ms after it was read there (%d after the reply); want ≤ %d (1.5× fast)",
				i, at-read, at-replied, ttlMS*2/3+1)
		case !isFast && at < sent+ttlMS:
			t.Errorf("fast-clock probe: node %d, not fast, expires the lock %d ms after it was sent; want ≥ %d", i, at-sent, ttlMS)
		case isFast:
			seen++
		}
	}
	e.hist.Add(Grant{Key: key, Token: r.Token, Fence: r.Fence, Client: "fast-clock-probe.p0",
		Enter: enter, Deadline: enter + time.Duration(r.ValidityMS)*time.Millisecond, Exit: e.hist.Now(),
		TTL: ttlMS * time.Millisecond, Validity: time.Duration(r.ValidityMS) * time.Millisecond})
	_ = cl.Do(lockclient.CtxFor(t, 5*time.Second), "UNLOCK", key, r.Token).Err()
	if seen == 0 {
		t.Errorf("fast-clock probe: no fast node %v holds the lock with a shortened lease (ms to expiry from the send: %v)", fast, left)
	}
	notes.add("a LOCK PX %d expired on the nodes %v ms after it was sent (fast: %v; reply after %d ms)", ttlMS, left, fast, replied-sent)
}

// waitClockOut waits (up to 60 s) until every instance reports the given
// nodes out of quorums for their clocks, and notes how long it took.
func waitClockOut(t *testing.T, e *linkEnv, nodes []int, notes *rowNotes) {
	t.Helper()
	start := time.Now()
	for _, p := range e.proxies {
		c := newClient(p.addr)
		for {
			info, _ := c.Info(lockclient.CtxFor(t, 5*time.Second), "lockproxy").Result()
			out := 0
			for _, i := range nodes {
				tag := fmt.Sprintf("lockproxy_node%d:", i)
				if j := strings.Index(info, tag); j >= 0 {
					line, _, _ := strings.Cut(info[j:], "\n")
					if strings.Contains(line, "state=clock") {
						out++
					}
				}
			}
			if out == len(nodes) {
				break
			}
			if time.Since(start) > 60*time.Second {
				_ = c.Close()
				t.Fatalf("instance %s did not take the fast nodes out within 60 s; INFO:\n%s", p.addr, info)
			}
			time.Sleep(100 * time.Millisecond)
		}
		_ = c.Close()
	}
	notes.add("fast nodes taken out by every instance %v after their clocks went fast", time.Since(start).Round(10*time.Millisecond))
}

// longHolds runs rounds of: instance 0's client holds key "long" for 90 %
// of its validity and then does its ledger update; instance 1's client
// waits for it and does its update at once. Both grants go into the
// history. If the waiter gets in early, its higher fence makes the fenced
// ledger reject the holder's late write.
//
// With closedOK, a holder's LOCK refused with NOQUORUM because nodes are out
// for their clocks (lockproxy failing closed) ends the rounds and is
// counted in notes instead of failing the row.
func longHolds(t *testing.T, e *linkEnv, notes *rowNotes, rounds int, closedOK bool) {
	t.Helper()
	const key = "long"
	holder, waiter := newClient(e.proxies[0].addr), newClient(e.proxies[1].addr)
	defer func() { _ = holder.Close(); _ = waiter.Close() }()
	early := 0
	for round := range rounds {
		r, ok, err := setupLock(t, holder, key, "PX", ttlMS, "WAIT", waitMS)
		enter := e.hist.Now()
		if closedOK && lockclient.IsNoQuorum(err) && strings.Contains(err.Error(), " clock") {
			notes.mu.Lock()
			notes.closed++
			notes.mu.Unlock()
			return
		}
		if err != nil || !ok {
			t.Errorf("round %d: holder LOCK %s = %v, %v; want a grant", round, key, ok, err)
			return
		}
		hg := Grant{Key: key, Token: r.Token, Fence: r.Fence, Client: "long-holder",
			Enter: enter, Deadline: enter + time.Duration(r.ValidityMS)*time.Millisecond,
			TTL: ttlMS * time.Millisecond, Validity: time.Duration(r.ValidityMS) * time.Millisecond}
		type result struct {
			ok  bool
			err error
			g   Grant
		}
		got := make(chan result, 1)
		go func() {
			// The waiter does its update as soon as it is granted.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r, ok, err := lockclient.TryLock(ctx, waiter, key, "PX", ttlMS, "WAIT", 2*ttlMS)
			res := result{ok: ok, err: err, g: Grant{Key: key, Token: r.Token, Fence: r.Fence,
				Client: "long-waiter", Enter: e.hist.Now()}}
			if ok {
				res.g.Deadline = res.g.Enter + time.Duration(r.ValidityMS)*time.Millisecond
				res.g.TTL, res.g.Validity = ttlMS*time.Millisecond, time.Duration(r.ValidityMS)*time.Millisecond
				e.critical(key, &res.g)
				res.g.Exit = e.hist.Now()
				_ = waiter.Do(ctx, "UNLOCK", key, r.Token).Err()
			}
			got <- res
		}()
		time.Sleep(time.Duration(r.ValidityMS) * time.Millisecond * 9 / 10)
		e.critical(key, &hg)
		hg.Exit = e.hist.Now()
		e.hist.Add(hg)
		_ = holder.Do(lockclient.CtxFor(t, 5*time.Second), "UNLOCK", key, r.Token).Err()
		res := <-got
		if res.err != nil || !res.ok {
			t.Logf("round %d: waiter LOCK %s = %v, %v", round, key, res.ok, res.err)
			continue
		}
		if res.g.Enter < hg.Exit {
			early++
		}
		e.hist.Add(res.g)
	}
	notes.add("%d of %d long holds taken over by the waiter before the holder let go", early, rounds)
}

// cutOffInstance blackholes instance 1's links to nodes 0-2. Before the
// cut, a RESP3 client of instance 1 holds a KEEPALIVE lock; during it, a
// client of instance 0 waits for that lock. The holder must be told
// (push lock-lost) before the lease lockproxy vouched for can have ended,
// and the waiter must not get the lock before the holder was told. A RESP2
// KEEPALIVE holder must get -LOCKLOST on its next LOCK of the key.
func cutOffInstance(t *testing.T, e *linkEnv, notes *rowNotes) int {
	t.Helper()
	const key = "keepalive-cut"
	holder, err := dialRaw(e.proxies[1].addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Close() }()
	if _, _, err := holder.do(2*time.Second, "HELLO", "3"); err != nil {
		t.Fatalf("HELLO 3: %v", err)
	}
	r, err := setupLockRaw(holder, 10*time.Second, key, "PX", fmt.Sprint(ttlMS), "WAIT", fmt.Sprint(waitMS), "KEEPALIVE")
	enter := e.hist.Now()
	if err != nil {
		t.Fatalf("LOCK %s KEEPALIVE: %v", key, err)
	}
	// A RESP2 KEEPALIVE holder on the same instance learns of the loss
	// from -LOCKLOST on its next lock command for the key.
	const key2 = "keepalive-cut-resp2"
	holder2 := newClient(e.proxies[1].addr)
	defer func() { _ = holder2.Close() }()
	r2, ok, err := setupLock(t, holder2, key2, "PX", ttlMS, "WAIT", waitMS, "KEEPALIVE")
	enter2 := e.hist.Now()
	if err != nil || !ok {
		t.Fatalf("LOCK %s KEEPALIVE (RESP2) = %v, %v", key2, ok, err)
	}
	// Held across a few renewals before the cut.
	time.Sleep(time.Duration(ttlMS) * time.Millisecond)

	from := e.hist.Now()
	events := e.on([]int{1}, []int{0, 1, 2}, (*faultproxy.Proxy).Blackhole)
	notes.cutAt = from

	type result struct {
		r   lockclient.Grant
		ok  bool
		err error
		g   Grant
	}
	got := make(chan result, 1)
	go func() {
		cl := newClient(e.proxies[0].addr)
		defer func() { _ = cl.Close() }()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r, ok, err := lockclient.TryLock(ctx, cl, key, "PX", ttlMS, "WAIT", 2*waitMS)
		res := result{r: r, ok: ok, err: err, g: Grant{Key: key, Token: r.Token, Fence: r.Fence,
			Client: "keepalive-cut-waiter", Enter: e.hist.Now()}}
		if ok {
			res.g.Deadline = res.g.Enter + time.Duration(r.ValidityMS)*time.Millisecond
			res.g.TTL, res.g.Validity = ttlMS*time.Millisecond, time.Duration(r.ValidityMS)*time.Millisecond
			e.critical(key, &res.g)
			res.g.Exit = e.hist.Now()
			_ = cl.Do(ctx, "UNLOCK", key, r.Token).Err()
		}
		got <- res
	}()

	// The lease lockproxy vouched for cannot outlast the cut by more than
	// TTL − drift (a renewal sent right at the cut). Whether it was still
	// in force when the holder was told is read on the nodes themselves:
	// the holder's token must still be on a majority, so nobody else can
	// have the lock yet.
	latest := from + (ttlMS-driftMS)*time.Millisecond
	var lostAt time.Duration
	held := 0
	for lostAt == 0 {
		v, err := holder.read(time.Now().Add(faultFor))
		if err != nil {
			t.Errorf("KEEPALIVE holder on the cut-off instance: no lock-lost push within %v of the cut: %v", faultFor, err)
			break
		}
		if p, ok := v.(pushFrame); ok && len(p) == 3 && p[0] == "lock-lost" && p[1] == key {
			lostAt = e.hist.Now()
			held = len(nodesWith(t, e.env, key, r.Token))
		}
	}
	hg := Grant{Key: key, Token: r.Token, Fence: r.Fence, Client: "keepalive-cut-holder", Enter: enter,
		TTL: ttlMS * time.Millisecond, Validity: time.Duration(r.ValidityMS) * time.Millisecond}
	if lostAt > 0 {
		// The holder stops at the signal: that is its exit.
		hg.Exit, hg.Deadline = lostAt, lostAt
		notes.add("KEEPALIVE holder told lock-lost %v after the cut, while %d of %d nodes still held its token",
			(lostAt - from).Round(time.Millisecond), held, len(e.nodes))
		if lostAt > latest {
			t.Errorf("lock-lost came %v after the cut; want before %v (TTL − drift)", lostAt-from, latest-from)
		}
		if held <= len(e.nodes)/2 {
			t.Errorf("lock-lost came when only %d of %d nodes held the holder's token: after its lease ended", held, len(e.nodes))
		}
	} else {
		hg.Exit, hg.Deadline = -1, e.hist.Now()
	}
	e.hist.Add(hg)
	// The connection stays usable after the signal.
	if v, _, err := holder.do(2*time.Second, "PING"); err != nil || v != "PONG" {
		t.Errorf("PING after lock-lost = %v, %v", v, err)
	}

	// The RESP2 holder (renewed on the same schedule) asks again soon
	// after: it must be told LOCKLOST, not granted.
	askAt := latest - 100*time.Millisecond
	if lostAt > 0 {
		askAt = min(askAt, lostAt+300*time.Millisecond)
	}
	if d := askAt - e.hist.Now(); d > 0 {
		time.Sleep(d)
	}
	_, ok2, err2 := lockclient.TryLock(lockclient.CtxFor(t, 5*time.Second), holder2, key2, "PX", ttlMS)
	told := e.hist.Now()
	g2 := Grant{Key: key2, Token: r2.Token, Fence: r2.Fence, Client: "keepalive-cut-resp2-holder", Enter: enter2,
		TTL: ttlMS * time.Millisecond, Validity: time.Duration(r2.ValidityMS) * time.Millisecond}
	if err2 == nil || !strings.HasPrefix(err2.Error(), "LOCKLOST") {
		t.Errorf("RESP2 KEEPALIVE holder: LOCK %s %v after the cut = %v, %v; want -LOCKLOST", key2, told-from, ok2, err2)
		g2.Exit, g2.Deadline = -1, told
	} else {
		g2.Exit, g2.Deadline = told, told
		notes.add("RESP2 KEEPALIVE holder got %q %v after the cut", err2.Error()[:8], (told - from).Round(time.Millisecond))
	}
	e.hist.Add(g2)

	sleepFault(e, from)
	res := <-got
	switch {
	case res.err != nil || !res.ok:
		t.Errorf("waiter on instance p0: LOCK %s = %v, %v; want a grant once the cut-off holder's lease ran out", key, res.ok, res.err)
	default:
		notes.add("waiter on p0 got the lock %v after the cut", (res.g.Enter - from).Round(time.Millisecond))
		e.hist.Add(res.g)
	}
	return events
}

// halfOpenClient: a KEEPALIVE holder whose link to lockproxy goes silent
// (its own faultproxy blackholed, the socket left open). lockproxy renews
// only while the connection shows life within locks.keepalive_idle
// (500 ms here), so a client of the other instance must get the lock
// within about idle + one lease. The holder keeps sending PINGs, well
// within the idle window, from its grant on: lockproxy counts a command
// as life, so a holder that sent nothing would lose its lock to idleness
// on a healthy link too, and the row would pass with the blackhole doing
// nothing. With the PINGs, only the blackhole's dropping them lets the
// waiter in.
func halfOpenClient(t *testing.T, e *linkEnv, notes *rowNotes) int {
	t.Helper()
	const (
		key     = "half-open"
		leaseMS = 1000
		idle    = 500 * time.Millisecond
		bound   = idle + 2*leaseMS*time.Millisecond + time.Second // generous
	)
	front := newFaultProxy(t, e.proxies[0].addr)
	holder, err := dialRaw(front.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Close() }()
	r, err := setupLockRaw(holder, 5*time.Second, key, "PX", fmt.Sprint(leaseMS), "KEEPALIVE")
	enter := e.hist.Now()
	if err != nil {
		t.Fatalf("LOCK %s PX %d KEEPALIVE: %v", key, leaseMS, err)
	}
	e.hist.Add(Grant{Key: key, Token: r.Token, Fence: r.Fence, Client: "half-open-holder",
		Enter: enter, Deadline: enter + time.Duration(r.ValidityMS)*time.Millisecond, Exit: -1,
		TTL: leaseMS * time.Millisecond, Validity: time.Duration(r.ValidityMS) * time.Millisecond})
	// The holder's PINGs (replies left unread: the holder's side of a
	// half-open link learns nothing). They stop before the deferred Close.
	var pings atomic.Int64
	stopPings := make(chan struct{})
	pinged := make(chan struct{})
	go func() {
		defer close(pinged)
		tick := time.NewTicker(idle / 5)
		defer tick.Stop()
		for {
			select {
			case <-stopPings:
				return
			case <-tick.C:
				if holder.send("PING") == nil {
					pings.Add(1)
				}
			}
		}
	}()
	defer func() { close(stopPings); <-pinged }()
	front.Blackhole()
	from := e.hist.Now()
	pingsBefore := pings.Load()

	cl := newClient(e.proxies[1].addr)
	defer func() { _ = cl.Close() }()
	wr, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 10*time.Second), cl, key, "PX", ttlMS, "WAIT", fmt.Sprint(bound.Milliseconds()))
	at := e.hist.Now()
	if err != nil || !ok {
		t.Errorf("waiter: LOCK %s WAIT %v = %v, %v; want the half-open holder's lock within about idle + lease", key, bound, ok, err)
		return 1
	}
	e.hist.Add(Grant{Key: key, Token: wr.Token, Fence: wr.Fence, Client: "half-open-waiter",
		Enter: at, Deadline: at + time.Duration(wr.ValidityMS)*time.Millisecond, Exit: at,
		TTL: ttlMS * time.Millisecond, Validity: time.Duration(wr.ValidityMS) * time.Millisecond})
	_ = cl.Do(lockclient.CtxFor(t, 5*time.Second), "UNLOCK", key, wr.Token).Err()
	notes.add("half-open KEEPALIVE holder's lock went to a waiter %v after its link went silent, %d PINGs of the holder dropped meanwhile (idle %v, lease %d ms, bound %v)",
		(at - from).Round(time.Millisecond), pings.Load()-pingsBefore, idle, leaseMS, bound)
	if at-from > bound {
		t.Errorf("waiter got the lock %v after the holder went silent; want ≤ %v", at-from, bound)
	}
	sleepFault(e, from)
	return 1
}
