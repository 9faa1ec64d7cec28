package fault

import (
	"syscall"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
)

// pauseProxy SIGSTOPs lockproxy instance i (its running process) and
// returns 1 once the kernel shows it stopped, and a function that
// continues it. The stop is a span of e.flight, from just before the
// SIGSTOP to just before the SIGCONT, during which another instance, if
// any, is PINGed (inFlight.stopProbe).
func pauseProxy(t *testing.T, e *linkEnv, i int) (int, func()) {
	t.Helper()
	p := e.proxies[i]
	p.mu.Lock()
	cur := p.procs[len(p.procs)-1]
	p.mu.Unlock()
	pid := cur.PID()
	span := e.flight.begin(e.hist.Now(), i, false)
	probeDone := make(chan struct{})
	if len(e.proxies) > 1 {
		go e.flight.stopProbe(e.proxies[(i+1)%len(e.proxies)].addr, span, probeDone)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Errorf("SIGSTOP lockproxy %s (pid %d): %v", p.addr, pid, err)
		e.flight.end(span, e.hist.Now())
		close(probeDone)
		return 0, func() {}
	}
	resume := func() {
		e.flight.end(span, e.hist.Now())
		_ = syscall.Kill(pid, syscall.SIGCONT)
		close(probeDone)
	}
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if processStopped(pid) {
			return 1, resume
		}
	}
	t.Errorf("lockproxy %s (pid %d) not stopped a second after SIGSTOP", p.addr, pid)
	return 0, resume
}

// proxyPauseFaults are the fault matrix's "pause" nemesis aimed at a
// lockproxy instance rather than a node: the process that computed a
// grant's validity stops (GC stall, VM pause, SIGSTOP) with its clients'
// commands in flight, grants half-answered and waiters queued.
var proxyPauseFaults = []fault{
	{
		// Past the TTL: every lock the instance's clients held runs out
		// on the nodes, and the other instance's clients take them.
		name: "sigstop-lockproxy-past-ttl",
		inject: func(t *testing.T, e *linkEnv, _ *rowNotes) int {
			n, resume := pauseProxy(t, e, 1)
			time.Sleep(pastTTL)
			resume()
			return n
		},
		heal:   func(*testing.T, *linkEnv) { time.Sleep(500 * time.Millisecond) },
		expect: expect{progress: true, blocked: 1},
	},
	{
		// Many short stops at random points of the instance's work, so
		// some fall between a grant's validity being computed and its
		// reply being written: the long holds (during the fault, on the
		// paused instance too) then overstay the lease if the reply's
		// validity does not count the stop. The row requires a stop to
		// have held up a LOCK/RLOCK in flight that was not waiting for a
		// holder (stopCaughtNote): up to shortStopsMax stops, until one
		// has.
		name: "sigstop-lockproxy-short-repeated",
		inject: func(t *testing.T, e *linkEnv, _ *rowNotes) int {
			n := 0
			for i := 0; i < shortStops || i < shortStopsMax && stoppedNone(e); i++ {
				k, resume := pauseProxy(t, e, 1)
				n += k
				time.Sleep(400 * time.Millisecond)
				resume()
				time.Sleep(300 * time.Millisecond)
			}
			return n
		},
		heal: func(*testing.T, *linkEnv) {},
		after: func(t *testing.T, e *linkEnv, notes *rowNotes) {
			holding, note := stopCaughtNote(&e.flight, e.hist.Grants())
			notes.add("%s", note)
			if holding == 0 {
				t.Errorf("no stop of p1 held up a LOCK/RLOCK in flight that was not waiting for a holder while p0 went on (%s): the row did not test a stop within a grant", note)
			}
		},
		expect: expect{progress: true, blocked: -1},
	},
}

// shortStops is how many short stops sigstop-lockproxy-short-repeated
// makes, and shortStopsMax how many at most while none caught a command in
// flight.
const (
	shortStops    = 8
	shortStopsMax = 16
)

// stoppedNone reports whether no stop so far held up a LOCK/RLOCK in
// flight (stopCaughtNote; as far as the history shows yet).
func stoppedNone(e *linkEnv) bool {
	holding, _ := stopCaughtNote(&e.flight, e.hist.Grants())
	return holding == 0
}

// TestProxyPaused runs the workload with a lockproxy instance SIGSTOPped
// and judges each row as TestFaults does (long holds included).
func TestProxyPaused(t *testing.T) {
	harness.RequireBinary(t, "redis-server", "redis-server")
	harness.BuildLockproxy(t)
	for _, f := range proxyPauseFaults {
		t.Run(f.name, func(t *testing.T) { runRow(t, f) })
	}
}
