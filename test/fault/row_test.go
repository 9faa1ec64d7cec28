package fault

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// linTimeout bounds porcupine's search in a row (it is linear in practice:
// the critical sections of a key hardly overlap).
const linTimeout = 30 * time.Second

// A row's pass criteria, shared by TestFaults and TestLinkFaults. Every
// row must show, and judge checks each:
//   - size: at least clients × grants acknowledged grants (each client its
//     share, checked by the workload);
//   - validity: every grant's validity_ms as its reply told it is > 0 and
//     ≤ its TTL − drift (checkValidity). Check measures overlaps up to
//     Enter + validity, so a validity of 0 (or in the wrong unit) would
//     make a double grant look like a late use;
//   - safety: 0 overlaps within validity, fences strictly increasing per
//     key, no live write rejected, no acknowledged ledger update lost, and
//     the ledger history linearizable (porcupine, linearize_test.go); the
//     overlaps are judged with long holds in the row (longhold_test.go),
//     so a validity longer than the lease shows. Rows that break RedLock's
//     timing assumptions on purpose log overlaps and live writes rejected
//     (the fence refusing a holder whose lease lied, each one the symptom
//     of an overlap) but fail on the rest: fences must hold whatever the
//     timing;
//   - availability: with a majority up and reachable, grants during the
//     fault windows through every instance that is not down or cut off by
//     design;
//   - no panic, fatal error or data race in any lockproxy's output;
//   - no goroutine leak and bounded memory (resources_test.go).

// expect is what a row must show besides safety.
type expect struct {
	// progress: a majority stays up and reachable, so the clients of
	// every instance but blocked must get grants during the fault.
	progress bool
	// blocked is an instance that cannot grant during the fault by design
	// (down, or cut off from the majority), or -1.
	blocked int
	// unsafe: the row breaks RedLock's timing assumptions on purpose;
	// overlaps and live writes rejected are logged, not failed. Fence
	// regressions, lost updates and a non-linearizable ledger still fail
	// it: fencing is what protects the resource when timing fails.
	unsafe bool
	// clean: a row without faults: no NOQUORUM beyond a busy host's odd
	// timeout, no other error, and no UNLOCK answered 0 within the first
	// half of its grant's validity (the lock lost early).
	clean bool
}

// rowRun is what a row did.
type rowRun struct {
	name            string
	clients, grants int
	windows         []faultWindow
	events          int
	// attemptsDuring counts the workload's LOCKs answered from each
	// injection to its heal (a little wider than the windows): in rows
	// whose fault blocks grants by design it shows the clients kept
	// trying and were answered.
	attemptsDuring int64
	c              *counts
	took           time.Duration
	res            resourceReport
	notes          string
}

