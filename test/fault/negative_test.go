package fault

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// Negative controls: each check must fail on a history that breaks what it
// checks, or the passing fault runs prove nothing.

// Two lockproxy instances, each given a different single node, serve the
// same key: there is no quorum between them, so the overlap checker must
// find overlaps, also of reads: each instance has a reader among its five
// clients (see workload.run), whose read grants come while the other
// instance's four writers keep its own node's lock busy, and writes enter
// during reads: in four local runs 41–46 overlaps involved a read (of 40
// reads, 200 grants), so none in a run means a read check that does not
// look, not bad luck.
func TestNegativeQuorumBroken(t *testing.T) {
	harness.RequireBinary(t, "redis-server", "redis-server")
	nodes := harness.StartRedisN(t, 2, harness.RedisOptions{})
	e := &env{hist: NewHistory(), ledger: NewLedger(true, false), nodes: nodes}
	for _, n := range nodes {
		e.proxies = append(e.proxies, startProxy(t, []string{n.Addr}))
	}
	healed := make(chan struct{})
	close(healed)
	w := workload{clients: 10, grants: 20, keys: 1, limit: time.Minute, readers: true}
	c, wait := w.run(t, e, healed)
	wait()

	r := Check(e.hist.Grants())
	accepted, rejected := e.ledger.Counts()
	lin, ops := linearizable(e.hist.Grants(), linTimeout)
	reads := 0
	for _, g := range e.hist.Grants() {
		if g.Shared {
			reads++
		}
	}
	t.Logf("quorum broken: %d grants (%d reads), %d overlaps (%d with a read), %d fence regressions, %d stale writes rejected (%d accepted), %d lost updates, %d errors; porcupine: %s over %d operations",
		r.Grants, reads, r.OverlapCount, r.ReadOverlapCount, r.FenceRegressionCount, rejected, accepted, e.ledger.LostTotal(), c.errs.Load()+c.noQuorum.Load(), lin, ops)
	if r.OverlapCount == 0 {
		t.Errorf("two instances on disjoint single nodes: the checker found no overlap in %d grants; want > 0", r.Grants)
	}
	// Each instance numbers fences from its own node's counter, so they
	// interleave out of order (97 regressions in 200 grants in a run);
	// none means the fence check does not look.
	if r.FenceRegressionCount == 0 {
		t.Errorf("two instances on disjoint single nodes: the checker found no fence regression in %d grants; want > 0", r.Grants)
	}
	if r.ReadOverlapCount == 0 {
		t.Errorf("two instances on disjoint single nodes: the checker found no overlap with a read in %d grants (%d reads); want > 0", r.Grants, reads)
	}
	// Overlapping sections that both wrote lose an update unless the
	// ledger's fence check happened to refuse one of them.
	if lost := e.ledger.LostTotal(); lost > 0 && lin != porcupine.Illegal {
		t.Errorf("porcupine: %s with %d updates lost; want Illegal", lin, lost)
	}
	for _, p := range e.proxies {
		p.checkNoPanic(t)
	}
}

