//go:build linux

package suite

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/fault"
	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// ProxyKillRepeated is one backend's setting of RunProxyKilledRepeatedly:
// two running lockproxies on one lock store, a way to start A again on its
// addresses, the leases used and how soon a key held through a killed A
// must be granted to another client.
type ProxyKillRepeated struct {
	// Backend names the lock store in the summary line.
	Backend string
	// Client is the backend package's lock-client waits.
	Client lockclient.Config
	// A is the instance SIGKILLed and restarted, B the one left running.
	A, B         string
	ProcA, ProcB *harness.Proc
	// RestartA starts A again on the same addresses and store (root,
	// table prefix) and returns its process once it listens.
	RestartA func() *harness.Proc

	// TTLMS is the workload's PX, WaitMS its WAIT.
	TTLMS, WaitMS int

	// RivalBound: a key a client of A held when A was killed must be
	// granted to another client within this of the kill; BoundNote says
	// what it comes from, for the messages.
	RivalBound time.Duration
	BoundNote  string
}

// The repeated-kill row's size and schedule.
const (
	// repeatKills is how many times A is SIGKILLed and restarted.
	repeatKills = 5
	// repeatPerInst clients on each instance over repeatKeys keys: on
	// each, clients 0 and 1 hold to 50–90 % of their validity, 2 and 3 for
	// up to 2 ms; 1 and 3 add KEEPALIVE.
	repeatPerInst = 4
	repeatKeys    = 5
	// Each kill comes a random time in [repeatGapMin, repeatGapMax) after
	// A's previous incarnation listens.
	repeatGapMin = 1500 * time.Millisecond
	repeatGapMax = 4000 * time.Millisecond
	// repeatHolderWait: at that point, if no client of A holds a lock,
	// the kill waits up to this for one to (and comes anyway after it).
	repeatHolderWait = 3 * time.Second
	// After the last kill the row waits, up to repeatAfterLimit, for
	// repeatMinAfter grants, repeatMinAfterEach of them through each
	// instance; fewer fail it (progress stopped).
	repeatMinAfter     = 20
	repeatMinAfterEach = 3
	repeatAfterLimit   = 20 * time.Second
	// repeatWarmGrants is how many grants each instance makes before the
	// first kill (within repeatWarmLimit).
	repeatWarmGrants = 10
	repeatWarmLimit  = 20 * time.Second
)

// killRecord is one kill of A.
type killRecord struct {
	pid int
	// at is the kill (once the signal was sent) on the history's clock;
	// up is when A's next incarnation listened.
	at, up time.Duration
}