// judge checks a finished row's history and ledger against every
// criterion and logs one summary line (the README's numbers come from
// these lines).
func judge(t *testing.T, e *env, run rowRun, x expect) {
	t.Helper()
	gs := e.hist.Grants()
	r := Check(gs)
	accepted, rejected := e.ledger.Counts()
	lost := e.ledger.LostTotal()
	var faultTime time.Duration
	for _, w := range run.windows {
		faultTime += w.to - w.from
	}
	during, byProxy := grantsDuring(gs, run.windows)
	// Availability is judged on the grants that entered once the fault
	// had settled: those of a window's first cutGrace can come from
	// replies sent before the fault took effect (with 3 of 5 nodes
	// stopped, 14 grants entered the window that way, through both
	// instances). A row without faults has nothing to settle, and its
	// one short window is mostly spent with the workload's clients
	// queued behind the long holds.
	avail := run.windows
	if !x.clean {
		avail = settledWindows(avail)
	}
	settled, settledByProxy := grantsDuring(gs, avail)
	linStart := time.Now()
	lin, linOps := linearizable(gs, linTimeout)
	linTook := time.Since(linStart)
	minV, maxV := checkValidity(t, gs)
	c := run.c
	attempts := c.attempts()
	t.Logf("ROW %s: %d grants in %v (%d during %d fault windows of %v, by client %v, %d counted for availability (past each window's first %v in a row with faults); %d attempts from injection to heal); %d faults injected; "+
		"%d overlaps, %d fence regressions, %d live writes rejected, %d lost updates; "+
		"%d late uses, %d stale writes rejected (%d accepted); validity told %v–%v; %d attempts: %d nil, %d NOQUORUM, %d other errors; "+
		"%d UNLOCK 0 (%d in the first half of the validity), %d UNLOCK errors, %d vanished; porcupine: %s over %d ledger operations in %v; %v%s",
		run.name, r.Grants, run.took.Round(time.Millisecond), during, len(run.windows), faultTime.Round(time.Millisecond), byProxy, settled, cutGrace, run.attemptsDuring, run.events,
		r.OverlapCount, r.FenceRegressionCount, r.RejectedLiveCount, lost,
		r.LateUseCount, rejected, accepted, minV, maxV, attempts, c.nils.Load(), c.noQuorum.Load(), c.errs.Load(),
		c.unlockZero.Load(), c.unlockZeroEarly.Load(), c.unlockErrs.Load(), c.vanished.Load(), lin, linOps, linTook.Round(time.Millisecond),
		run.res, prefixed("; ", run.notes))

	if x.unsafe {
		if r.OverlapCount+r.LateUseCount == 0 {
			t.Logf("%s: assumption broken on purpose, but no overlap or late use showed up in this run (%d grants); nothing proven either way", run.name, r.Grants)
		} else {
			t.Logf("%s: EXPECTED — the checker found %d overlaps, %d late uses and %d live writes the fence refused with the assumption broken: %v",
				run.name, r.OverlapCount, r.LateUseCount, r.RejectedLiveCount, r)
		}
		// Fences must hold even when the leases lie.
		if r.FenceRegressionCount > 0 {
			t.Errorf("fencing broken with the timing assumption broken: %d fence regressions %v", r.FenceRegressionCount, r.FenceRegressions)
		}
	} else if r.Violations() > 0 {
		t.Errorf("history check: %v", r)
	}
	// Late uses (a holder still in its section past its validity when
	// another entered) fail no row, not even one whose timing assumptions
	// hold: the workload's sections are 2 ms of a ~1.97 s validity, but a
	// client descheduled for two seconds on a loaded shared host, or a
	// long holder (90 % of its validity) held up for 200 ms, makes one
	// with lockproxy doing everything right. What could hide an overlap
	// among them is a validity told wrong, which checkValidity fails.
	// They are logged in the row's line.
	if lost != 0 {
		t.Errorf("lost acknowledged updates: %v", e.ledger.Lost())
	}
	// Unknown (timed out) proves nothing either way and is only logged.
	if lin == porcupine.Illegal {
		t.Errorf("porcupine: the ledger history of %d operations is not linearizable", linOps)
	}
	if want := run.clients * run.grants; r.Grants < want {
		t.Errorf("%d grants; want at least %d", r.Grants, want)
	}
	if x.progress {
		if settled == 0 {
			t.Errorf("no grant while the fault was on (past the first %v of a window); a majority was up", cutGrace)
		}
		for i := range e.proxies {
			if p := fmt.Sprintf("p%d", i); i != x.blocked && settledByProxy[p] == 0 {
				t.Errorf("no grant through instance %s while the fault was on (past the first %v of a window); a majority was up and reachable", p, cutGrace)
			}
		}
	}
	if x.clean {
		// A 100 ms node timeout can pass on a loaded shared host; a few
		// NOQUORUM answers (retried) are that, not a fault.
		if c.errs.Load() > 0 || c.noQuorum.Load()*100 > attempts {
			t.Errorf("without faults: %d NOQUORUM in %d attempts, %d other errors (last: %v); want no errors and NOQUORUM under 1 %%",
				c.noQuorum.Load(), attempts, c.errs.Load(), c.lastErr.Load())
		}
		// Without faults nothing takes a lock from its holder: an UNLOCK
		// sent well within the validity and answered 0 means the lock
		// was lost early.
		if n := c.unlockZeroEarly.Load(); n > 0 {
			t.Errorf("without faults: %d UNLOCKs sent in the first half of their grant's validity answered 0 (of %d answered 0); want none", n, c.unlockZero.Load())
		}
	}
	for _, p := range e.proxies {
		p.checkNoPanic(t)
	}
}

