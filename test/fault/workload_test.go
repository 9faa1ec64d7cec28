package fault

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/faultproxy"
	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// Workload settings. The TTL is Jepsen's 2 s; WAIT is longer than the TTL
// so that a waiter outlasts a lock whose holder vanished.
const (
	ttlMS  = 2000
	waitMS = 3000
	// maxSleep bounds the random sleep inside the critical section.
	maxSleep = 2 * time.Millisecond
	// proxyDefaultTTL is lockproxy's locks.default_ttl, the lease of a
	// LOCK without PX (keepaliveVanish's holders).
	proxyDefaultTTL = 30 * time.Second
)

// env is one fault run: real redis-server nodes, lockproxy instances in
// front of all of them, one history and one fenced ledger.
type env struct {
	nodes   []*harness.Redis
	proxies []*proxy
	hist    *History
	ledger  *Ledger

	// vanish is how many grants, from now on, end with the client closing
	// its connection instead of UNLOCK.
	vanish atomic.Int64

	// flight records the stops and kills of instances and the workload's
	// commands they caught in flight (inflight_test.go).
	flight inFlight
}

// newEnv starts n nodes and p lockproxy instances in front of them.
func newEnv(t *testing.T, n, p int, environ ...string) *env {
	t.Helper()
	e := &env{
		nodes:  harness.StartRedisN(t, n, harness.RedisOptions{}),
		hist:   NewHistory(),
		ledger: NewLedger(true, false),
	}
	for range p {
		e.proxies = append(e.proxies, startProxy(t, harness.Addrs(e.nodes), environ...))
	}
	return e
}

