package fault

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/faultproxy"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// The renewal deadline: a RENEW that cannot reach a majority in time must
// end the lease, not extend it, and say so before the lease the holder
// still has runs out. The holder then stops; nobody else may get the lock
// while it still believed it held.

// renewCutRow is the network row that checks it.
var renewCutRow = linkRow{
	name: "renew-cut-off-from-majority",
	fault: func(t *testing.T, e *linkEnv, notes *rowNotes) int {
		return renewCutOff(t, e, notes)
	},
	// No workload progress is required in the windows: the cut-off
	// instance's clients that were in their sections at the cut cannot
	// UNLOCK, their keys stay held for a lease (2 s), longer than each
	// window, and the other instance's workload clients, each waiting on
	// a random key, end up waiting on those (a CI run: 52 grants through
	// p0 in each window's first 200 ms, none after). That instance's
	// grant while the holder is cut off is the round's waiter's, which
	// renewCutOff requires (the waiter gets the lock once the holder was
	// told, about 1.9 s after the cut).
	expect: expect{progress: false, blocked: 1},
	after: func(t *testing.T, e *linkEnv, windows []faultWindow, gs []Grant) {
		noGrantsWhileCut(t, 1, windows, gs)
	},
}

// renewCutOff runs one round per way of missing the majority: instance 1's
// links to nodes 0–2 blackholed, then 400 ms slow (four times the 100 ms
// node timeout of a 2 s lease). Each round: a client of instance 1 takes
// the lock and renews it twice with RENEW; a client of instance 0 queues
// for it; the links fail; the holder's next RENEW must answer 0,
// -NOQUORUM or -LOCKLOST before the holder's lease ends, and the holder
// stops at that answer. The waiter must get the lock, and not before the
// holder was told. Both grants go into the history. It records the
// rounds' fault windows in notes (the links are healed between rounds).
func renewCutOff(t *testing.T, e *linkEnv, notes *rowNotes) int {
	t.Helper()
	const key = "renew-cut"
	modes := []struct {
		name  string
		apply func(*faultproxy.Proxy)
	}{
		{"blackholed", (*faultproxy.Proxy).Blackhole},
		{"400ms slow", func(p *faultproxy.Proxy) { p.SetLatency(400*time.Millisecond, 0) }},
	}
	holder := newClient(e.proxies[1].addr)
	defer func() { _ = holder.Close() }()
	events := 0
	for round, m := range modes {
		// A held and renewed lease to cut. On a busy host a healthy
		// RENEW can miss its quorum too (each node gets 100 ms); the
		// holder then treats the lease as over, lets go, and starts the
		// set-up again, up to three times.
		var r lockclient.Grant
		var hg Grant
		renewed := false
		for attempt := 0; attempt < 3 && !renewed; attempt++ {
			var ok bool
			var err error
			r, ok, err = setupLock(t, holder, key, "PX", ttlMS, "WAIT", waitMS)
			enter := e.hist.Now()
			if err != nil || !ok {
				t.Errorf("round %d (%s): holder LOCK %s = %v, %v; want a grant", round, m.name, key, ok, err)
				return events
			}
			hg = Grant{Key: key, Token: r.Token, Fence: r.Fence, Client: "renew-holder",
				Enter: enter, Deadline: enter + time.Duration(r.ValidityMS)*time.Millisecond,
				TTL: ttlMS * time.Millisecond, Validity: time.Duration(r.ValidityMS) * time.Millisecond}
			e.critical(key, &hg)
			// Renewed while the links are healthy: each renewal moves
			// the deadline the holder goes by.
			renewed = true
			for i := 0; i < 2 && renewed; i++ {
				time.Sleep(300 * time.Millisecond)
				// The lease the holder may count on runs from before it
				// asked: lockproxy counts it from when the RENEW reached
				// it, which is later.
				sent := e.hist.Now()
				v, err := holder.Do(lockclient.CtxFor(t, 5*time.Second), "RENEW", key, r.Token, "PX", ttlMS).Int64()
				at := e.hist.Now()
				if err != nil || v <= 0 {
					t.Logf("round %d (%s), set-up %d: healthy RENEW = %v, %v; the holder lets go and starts again", round, m.name, attempt, v, err)
					hg.Exit = at
					e.hist.Add(hg)
					_ = holder.Do(lockclient.CtxFor(t, 5*time.Second), "UNLOCK", key, r.Token).Err()
					renewed = false
					continue
				}
				hg.Deadline = sent + time.Duration(v)*time.Millisecond
			}
		}
		if !renewed {
			t.Errorf("round %d (%s): no healthy lease to cut in three set-ups", round, m.name)
			continue
		}

		type result struct {
			ok  bool
			err error
			g   Grant
		}
		got := make(chan result, 1)
		go func() {
			cl := newClient(e.proxies[0].addr)
			defer func() { _ = cl.Close() }()
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			r, ok, err := lockclient.TryLock(ctx, cl, key, "PX", ttlMS, "WAIT", 3*ttlMS)
			res := result{ok: ok, err: err, g: Grant{Key: key, Token: r.Token, Fence: r.Fence,
				Client: "renew-waiter", Enter: e.hist.Now()}}
			if ok {
				res.g.Deadline = res.g.Enter + time.Duration(r.ValidityMS)*time.Millisecond
				res.g.TTL, res.g.Validity = ttlMS*time.Millisecond, time.Duration(r.ValidityMS)*time.Millisecond
				e.critical(key, &res.g)
				res.g.Exit = e.hist.Now()
				_ = cl.Do(ctx, "UNLOCK", key, r.Token).Err()
			}
			got <- res
		}()
		time.Sleep(100 * time.Millisecond) // the waiter is queued

		from := e.hist.Now()
		events += e.on([]int{1}, []int{0, 1, 2}, m.apply)
		v, err := holder.Do(lockclient.CtxFor(t, 5*time.Second), "RENEW", key, r.Token, "PX", ttlMS).Int64()
		told := e.hist.Now()
		answer := "0"
		switch {
		case err == nil && v > 0:
			t.Errorf("round %d (%s): RENEW without a majority = %d; want 0, -NOQUORUM or -LOCKLOST", round, m.name, v)
			answer = "a renewal"
		case err != nil && !lockclient.IsNoQuorum(err) && !strings.HasPrefix(err.Error(), "LOCKLOST"):
			t.Errorf("round %d (%s): RENEW without a majority = %v; want 0, -NOQUORUM or -LOCKLOST", round, m.name, err)
			answer = err.Error()
		case err != nil:
			answer = strings.Fields(err.Error())[0]
		}
		if told > hg.Deadline {
			t.Errorf("round %d (%s): RENEW answered %v after the cut, %v after the holder's lease ended; want before",
				round, m.name, told-from, told-hg.Deadline)
		}
		// The holder stops at the answer.
		hg.Exit = told
		e.hist.Add(hg)

		var res result
		select {
		case res = <-got:
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d (%s): the waiter never answered", round, m.name)
		}
		to := e.hist.Now()
		e.on([]int{1}, []int{0, 1, 2}, (*faultproxy.Proxy).PassThrough)
		notes.windows = append(notes.windows, faultWindow{from, to})
		if res.err != nil || !res.ok {
			t.Errorf("round %d (%s): waiter on p0: LOCK %s = %v, %v; want a grant once the holder's lease ran out", round, m.name, key, res.ok, res.err)
			continue
		}
		e.hist.Add(res.g)
		if res.g.Enter < told {
			t.Errorf("round %d (%s): waiter granted %v after the cut, before the holder was told at %v", round, m.name, res.g.Enter-from, told-from)
		}
		notes.add("%s: RENEW answered %s %v after the cut, %v before the lease's end; the waiter on p0 got the lock %v after the cut",
			m.name, answer, (told - from).Round(time.Millisecond), (hg.Deadline - told).Round(time.Millisecond), (res.g.Enter - from).Round(time.Millisecond))
		time.Sleep(300 * time.Millisecond) // instance 1 reconnects
	}
	return events
}

// noGrantsWhileCut fails on any grant through the instance inside a fault
// window, but for cutGrace at its start (replies the nodes sent before the
// cut), and logs how many there were.
func noGrantsWhileCut(t *testing.T, instance int, windows []faultWindow, gs []Grant) {
	t.Helper()
	n, cut := 0, time.Duration(0)
	for _, w := range windows {
		cut += w.to - w.from
		for _, g := range gs {
			if !clientsOf(g, instance) || g.Enter <= w.from || g.Enter >= w.to {
				continue
			}
			n++
			if g.Enter > w.from+cutGrace {
				t.Errorf("instance p%d granted %v while cut off from the majority", instance, g)
			}
		}
	}
	t.Logf("instance p%d: %d grants in %v of cuts (any only within %v of a cut's start, from replies sent before it)",
		instance, n, cut.Round(time.Millisecond), cutGrace)
}