// RunProxyKilledRepeatedly is the fault matrix's "lockproxy kill -9,
// repeated" row, judged by test/fault's checker: clients of instances A
// and B loop LOCK … PX … WAIT (half of them with KEEPALIVE, half holding
// to 50–90 % of the validity they were told) → fenced-ledger
// read-modify-write → UNLOCK over a few keys, while A is SIGKILLed (by
// PID, reaped) and started again on the same addresses, repeatKills
// times. Each kill comes at a random point, once a client of A holds a
// lock (waiting up to repeatHolderWait for one), so most kills leave locks
// held and grants and waits in flight; A then stays down for a random
// part of one TTL. A's clients go on through each new incarnation: one
// that held a lock at the kill releases it by token through the next
// incarnation if that is up when it lets go; otherwise the lock ends with
// the store's lease or session. The history must show no overlap within
// validity, fences increasing, no live write rejected and no lost update;
// a key A's clients held at a kill must go to another client within
// p.RivalBound; and after the last kill both instances must grant again
// (at least repeatMinAfter grants), so the row cannot pass by granting
// nothing. One summary line logs the figures.
func RunProxyKilledRepeatedly(t testing.TB, p ProxyKillRepeated) {
	began := time.Now()
	hist, ledger := fault.NewHistory(), fault.NewLedger(true, false)
	w := startWorkload(t, p.Client, hist, ledger, workloadSpec{
		addrs: []string{p.A, p.B}, perInst: repeatPerInst, keys: repeatKeys, ttlMS: p.TTLMS, waitMS: p.WaitMS,
		keepalive: func(j int) bool { return j%2 == 1 },
		longHold:  func(j int) bool { return j < 2 },
	})
	defer w.halt()
	for end := time.Now().Add(repeatWarmLimit); w.grants[0].Load() < repeatWarmGrants || w.grants[1].Load() < repeatWarmGrants; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("workload: %d and %d grants after %v; want %d each (errors %d, %d: %v)", w.grants[0].Load(), w.grants[1].Load(),
				repeatWarmLimit, repeatWarmGrants, w.errs[0].Load(), w.errs[1].Load(), w.lastErr.Load())
		}
	}

	procs := []*harness.Proc{p.ProcA}
	var kills []killRecord
	cur := p.ProcA
	for i := range repeatKills {
		time.Sleep(repeatGapMin + rand.N(repeatGapMax-repeatGapMin))
		for end := time.Now().Add(repeatHolderWait); w.holding[0].Load() == 0 && time.Now().Before(end); time.Sleep(time.Millisecond) {
		}
		// Stamped once the signal is sent: a client that let go before
		// may have released its lock through A, one still holding cannot.
		k := killRecord{pid: cur.PID()}
		if err := cur.Signal(syscall.SIGKILL); err != nil {
			t.Fatalf("kill %d: SIGKILL instance A (pid %d): %v", i+1, k.pid, err)
		}
		k.at = hist.Now()
		cur.Kill() // its group too, and reaped
		if code, err := cur.Wait(10 * time.Second); code != -1 || err != nil {
			t.Errorf("kill %d: instance A (pid %d) after SIGKILL: exit %d, %v; want -1 (killed by a signal)", i+1, k.pid, code, err)
		}
		// Down for a random part of a lease: a holder that lets go
		// meanwhile cannot release its lock, which then ends with the
		// store's lease or session; one that lets go later releases it
		// through the next incarnation.
		time.Sleep(rand.N(time.Duration(p.TTLMS) * time.Millisecond))
		cur = p.RestartA()
		k.up = hist.Now()
		procs = append(procs, cur)
		kills = append(kills, k)
	}
	last := kills[len(kills)-1].at

	// Progress after the last kill, through both instances.
	after := func() (n int, by [2]int) {
		for _, g := range hist.Grants() {
			if g.Enter > last {
				n++
				if strings.HasPrefix(g.Client, "a.") {
					by[0]++
				} else {
					by[1]++
				}
			}
		}
		return n, by
	}
	for end := time.Now().Add(repeatAfterLimit); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if n, by := after(); n >= repeatMinAfter && by[0] >= repeatMinAfterEach && by[1] >= repeatMinAfterEach {
			break
		}
	}
	w.halt()
	nAfter, byAfter := after()
	if nAfter < repeatMinAfter || byAfter[0] < repeatMinAfterEach || byAfter[1] < repeatMinAfterEach {
		t.Errorf("progress stopped: %d grants after the last kill (%d through A, %d through B) within %v of the restart; want %d, at least %d through each",
			nAfter, byAfter[0], byAfter[1], repeatAfterLimit, repeatMinAfter, repeatMinAfterEach)
	}

	gs := hist.Grants()
	// Grants between kills (before the first, then from each kill to the
	// next or the end).
	per := make([]int, len(kills)+1)
	for _, g := range gs {
		i := 0
		for i < len(kills) && g.Enter > kills[i].at {
			i++
		}
		per[i]++
	}
	// For each kill, the keys A's clients held (entered, not yet exited)
	// and how soon another client got the first of them.
	var rivals, pids, downs, ats []string
	heldKills := 0
	for i, k := range kills {
		pids = append(pids, fmt.Sprint(k.pid))
		ats = append(ats, k.at.Round(time.Millisecond).String())
		downs = append(downs, (k.up - k.at).Round(time.Millisecond).String())
		// key → the grant A's client held at the kill.
		held := map[string]fault.Grant{}
		var holders []string
		for _, g := range gs {
			if strings.HasPrefix(g.Client, "a.") && g.Enter <= k.at && g.Exit > k.at {
				held[g.Key] = g
				holders = append(holders, g.Client)
			}
		}
		if len(held) == 0 {
			rivals = append(rivals, "none held")
			continue
		}
		heldKills++
		var first, firstHeld fault.Grant
		for _, g := range gs {
			if h, ok := held[g.Key]; ok && g.Enter > k.at && g.Token != h.Token && (first.Token == "" || g.Enter < first.Enter) {
				first, firstHeld = g, h
			}
		}
		if first.Token == "" {
			rivals = append(rivals, fmt.Sprintf("held by %s, none granted", strings.Join(holders, " ")))
			t.Errorf("kill %d: no client got any of the %d keys A's clients held after A died", i+1, len(held))
			continue
		}
		d := first.Enter - k.at
		rivals = append(rivals, fmt.Sprintf("held by %s: %v (%s; %v after its holder %s let go)", strings.Join(holders, " "),
			d.Round(time.Millisecond), first.Client, (first.Enter-firstHeld.Exit).Round(time.Millisecond), firstHeld.Client))
		if d > p.RivalBound {
			t.Errorf("kill %d: the first of the %d keys A's clients held went to another client %v after the kill (%s); want within %v (%s)",
				i+1, len(held), d, first, p.RivalBound, p.BoundNote)
		}
	}
	if heldKills == 0 {
		t.Errorf("A's clients held no lock at any of the %d kills: the row did not kill a holder", len(kills))
	}

	r := fault.Check(gs)
	acc, rej := ledger.Counts()
	t.Logf("%s, A killed %d times (at %s; pids %s; listening again after %s): %d grants in %v (before the first kill %d, after each kill %v; after the last %d: %d through A, %d through B); "+
		"first rival grant of a key A held, after each kill: %s (%s); %d overlaps, %d fence regressions, %d live writes rejected, %d lost updates, %d late uses; "+
		"ledger %d accepted, %d rejected; workload errors %d on A, %d on B (last %v)",
		p.Backend, len(kills), strings.Join(ats, ", "), strings.Join(pids, ", "), strings.Join(downs, ", "), r.Grants, time.Since(began).Round(time.Millisecond), per[0], per[1:],
		nAfter, byAfter[0], byAfter[1], strings.Join(rivals, "; "), p.BoundNote,
		r.OverlapCount, r.FenceRegressionCount, r.RejectedLiveCount, ledger.LostTotal(), r.LateUseCount,
		acc, rej, w.errs[0].Load(), w.errs[1].Load(), w.lastErr.Load())
	if r.Violations() > 0 {
		t.Errorf("history check: %v", r)
	}
	if lost := ledger.LostTotal(); lost != 0 {
		t.Errorf("lost acknowledged updates: %v", ledger.Lost())
	}
	for _, pr := range append(procs, p.ProcB) {
		out := pr.Output()
		for _, bad := range []string{"panic:", "fatal error:", "DATA RACE"} {
			if strings.Contains(out, bad) {
				t.Errorf("lockproxy (pid %d) output contains %q:\n%s", pr.PID(), bad, out)
			}
		}
	}
}