// takeVanish consumes one unit of the vanish budget, if any is left.
func (e *env) takeVanish() bool {
	for {
		n := e.vanish.Load()
		if n <= 0 {
			return false
		}
		if e.vanish.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// critical is the work inside a critical section: read the key's counter,
// sleep up to maxSleep, write it back plus one with the grant's fence.
func (e *env) critical(key string, g *Grant) {
	v := e.ledger.Read(key, g.Fence)
	g.Read = v
	time.Sleep(rand.N(maxSleep + 1))
	g.Use = e.hist.Now()
	g.Rejected = !e.ledger.Write(key, g.Fence, v+1)
}

// reading is a reader's critical section: read the key's counter with the
// grant's fence, sleep up to maxSleep and read it again; it writes nothing
// (Use stays 0; Check holds it against the writes, and porcupine checks
// that no write landed between its reads).
func (e *env) reading(key string, g *Grant) {
	g.Read = e.ledger.ReadShared(key, g.Fence)
	time.Sleep(rand.N(maxSleep + 1))
	g.Reread, g.RereadOK = e.ledger.Reread(key, g.Fence)
}

// counts are a workload's outcomes. unlockZeroEarly counts the UNLOCKs
// answered 0 that were sent within the first half of their grant's
// validity: the lock was gone well before its lease ran out (a client
// descheduled past its lease gets 0 honestly, hence the half).
type counts struct {
	grants, nils, noQuorum, errs, unlockZero, unlockZeroEarly, unlockErrs, vanished atomic.Int64
	lastErr                                                                         atomic.Value // string
}

// attempts is how many LOCKs the clients got an answer to so far.
func (c *counts) attempts() int64 {
	return c.grants.Load() + c.nils.Load() + c.noQuorum.Load() + c.errs.Load()
}

// workload is C clients split over the instances, each looping LOCK →
// ledger read-modify-write → UNLOCK over keys.
type workload struct {
	clients int
	grants  int // per client, at least
	keys    int
	limit   time.Duration // wall-clock bound of the whole run
	// tokens has a quarter of the clients name a new token in each LOCK
	// (see env.client).
	tokens bool
	// readers has another quarter of the clients take read locks (RLOCK)
	// instead (see env.client); every row of the suite sets it.
	readers bool
}

// afterHeal is how many grants each client makes after the fault healed
// (at least), so that every run shows progress on the healed cluster.
const afterHeal = 5

// run starts the clients and returns a function that waits for them. A
// client stops once healed is closed and it made w.grants grants in all and
// afterHeal since; or after 20 × w.grants grants; or when the wall-clock
// limit passes (which is reported as missing progress).
func (w workload) run(t *testing.T, e *env, healed <-chan struct{}) (*counts, func()) {
	t.Helper()
	c := &counts{}
	deadline := time.Now().Add(w.limit)
	// stop ends the clients early when the row itself ended early (a
	// Fatalf in its fault): they must not outlive it, nor log after it.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var short atomic.Int64
	for i := range w.clients {
		// The role goes by i%4 (TOKEN clients 1, readers 3) and the
		// instance by (i + i/4) % instances: with two instances it
		// alternates every four clients, so readers and TOKEN clients go
		// through both (by i%2 alone they all went through p1, and the
		// rows that kill or cut off p1 saw no read granted elsewhere).
		// With two instances each still serves two of every four.
		inst := (i + i/4) % len(e.proxies)
		p := e.proxies[inst]
		name := fmt.Sprintf("p%d.c%d", inst, i)
		wg.Go(func() {
			n := e.client(name, inst, p.addr, w.tokens && i%4 == 1, w.readers && i%4 == 3, w, healed, stop, deadline, c)
			select {
			case <-stop:
				return
			default:
			}
			if n < w.grants {
				short.Add(1)
				t.Errorf("client %s made %d grants by the %v limit; want %d", name, n, w.limit, w.grants)
			}
		})
	}
	// Registered after the env's cleanups, so it runs before them: the
	// clients are gone before their nodes and instances are stopped.
	t.Cleanup(func() {
		close(stop)
		wg.Wait()
	})
	return c, func() {
		wg.Wait()
		if short.Load() > 0 {
			t.Logf("last error: %v", c.lastErr.Load())
		}
	}
}

// client is one workload client; it returns how many grants it made.
// With withToken it names a new token for each LOCK (TOKEN): such an
// attempt may join a hold of its token (none here but its own earlier
// tries within one WAIT), so its first step on the nodes is the marked
// acquire and its roll-backs are marked ones; in the rows that ask for
// it (fault.tokens, every row in a soak run) a quarter of the clients do,
// mixing both kinds on the same keys. (Not in every row of make test:
// the suite's time, which such clients may lengthen, is not measured
// apart from the host's load yet.)
//
// A reader (a quarter of the clients in every row) loops RLOCK, with a TOKEN of
// its own as every other of its RLOCKs (a read acquire is marked with its
// attempt either way: see lateReadReleaseScript), a read of the ledger,
// and UNLOCK: the history must show no read within a write's validity and
// no write within a read's, and read fences no lower than the writes
// before them.
func (e *env) client(name string, inst int, addr string, withToken, reader bool, w workload, healed, stop <-chan struct{}, deadline time.Time, c *counts) int {
	cl := newClient(addr)
	defer func() { _ = cl.Close() }()
	n, atHeal := 0, -1
	for time.Now().Before(deadline) && n < 20*w.grants {
		select {
		case <-stop:
			return n
		default:
		}
		if atHeal < 0 {
			select {
			case <-healed:
				atHeal = n
			default:
			}
		}
		if atHeal >= 0 && n >= w.grants && n-atHeal >= afterHeal {
			return n
		}
		key := fmt.Sprintf("k%d", rand.N(w.keys))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		args := []any{"PX", ttlMS, "WAIT", waitMS}
		if withToken || reader && n%2 == 1 {
			args = append(args, "TOKEN", name+"."+lockclient.RandID())
		}
		cmd := "LOCK"
		if reader {
			cmd = "RLOCK"
		}
		sent := e.hist.Now()
		e.flight.sending(inst)
		r, ok, err := lockclient.TryAcquire(ctx, cl, cmd, key, args...)
		cancel()
		enter := e.hist.Now()
		e.flight.done(inst, true, key, sent, enter, ok, time.Duration(r.ValidityMS)*time.Millisecond, err)
		switch {
		case lockclient.IsNoQuorum(err):
			c.noQuorum.Add(1)
			time.Sleep(time.Duration(10+rand.N(40)) * time.Millisecond)
			continue
		case err != nil:
			c.errs.Add(1)
			c.lastErr.Store(err.Error())
			time.Sleep(time.Duration(10+rand.N(40)) * time.Millisecond)
			continue
		case !ok:
			c.nils.Add(1)
			continue
		}
		g := Grant{Key: key, Token: r.Token, Fence: r.Fence, Client: name, Shared: reader,
			Enter: enter, Deadline: enter + time.Duration(r.ValidityMS)*time.Millisecond,
			TTL: ttlMS * time.Millisecond, Validity: time.Duration(r.ValidityMS) * time.Millisecond}
		if reader {
			e.reading(key, &g)
		} else {
			e.critical(key, &g)
		}
		n++
		c.grants.Add(1)
		if e.takeVanish() {
			// Gone without UNLOCK: the lock runs out with its TTL.
			g.Exit = e.hist.Now()
			e.hist.Add(g)
			_ = cl.Close()
			cl = newClient(addr)
			c.vanished.Add(1)
			continue
		}
		g.Exit = e.hist.Now()
		e.hist.Add(g)
		ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
		sent = e.hist.Now()
		released, err := cl.Do(ctx, "UNLOCK", key, r.Token).Int64()
		cancel()
		e.flight.done(inst, false, key, sent, e.hist.Now(), false, 0, err)
		switch {
		case err != nil:
			c.unlockErrs.Add(1)
		case released == 0:
			c.unlockZero.Add(1)
			if sent < g.Enter+g.Validity/2 {
				c.unlockZeroEarly.Add(1)
			}
		}
	}
	return n
}

// ---------------------------------------------------------------------------
// Faults

// fault is a named, reusable fault: inject starts it (and may run a
// schedule, such as kill, wait, kill again) and returns how many fault
// events it applied (counted from what it saw take effect); heal ends it.
type fault struct {
	name   string
	inject func(t *testing.T, e *linkEnv, notes *rowNotes) int
	heal   func(t *testing.T, e *linkEnv)
	// environ for the lockproxy instances.
	environ []string
	// links: the instances reach the nodes through faultproxies (e.links),
	// for a row that drops one instance's traffic to some nodes as part of
	// its schedule; otherwise e.links is nil.
	links  bool
	expect expect
	// tokens: a quarter of the clients use TOKEN (see env.client).
	tokens bool
	// after, if set, runs checks of the row's own once the workload
	// ended, before the row is judged; its notes go into the row's line.
	after func(t *testing.T, e *linkEnv, notes *rowNotes)
}

// killNode SIGKILLs node i and returns 1 if it is down.
func killNode(t *testing.T, e *linkEnv, i int) int {
	t.Helper()
	e.nodes[i].Kill()
	if e.nodes[i].Running() {
		t.Errorf("node %d (%s) still running after SIGKILL", i, e.nodes[i].Addr)
		return 0
	}
	return 1
}

// restartNode restarts node i empty (killing it first if it runs) and
// returns 1 if a new process serves it.
func restartNode(t *testing.T, e *linkEnv, i int) int {
	t.Helper()
	before := e.nodes[i].PID()
	e.nodes[i].Restart()
	if !e.nodes[i].Running() || e.nodes[i].PID() == before {
		t.Errorf("node %d (%s) not restarted: pid %d before, %d after", i, e.nodes[i].Addr, before, e.nodes[i].PID())
		return 0
	}
	return 1
}

// pauseNode SIGSTOPs node i and returns 1 once the kernel shows it stopped.
func pauseNode(t *testing.T, e *linkEnv, i int) int {
	t.Helper()
	e.nodes[i].Pause()
	pid := e.nodes[i].PID()
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if processStopped(pid) {
			return 1
		}
	}
	t.Errorf("node %d (%s, pid %d) not stopped a second after SIGSTOP", i, e.nodes[i].Addr, pid)
	return 0
}

// processStopped reports whether /proc shows pid stopped by a signal.
func processStopped(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state …: the state follows the last ')'.
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && (b[i+2] == 'T' || b[i+2] == 't')
}

// pastTTL is how long a killed node stays down before it is restarted
// empty in the kill row: past the TTL every lock it held has run out (the
// "delayed restart" RedLock asks of operators). Restarts while locks are
// still held, which lockproxy's restart quarantine must catch, are the
// restart-2-nodes-empty-while-held row.
const pastTTL = ttlMS*time.Millisecond + 500*time.Millisecond

// lockKeys counts the lock keys on a node, read directly.
func lockKeys(t *testing.T, node *harness.Redis) int {
	t.Helper()
	keys, err := node.Client(t).Keys(lockclient.CtxFor(t, 3*time.Second), "lockproxy:lock:*").Result()
	if err != nil {
		t.Errorf("KEYS on %s: %v", node.Addr, err)
	}
	return len(keys)
}

// quarantineMaxTTL is locks.max_ttl in the row that restarts nodes empty
// under load: how long lockproxy keeps a restarted node out.
const quarantineMaxTTL = 3 * time.Second

var faults = []fault{
	{
		name:   "none",
		inject: func(*testing.T, *linkEnv, *rowNotes) int { time.Sleep(500 * time.Millisecond); return 0 },
		heal:   func(*testing.T, *linkEnv) {},
		expect: expect{progress: true, blocked: -1, clean: true},
	},
	{
		name:   "kill-2-nodes-restart-empty-past-ttl",
		tokens: true,
		inject: func(t *testing.T, e *linkEnv, _ *rowNotes) int {
			n := killNode(t, e, 0)
			time.Sleep(500 * time.Millisecond)
			n += killNode(t, e, 1)
			time.Sleep(pastTTL)
			return n
		},
		heal: func(t *testing.T, e *linkEnv) {
			// Checked: a node that did not come back would leave the
			// row's "restart empty" untested.
			restartNode(t, e, 0)
			restartNode(t, e, 1)
			time.Sleep(500 * time.Millisecond)
		},
		expect: expect{progress: true, blocked: -1},
	},
	{
		// Restart quarantine: a lock held on exactly a majority (nodes
		// 0–2) loses node 0 to an empty restart while it is valid, so
		// nodes 0, 3 and 4 form a majority that never saw it; a client
		// of the other instance contends for it at once. Then node 1 is
		// restarted empty too, 300 ms later, under load. Each restarted
		// node must stay out of quorums for max TTL + drift (max TTL 3 s
		// here, so the row ends in seconds) and get its fence counters
		// back from a majority before it votes; the three others keep
		// granting meanwhile.
		name:  "restart-2-nodes-empty-while-held",
		links: true,
		inject: func(t *testing.T, e *linkEnv, notes *rowNotes) int {
			return restartWhileHeld(t, e, notes)
		},
		heal: func(t *testing.T, e *linkEnv) {
			if _, err := waitNodeStates(e.env, map[int]string{0: "ok", 1: "ok"}, 5*time.Second); err != nil {
				t.Errorf("restarted nodes not back after the quarantine: %v", err)
			}
		},
		environ: []string{fmt.Sprintf("LOCKPROXY_LOCKS_MAX_TTL=%dms", quarantineMaxTTL.Milliseconds()),
			fmt.Sprintf("LOCKPROXY_LOCKS_DEFAULT_TTL=%dms", ttlMS)},
		expect: expect{progress: true, blocked: -1},
	},
	{
		name:   "sigstop-node-past-ttl",
		tokens: true,
		inject: func(t *testing.T, e *linkEnv, _ *rowNotes) int {
			n := pauseNode(t, e, 2)
			time.Sleep(3 * time.Second)
			return n
		},
		heal: func(t *testing.T, e *linkEnv) {
			e.nodes[2].Resume()
			time.Sleep(500 * time.Millisecond)
		},
		expect: expect{progress: true, blocked: -1},
	},
	{
		// Killed with LOCK/RLOCKs in flight (killInFlight; required by
		// killCaughtCheck, which also requires its clients to reconnect
		// and go on after the restart).
		name: "kill-lockproxy-restart",
		inject: func(t *testing.T, e *linkEnv, _ *rowNotes) int {
			n := killInFlight(t, e, 1)
			// Down past the TTL: the locks it granted run out and the
			// clients of the other instance get them, within a second
			// of the lease ends their refusals told (no release is
			// announced by a dead instance): the window must hold those
			// grants, since it ends where the heal begins (one CI run
			// counted none past its first 200 ms in pastTTL alone).
			time.Sleep(pastTTL + time.Second)
			return n
		},
		heal: func(t *testing.T, e *linkEnv) {
			e.proxies[1].restart()
			e.flight.restart(1, e.hist.Now())
			time.Sleep(500 * time.Millisecond)
		},
		after: func(t *testing.T, e *linkEnv, notes *rowNotes) {
			killCaughtCheck(t, e, 1, notes)
		},
		expect: expect{progress: true, blocked: 1},
	},
	{
		name: "clients-vanish-holding",
		inject: func(t *testing.T, e *linkEnv, _ *rowNotes) int {
			const vanish = 4
			e.vanish.Store(vanish)
			n := keepaliveVanish(t, e.env, 3)
			for end := time.Now().Add(10 * time.Second); e.vanish.Load() > 0 && time.Now().Before(end); {
				time.Sleep(10 * time.Millisecond)
			}
			left := int(max(e.vanish.Swap(0), 0))
			if left > 0 {
				t.Errorf("only %d of %d workload clients vanished holding within 10 s", vanish-left, vanish)
			}
			// Part of the fault, not its heal: the vanished clients'
			// locks run out under load, their keys' waiters held up
			// meanwhile (the row's fault window ends where the heal
			// begins).
			time.Sleep(pastTTL)
			return n + vanish - left
		},
		heal:   func(*testing.T, *linkEnv) {},
		expect: expect{progress: true, blocked: -1},
	},
}

// restartWhileHeld is the restart row's schedule. Instance 0 takes a lock
// of quarantineMaxTTL while its links to nodes 3 and 4 drop everything, so
// exactly nodes 0–2 hold it (read on the nodes; the set-up is tried again
// otherwise). Node 0 is restarted empty at once: nodes 0, 3 and 4 are a
// majority that does not know the lock, and only the restart quarantine
// (and its guard for a restart seen mid-batch) keeps them from granting it
// again. A client of instance 1 contends for the key meanwhile; the holder
// keeps it for 90 % of its validity and then writes to the ledger. Node 1
// is restarted empty 300 ms after node 0. It returns the faults applied:
// the two links dropped and the two restarts.
func restartWhileHeld(t *testing.T, e *linkEnv, notes *rowNotes) int {
	t.Helper()
	const key = "restart-held"
	holder := newClient(e.proxies[0].addr)
	defer func() { _ = holder.Close() }()
	events := 0
	var r lockclient.Grant
	var enter time.Duration
	var on []int
	for attempt := 0; attempt < 3 && len(on) != 3; attempt++ {
		events += e.on([]int{0}, []int{3, 4}, (*faultproxy.Proxy).Blackhole)
		var ok bool
		var err error
		r, ok, err = setupLock(t, holder, key, "PX", quarantineMaxTTL.Milliseconds(), "WAIT", waitMS)
		enter = e.hist.Now()
		// lockproxy answers once 3 nodes granted; its attempts on nodes
		// 3 and 4 are still pending until the node timeout (5 % of the
		// TTL) and would be sent again on the links' new connections
		// if they healed at once.
		time.Sleep(blackholeAfterGrant)
		e.on([]int{0}, []int{3, 4}, (*faultproxy.Proxy).PassThrough)
		if err != nil || !ok {
			t.Errorf("LOCK %s PX %d with nodes 3 and 4 cut off from instance 0 = %v, %v; want a grant from nodes 0-2",
				key, quarantineMaxTTL.Milliseconds(), ok, err)
			return events
		}
		on = nodesWith(t, e.env, key, r.Token)
		if len(on) != 3 {
			t.Logf("set-up %d: the lock landed on nodes %v, not exactly 0-2; trying again", attempt, on)
			hg := Grant{Key: key, Token: r.Token, Fence: r.Fence, Client: "p0.restart-holder", Enter: enter,
				Deadline: enter + time.Duration(r.ValidityMS)*time.Millisecond, Exit: e.hist.Now(),
				TTL: quarantineMaxTTL, Validity: time.Duration(r.ValidityMS) * time.Millisecond}
			e.hist.Add(hg)
			_ = holder.Do(lockclient.CtxFor(t, 5*time.Second), "UNLOCK", key, r.Token).Err()
		}
	}
	if len(on) != 3 {
		t.Errorf("no lock held on exactly nodes 0-2 in three set-ups (last on %v): the row proves nothing", on)
		return events
	}
	hg := Grant{Key: key, Token: r.Token, Fence: r.Fence, Client: "p0.restart-holder", Enter: enter,
		Deadline: enter + time.Duration(r.ValidityMS)*time.Millisecond,
		TTL:      quarantineMaxTTL, Validity: time.Duration(r.ValidityMS) * time.Millisecond}
	hg.Read = e.ledger.Read(key, hg.Fence)

	restarted := time.Now()
	held := lockKeys(t, e.nodes[0])
	events += restartNode(t, e, 0)
	left := nodesWith(t, e.env, key, r.Token)
	restartAt := e.hist.Now()

	// The contender: instance 1, for the same key, while the hold is
	// valid. It tries again on NOQUORUM (quarantined nodes) until past
	// the hold's lease.
	type result struct {
		g   Grant
		ok  bool
		err error
	}
	got := make(chan result, 1)
	go func() {
		cl := newClient(e.proxies[1].addr)
		defer func() { _ = cl.Close() }()
		var res result
		for end := time.Now().Add(2 * quarantineMaxTTL); ; {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			wr, ok, err := lockclient.TryLock(ctx, cl, key, "PX", ttlMS, "WAIT", 2*quarantineMaxTTL.Milliseconds())
			cancel()
			res = result{ok: ok, err: err, g: Grant{Key: key, Token: wr.Token, Fence: wr.Fence,
				Client: "p1.restart-contender", Enter: e.hist.Now()}}
			if ok || !lockclient.IsNoQuorum(err) || time.Now().After(end) {
				if ok {
					res.g.Deadline = res.g.Enter + time.Duration(wr.ValidityMS)*time.Millisecond
					res.g.TTL, res.g.Validity = ttlMS*time.Millisecond, time.Duration(wr.ValidityMS)*time.Millisecond
					e.critical(key, &res.g)
					res.g.Exit = e.hist.Now()
					_ = cl.Do(lockclient.CtxFor(t, 5*time.Second), "UNLOCK", key, wr.Token).Err()
				}
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		got <- res
	}()

	time.Sleep(300 * time.Millisecond)
	held += lockKeys(t, e.nodes[1])
	events += restartNode(t, e, 1)
	// Both instances must have noticed (the workload would pass on luck
	// otherwise: few grants happen to need a restarted node).
	if d, err := waitNodeStates(e.env, map[int]string{0: "quarantined", 1: "quarantined"}, 2*time.Second); err != nil {
		t.Errorf("restarted nodes not quarantined: %v", err)
	} else {
		notes.add("nodes 0 and 1 held %d lock keys when they were restarted empty; both instances showed them quarantined %v after the second restart",
			held, d.Round(time.Millisecond))
	}

	// The holder keeps the lock for 90 % of its validity, then writes.
	if d := hg.Enter + (hg.Deadline-hg.Enter)*9/10 - e.hist.Now(); d > 0 {
		time.Sleep(d)
	}
	hg.Use = e.hist.Now()
	hg.Rejected = !e.ledger.Write(key, hg.Fence, hg.Read+1)
	hg.Exit = e.hist.Now()
	e.hist.Add(hg)
	_ = holder.Do(lockclient.CtxFor(t, 5*time.Second), "UNLOCK", key, r.Token).Err()

	var res result
	select {
	case res = <-got:
	case <-time.After(20 * time.Second):
		t.Fatalf("the contender on instance 1 never answered")
	}
	switch {
	case res.err != nil || !res.ok:
		t.Errorf("contender on p1: LOCK %s = %v, %v; want a grant once the holder let go", key, res.ok, res.err)
	default:
		e.hist.Add(res.g)
		if res.g.Enter < hg.Exit {
			t.Errorf("contender on p1 got %s %v after node 0 (one of the 3 nodes holding it) restarted empty, while the holder still held it (validity left %v)",
				key, (res.g.Enter - restartAt).Round(time.Millisecond), (hg.Deadline - res.g.Enter).Round(time.Millisecond))
		}
		notes.add("lock held on nodes %v (valid %d ms), on %v after node 0 restarted empty; the contender on p1 got it %v after the restart, %v after the holder let go",
			on, r.ValidityMS, left, (res.g.Enter - restartAt).Round(time.Millisecond), (res.g.Enter - hg.Exit).Round(time.Millisecond))
	}

	if d := quarantineMaxTTL + 500*time.Millisecond - time.Since(restarted); d > 0 {
		time.Sleep(d)
	}
	return events
}

// blackholeAfterGrant is how long the restart row keeps instance 0's
// links to nodes 3 and 4 dropping after its hold was granted: past the
// node timeout of the hold's attempts (5 % of quarantineMaxTTL, 150 ms).
const blackholeAfterGrant = 400 * time.Millisecond

// nodesWith lists the nodes whose lock on key holds token, read directly
// (not through any link).
func nodesWith(t *testing.T, e *env, key, token string) []int {
	t.Helper()
	var on []int
	for i, node := range e.nodes {
		if v, err := node.Client(t).Get(lockclient.CtxFor(t, time.Second), "lockproxy:lock:"+key).Result(); err == nil && v == token {
			on = append(on, i)
		}
	}
	return on
}

// keepaliveVanish runs rounds of: a client holds a KEEPALIVE lock through
// one instance, another waits for it through the other, the holder closes
// its connection without UNLOCK; the waiter must get the lock within
// 500 ms. It records both grants and returns the rounds done.
func keepaliveVanish(t *testing.T, e *env, rounds int) int {
	t.Helper()
	const key = "keepalive"
	var slowest time.Duration
	defer func() {
		t.Logf("KEEPALIVE holders closed; waiters on the other instance got the lock at most %v later", slowest)
	}()
	for round := range rounds {
		holder := newClient(e.proxies[0].addr)
		r, ok, err := setupLock(t, holder, key, "KEEPALIVE")
		enter := e.hist.Now()
		if err != nil || !ok {
			_ = holder.Close()
			t.Errorf("round %d: LOCK %s KEEPALIVE = %v, %v; want a grant", round, key, ok, err)
			return round
		}
		hg := Grant{Key: key, Token: r.Token, Fence: r.Fence, Client: "keepalive-holder",
			Enter: enter, Deadline: enter + time.Duration(r.ValidityMS)*time.Millisecond,
			TTL: proxyDefaultTTL, Validity: time.Duration(r.ValidityMS) * time.Millisecond}
		e.critical(key, &hg)

		type result struct {
			r     lockclient.Grant
			ok    bool
			err   error
			enter time.Duration
		}
		waiter := newClient(e.proxies[len(e.proxies)-1].addr)
		got := make(chan result, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r, ok, err := lockclient.TryLock(ctx, waiter, key, "PX", ttlMS, "WAIT", waitMS)
			got <- result{r, ok, err, e.hist.Now()}
		}()
		time.Sleep(200 * time.Millisecond) // the waiter is queued
		hg.Exit = e.hist.Now()
		e.hist.Add(hg)
		_ = holder.Close()

		var res result
		select {
		case res = <-got:
		case <-time.After(15 * time.Second):
			t.Fatalf("round %d: the waiter never answered", round)
		}
		if res.err != nil || !res.ok {
			_ = waiter.Close()
			t.Errorf("round %d: waiting LOCK %s = %v, %v; want a grant after the holder closed", round, key, res.ok, res.err)
			return round
		}
		d := res.enter - hg.Exit
		if d > 500*time.Millisecond {
			t.Errorf("round %d: the waiter got %s %v after the KEEPALIVE holder closed; want ≤ 500ms", round, key, d)
		}
		slowest = max(slowest, d)
		wg := Grant{Key: key, Token: res.r.Token, Fence: res.r.Fence, Client: "keepalive-waiter",
			Enter: res.enter, Deadline: res.enter + time.Duration(res.r.ValidityMS)*time.Millisecond,
			TTL: ttlMS * time.Millisecond, Validity: time.Duration(res.r.ValidityMS) * time.Millisecond}
		e.critical(key, &wg)
		wg.Exit = e.hist.Now()
		e.hist.Add(wg)
		if err := waiter.Do(lockclient.CtxFor(t, 5*time.Second), "UNLOCK", key, res.r.Token).Err(); err != nil {
			t.Errorf("round %d: UNLOCK: %v", round, err)
		}
		_ = waiter.Close()
	}
	return rounds
}

// TestFaults runs the workload under each fault and judges the row.
func TestFaults(t *testing.T) {
	harness.RequireBinary(t, "redis-server", "redis-server")
	harness.BuildLockproxy(t)
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) { runRow(t, f) })
	}
}