// A holder pauses past its validity (Kleppmann's GC pause) while another
// client takes the lock, then writes. The fenced ledger must reject the
// stale write; an unfenced ledger accepts it and loses the other client's
// update.
func TestNegativePausedHolder(t *testing.T) {
	harness.RequireBinary(t, "redis-server", "redis-server")
	const (
		rounds = 3
		// holdTTL is the paused holder's short lease.
		holdTTL = 500
	)
	e := newEnv(t, 5, 2)
	unfenced := NewLedger(false, true)
	fenced := e.ledger
	// The same grants as the unfenced ledger saw them, for porcupine.
	unfencedHist := NewHistory()
	holder := newClient(e.proxies[0].addr)
	defer holder.Close()
	other := newClient(e.proxies[1].addr)
	defer other.Close()

	for round := range rounds {
		key := fmt.Sprintf("paused-%d", round)
		r, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 10*time.Second), holder, key, "PX", holdTTL)
		// The short lease gives each node only a 25 ms timeout: on a busy
		// host a try can miss the quorum, which is not what this test is
		// about. Try again a few times.
		for try := 0; try < 5 && lockclient.IsNoQuorum(err); try++ {
			time.Sleep(50 * time.Millisecond)
			r, ok, err = lockclient.TryLock(lockclient.CtxFor(t, 10*time.Second), holder, key, "PX", holdTTL)
		}
		enter := e.hist.Now()
		if err != nil || !ok {
			t.Fatalf("round %d: LOCK %s PX %d = %v, %v; want a grant", round, key, holdTTL, ok, err)
		}
		a := Grant{Key: key, Token: r.Token, Fence: r.Fence, Client: "paused",
			Enter: enter, Deadline: enter + time.Duration(r.ValidityMS)*time.Millisecond}
		readF, readU := fenced.Read(key, a.Fence), unfenced.Read(key, a.Fence)

		// The other client waits for the lock and does its increment.
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r, ok, err := lockclient.TryLock(ctx, other, key, "PX", ttlMS, "WAIT", waitMS)
			enter := e.hist.Now()
			if err != nil || !ok {
				done <- fmt.Errorf("waiting LOCK %s = %v, %v; want a grant once the paused lease ran out", key, ok, err)
				return
			}
			b := Grant{Key: key, Token: r.Token, Fence: r.Fence, Client: "other",
				Enter: enter, Deadline: enter + time.Duration(r.ValidityMS)*time.Millisecond}
			vF, vU := fenced.Read(key, b.Fence), unfenced.Read(key, b.Fence)
			b.Use, b.Read = e.hist.Now(), vF
			b.Rejected = !fenced.Write(key, b.Fence, vF+1)
			unfenced.Write(key, b.Fence, vU+1)
			b.Exit = e.hist.Now()
			e.hist.Add(b)
			bu := b
			bu.Read, bu.Rejected = vU, false
			unfencedHist.Add(bu)
			done <- other.Do(ctx, "UNLOCK", key, r.Token).Err()
		}()

		// The holder "pauses" until the other client is done.
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("round %d: the other client never finished", round)
		}
		a.Use, a.Read = e.hist.Now(), readF
		a.Rejected = !fenced.Write(key, a.Fence, readF+1)
		unfenced.Write(key, a.Fence, readU+1)
		a.Exit = e.hist.Now()
		e.hist.Add(a)
		au := a
		au.Read, au.Rejected = readU, false
		unfencedHist.Add(au)
		released, err := holder.Do(lockclient.CtxFor(t, 5*time.Second), "UNLOCK", key, r.Token).Int64()
		if err != nil || released != 0 {
			t.Errorf("round %d: UNLOCK by the paused holder = %d, %v; want 0 (its lock ran out)", round, released, err)
		}
	}

	r := Check(e.hist.Grants())
	_, rejF := fenced.Counts()
	accU, rejU := unfenced.Counts()
	t.Logf("paused holder, %d rounds: fenced ledger rejected %d stale writes and lost %d updates; "+
		"unfenced ledger accepted %d of %d writes (rejected %d) and lost %d updates; checker: %d overlaps, %d late uses",
		rounds, rejF, fenced.LostTotal(), accU, 2*rounds, rejU, unfenced.LostTotal(), r.OverlapCount, r.LateUseCount)
	if rejF != rounds || fenced.LostTotal() != 0 {
		t.Errorf("fenced ledger: %d rejects, %d lost; want %d rejects, 0 lost", rejF, fenced.LostTotal(), rounds)
	}
	if rejU != 0 || unfenced.LostTotal() != rounds {
		t.Errorf("unfenced ledger: %d rejects, %d lost; want 0 rejects and %d lost (the stale writes were accepted)", rejU, unfenced.LostTotal(), rounds)
	}
	linF, _ := linearizable(e.hist.Grants(), linTimeout)
	linU, _ := linearizable(unfencedHist.Grants(), linTimeout)
	t.Logf("porcupine: fenced ledger history %s, unfenced %s", linF, linU)
	if linF != porcupine.Ok || linU != porcupine.Illegal {
		t.Errorf("porcupine: fenced %s, unfenced %s; want Ok and Illegal", linF, linU)
	}
	if r.LateUseCount != rounds || r.Violations() != 0 {
		t.Errorf("checker: %v; want %d late uses and no violation (lockproxy kept its promise; the holder did not)", r, rounds)
	}
}

