package fault

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
	v := e.ledger.Read(key)
	g.Read = v
	time.Sleep(rand.N(maxSleep + 1))
	g.Use = e.hist.Now()
	g.Rejected = !e.ledger.Write(key, g.Fence, v+1)
}

// counts are a workload's outcomes.
type counts struct {
	grants, nils, noQuorum, errs, unlockZero, unlockErrs, vanished atomic.Int64
	lastErr                                                        atomic.Value // string
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
		p := e.proxies[i%len(e.proxies)]
		name := fmt.Sprintf("p%d.c%d", i%len(e.proxies), i)
		wg.Go(func() {
			n := e.client(name, p.addr, w, healed, stop, deadline, c)
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
func (e *env) client(name, addr string, w workload, healed, stop <-chan struct{}, deadline time.Time, c *counts) int {
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
		r, ok, err := lockclient.TryLock(ctx, cl, key, "PX", ttlMS, "WAIT", waitMS)
		cancel()
		enter := e.hist.Now()
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
		g := Grant{Key: key, Token: r.Token, Fence: r.Fence, Client: name,
			Enter: enter, Deadline: enter + time.Duration(r.ValidityMS)*time.Millisecond}
		e.critical(key, &g)
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
		released, err := cl.Do(ctx, "UNLOCK", key, r.Token).Int64()
		cancel()
		switch {
		case err != nil:
			c.unlockErrs.Add(1)
		case released == 0:
			c.unlockZero.Add(1)
		}
	}
	return n
}

// ---------------------------------------------------------------------------
// Faults

// fault is a named, reusable fault: inject starts it (and may run a
// schedule, such as kill, wait, kill again) and returns how many fault
// events it caused; heal ends it.
type fault struct {
	name   string
	inject func(t *testing.T, e *env) int
	heal   func(t *testing.T, e *env)
	// environ for the lockproxy instances.
	environ []string
	expect  expect
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
		inject: func(*testing.T, *env) int { time.Sleep(500 * time.Millisecond); return 0 },
		heal:   func(*testing.T, *env) {},
		expect: expect{progress: true, blocked: -1, clean: true},
	},
	{
		name: "kill-2-nodes-restart-empty-past-ttl",
		inject: func(t *testing.T, e *env) int {
			e.nodes[0].Kill()
			time.Sleep(500 * time.Millisecond)
			e.nodes[1].Kill()
			time.Sleep(pastTTL)
			return 2
		},
		heal: func(t *testing.T, e *env) {
			e.nodes[0].Restart()
			e.nodes[1].Restart()
			time.Sleep(500 * time.Millisecond)
		},
		expect: expect{progress: true, blocked: -1},
	},
	{
		// Restart quarantine under load: two nodes are killed and
		// restarted empty at once, 300 ms apart, while the clients hold
		// locks on them. Each must stay out of quorums for max TTL +
		// drift (max TTL 3 s here, so the row ends in seconds) and get
		// its fence counters back from a majority before it votes; the
		// three others keep granting meanwhile.
		name: "restart-2-nodes-empty-while-held",
		inject: func(t *testing.T, e *env) int {
			restarted := time.Now()
			held := lockKeys(t, e.nodes[0])
			e.nodes[0].Restart()
			time.Sleep(300 * time.Millisecond)
			held += lockKeys(t, e.nodes[1])
			e.nodes[1].Restart()
			// Both instances must have noticed (the row would pass on
			// luck otherwise: few grants happen to need a restarted node).
			if d, err := waitNodeStates(e, map[int]string{0: "quarantined", 1: "quarantined"}, 2*time.Second); err != nil {
				t.Errorf("restarted nodes not quarantined: %v", err)
			} else {
				t.Logf("nodes 0 and 1 held %d lock keys when they were restarted empty; both instances showed them quarantined %v after the second restart",
					held, d.Round(time.Millisecond))
			}
			if d := quarantineMaxTTL + 500*time.Millisecond - time.Since(restarted); d > 0 {
				time.Sleep(d)
			}
			return 2
		},
		heal: func(t *testing.T, e *env) {
			if _, err := waitNodeStates(e, map[int]string{0: "ok", 1: "ok"}, 5*time.Second); err != nil {
				t.Errorf("restarted nodes not back after the quarantine: %v", err)
			}
		},
		environ: []string{fmt.Sprintf("LOCKPROXY_LOCKS_MAX_TTL=%dms", quarantineMaxTTL.Milliseconds()),
			fmt.Sprintf("LOCKPROXY_LOCKS_DEFAULT_TTL=%dms", ttlMS)},
		expect: expect{progress: true, blocked: -1},
	},
	{
		name: "sigstop-node-past-ttl",
		inject: func(t *testing.T, e *env) int {
			e.nodes[2].Pause()
			time.Sleep(3 * time.Second)
			return 1
		},
		heal: func(t *testing.T, e *env) {
			e.nodes[2].Resume()
			time.Sleep(500 * time.Millisecond)
		},
		expect: expect{progress: true, blocked: -1},
	},
	{
		name: "kill-lockproxy-restart",
		inject: func(t *testing.T, e *env) int {
			e.proxies[1].kill()
			// Down past the TTL: the locks it granted run out and the
			// clients of the other instance get them.
			time.Sleep(pastTTL)
			return 1
		},
		heal: func(t *testing.T, e *env) {
			e.proxies[1].restart()
			time.Sleep(500 * time.Millisecond)
		},
		expect: expect{progress: true, blocked: 1},
	},
	{
		name: "clients-vanish-holding",
		inject: func(t *testing.T, e *env) int {
			const vanish = 4
			e.vanish.Store(vanish)
			n := keepaliveVanish(t, e, 3)
			for end := time.Now().Add(10 * time.Second); e.vanish.Load() > 0 && time.Now().Before(end); {
				time.Sleep(10 * time.Millisecond)
			}
			return n + vanish - int(max(e.vanish.Load(), 0))
		},
		heal: func(t *testing.T, e *env) {
			e.vanish.Store(0)
			time.Sleep(pastTTL) // the vanished clients' locks run out under load
		},
		expect: expect{progress: true, blocked: -1},
	},
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
			Enter: enter, Deadline: enter + time.Duration(r.ValidityMS)*time.Millisecond}
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
			Enter: res.enter, Deadline: res.enter + time.Duration(res.r.ValidityMS)*time.Millisecond}
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
		t.Run(f.name, func(t *testing.T) {
			rowSlot(t)
			clients, grants, cycles, limit := rowSize()
			e := newEnv(t, 5, 2, f.environ...)
			res := watchResources(t, e.proxies)
			w := workload{clients: clients, grants: grants, keys: rowKeys, limit: limit}
			healed := make(chan struct{})
			start := time.Now()
			c, wait := w.run(t, e, healed)

			// Under load before the fault. Soak runs repeat the fault,
			// a second apart, until the clients made their grants.
			time.Sleep(300 * time.Millisecond)
			var windows []faultWindow
			events, attemptsDuring := 0, int64(0)
			for cycle := 0; anotherCycle(cycle, cycles, c.grants.Load(), int64(clients*grants), start, limit); cycle++ {
				if cycle > 0 {
					time.Sleep(time.Second)
				}
				from, sent := e.hist.Now(), c.attempts()
				events += f.inject(t, e)
				f.heal(t, e)
				windows = append(windows, faultWindow{from, e.hist.Now()})
				attemptsDuring += c.attempts() - sent
			}
			close(healed)
			wait()
			run := rowRun{name: f.name, clients: clients, grants: grants, windows: windows, events: events,
				attemptsDuring: attemptsDuring, c: c, took: time.Since(start), res: res.finish(t)}
			judge(t, e, run, f.expect)
		})
	}
}