// runRow runs the workload on its own nodes and instances under fault f
// (two rows at a time, see rowSlot) and judges the row.
func runRow(t *testing.T, f fault) {
	rowSlot(t)
	clients, grants, cycles, limit := rowSize()
	var e *linkEnv
	if f.links {
		e = newLinkEnv(t, 5, 2, f.environ...)
	} else {
		e = &linkEnv{env: newEnv(t, 5, 2, f.environ...)}
	}
	res := watchResources(t, e.proxies)
	w := workload{clients: clients, grants: grants, keys: rowKeys, limit: limit, tokens: f.tokens || soak(), readers: true}
	healed := make(chan struct{})
	start := time.Now()
	c, wait := w.run(t, e.env, healed)

	// Under load before the fault. Soak runs repeat the fault,
	// a second apart, until the clients made their grants.
	time.Sleep(300 * time.Millisecond)
	notes := &rowNotes{}
	holds, holdsDuring := longHoldsDuring(f.expect)
	var holdsDone func() string
	var windows []faultWindow
	events, attemptsDuring := 0, int64(0)
	for cycle := 0; anotherCycle(cycle, cycles, c.grants.Load(), int64(clients*grants), start, limit); cycle++ {
		if cycle > 0 {
			time.Sleep(time.Second)
		}
		notes.cycle = cycle
		from, sent := e.hist.Now(), c.attempts()
		if cycle == 0 && holds && holdsDuring {
			holdsDone = startLongHolds(t, e.env, rowLongHolds, "during the fault")
		}
		events += f.inject(t, e, notes)
		// The window ends where the heal begins: a heal restarts or
		// resumes what was down and then waits, under load, and grants
		// made then would meet the availability criterion for a row
		// whose fault stopped every grant while it was on.
		windows = append(windows, faultWindow{from, e.hist.Now()})
		f.heal(t, e)
		attemptsDuring += c.attempts() - sent
	}
	if holds && !holdsDuring {
		holdsDone = startLongHolds(t, e.env, rowLongHolds, "after the heal")
	}
	close(healed)
	wait()
	if holdsDone != nil {
		notes.add("%s", holdsDone())
	}
	if f.after != nil {
		f.after(t, e, notes)
	}
	run := rowRun{name: f.name, clients: clients, grants: grants, windows: windows, events: events,
		attemptsDuring: attemptsDuring, c: c, took: time.Since(start), res: res.finish(t), notes: notes.String()}
	judge(t, e.env, run, f.expect)
}