// Synthetic histories in which validity is ignored — by a holder that acts
// past its deadline, or by a server that claims more validity than the
// lease had — must be reported, while the same histories with validity
// respected pass.
func TestNegativeValidityIgnored(t *testing.T) {
	tests := []struct {
		name          string
		grants        []Grant
		overlaps      int
		late          int
		honestVersion []Grant
	}{
		{
			name: "holder used the grant past its deadline",
			// Valid until 1980 ms, used until 2500 ms; the next holder
			// entered at 2100 ms, after the 2 s lease ran out.
			grants:        []Grant{g("k", 1, 0, 1980, 2500), g("k", 2, 2100, 1980, 2200)},
			late:          1,
			honestVersion: []Grant{g("k", 1, 0, 1980, 1970), g("k", 2, 2100, 1980, 2200)},
		},
		{
			name: "server claimed validity beyond the lease",
			// A 2 s lease reported as valid for 3 s (elapsed time and
			// drift not subtracted); the holder trusted it until 2500 ms.
			grants:        []Grant{g("k", 1, 0, 3000, 2500), g("k", 2, 2100, 1980, 2200)},
			overlaps:      1,
			honestVersion: []Grant{g("k", 1, 0, 1980, 1970), g("k", 2, 2100, 1980, 2200)},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := Check(tc.grants)
			t.Logf("%s: %d overlaps, %d late uses", tc.name, r.OverlapCount, r.LateUseCount)
			if r.OverlapCount != tc.overlaps || r.LateUseCount != tc.late {
				t.Errorf("Check = %v; want %d overlaps, %d late uses", r, tc.overlaps, tc.late)
			}
			if h := Check(tc.honestVersion); h.OverlapCount+h.LateUseCount+h.Violations() != 0 {
				t.Errorf("Check of the honest version = %v; want nothing", h)
			}
		})
	}
}

// The resource checks must fail when lockproxy does hold on to goroutines
// or memory: here 20 connections stay open (a goroutine each) and 8 more
// each send 10 MB of a bulk string they never finish (buffered as it
// arrives), which the row checks must report as a leak and as memory over
// the bound.
func TestNegativeResourceChecks(t *testing.T) {
	harness.RequireBinary(t, "redis-server", "redis-server")
	nodes := harness.StartRedisN(t, 3, harness.RedisOptions{})
	p := startProxy(t, harness.Addrs(nodes))
	w := watchResources(t, []*proxy{p})

	for i := range 20 {
		cl := newClient(p.addr)
		defer func() { _ = cl.Close() }()
		if err := cl.Do(lockclient.CtxFor(t, 5*time.Second), "PING").Err(); err != nil {
			t.Fatalf("client %d: PING: %v", i, err)
		}
	}
	const chunk = 1 << 20
	junk := strings.Repeat("x", chunk)
	for i := range 8 {
		c, err := dialRaw(p.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Close() }()
		_ = c.c.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.WriteString(c.c, "*1\r\n$100000000\r\n"); err != nil {
			t.Fatalf("conn %d: %v", i, err)
		}
		for range 10 {
			if _, err := io.WriteString(c.c, junk); err != nil {
				t.Fatalf("conn %d: %v", i, err)
			}
		}
	}
	// Let the sampler see the buffered bulk strings.
	time.Sleep(time.Second)

	r, problems := w.measure(2*time.Second, maxHeapInuse, maxRSS)
	t.Logf("with 28 connections open, 80 MB of unfinished bulk strings: %v; the checks reported %d problems", r, len(problems))
	var leak, mem bool
	for _, p := range problems {
		leak = leak || strings.Contains(p, "leak?")
		mem = mem || strings.Contains(p, "memory")
	}
	if !leak {
		t.Errorf("goroutine check passed with 28 connections open (%v → %v); want it to report a leak", r.base, r.after)
	}
	if !mem {
		t.Errorf("memory check passed with 80 MB buffered (max heap %.1f MiB, RSS %.1f MiB); want it to report the bound broken",
			r.maxHeap/(1<<20), r.maxRSS/(1<<20))
	}
	p.checkNoPanic(t)
}