// settledWindows is windows less the first cutGrace of each (a window no
// longer than that is left out).
func settledWindows(windows []faultWindow) []faultWindow {
	var out []faultWindow
	for _, w := range windows {
		if w.to > w.from+cutGrace {
			out = append(out, faultWindow{w.from + cutGrace, w.to})
		}
	}
	return out
}

// driftFor is lockproxy's default drift for a TTL: TTL·0.01 + 2 ms
// (driftMS for the workload's TTL).
func driftFor(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

// checkValidity fails the row for every grant validityProblem finds. It
// returns the shortest and longest validity told to grants of the
// workload's TTL, for the row's line.
func checkValidity(t *testing.T, gs []Grant) (shortest, longest time.Duration) {
	t.Helper()
	bad := 0
	for _, g := range gs {
		if g.TTL == ttlMS*time.Millisecond {
			if shortest == 0 || g.Validity < shortest {
				shortest = g.Validity
			}
			longest = max(longest, g.Validity)
		}
		if p := validityProblem(g); p != "" {
			bad++
			if bad <= 5 {
				t.Errorf("grant %v: %s", g, p)
			}
		}
	}
	if bad > 5 {
		t.Errorf("%d grants in all with a validity out of (0, TTL − drift] or no TTL", bad)
	}
	return shortest, longest
}

// validityProblem says what is wrong with g's validity as its reply told
// it: not in (0, TTL − drift] for the TTL it asked for (lockproxy also
// subtracts the time the acquisition took, which probeValidity checks), or
// no TTL recorded (every grant of a row must say what it asked for).
func validityProblem(g Grant) string {
	switch {
	case g.TTL <= 0:
		return "recorded without its TTL"
	case g.Validity <= 0 || g.Validity > g.TTL-driftFor(g.TTL):
		return fmt.Sprintf("validity told %v for TTL %v; want in (0, %v]", g.Validity, g.TTL, g.TTL-driftFor(g.TTL))
	}
	return ""
}

func prefixed(prefix, s string) string {
	if s == "" {
		return ""
	}
	return prefix + s
}

// rowSize returns the clients, grants per client, how many times the
// fault may be injected, and the wall-clock limit of a row: CI size by
// default, the soak size with -soak or LOCKPROXY_SOAK=1 (the fault then
// repeats, a second apart, until the clients made their grants).
func rowSize() (clients, grants, cycles int, limit time.Duration) {
	if soak() {
		return 20, 10000, 1000, 30 * time.Minute
	}
	return 20, 500, 1, 2 * time.Minute
}

// anotherCycle reports whether a row injects its fault again: the first
// time always; after that while the clients still need grants and their
// time limit (counted from the row's start) has not passed, as after it
// they have stopped and a fault would find nobody to hinder.
func anotherCycle(cycle, cycles int, made, want int64, start time.Time, limit time.Duration) bool {
	if cycle == 0 {
		return true
	}
	return cycle < cycles && made < want && time.Since(start) < limit
}

// rowKeys is how many keys a row's clients spread over: 20 clients on 12
// keys keep 1–2 clients contending for each key, while the row makes its
// 10,000 grants in seconds rather than the minute one key would take.
const rowKeys = 12

// clientsOf names the instances' clients in a grant's Client field.
func clientsOf(g Grant, instance int) bool {
	return strings.HasPrefix(g.Client, fmt.Sprintf("p%d.", instance))
}

// rowsAtOnce is how many rows of one table run at the same time. Each row
// has its own nodes, instances and links, so rows do not see each other's
// faults; two at once keep both cores busy while one row's fault holds its
// clients back (a node down past the TTL, an instance cut off).
const rowsAtOnce = 2

var rowSlots = make(chan struct{}, rowsAtOnce)

// rowSlot marks the row parallel with the table's other rows and waits for
// one of the rowsAtOnce slots, which it gives back when the row ends.
func rowSlot(t *testing.T) {
	t.Parallel()
	rowSlots <- struct{}{}
	t.Cleanup(func() { <-rowSlots })
}
