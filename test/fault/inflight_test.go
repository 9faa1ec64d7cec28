package fault

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Commands caught in flight. A row that stops or kills a lockproxy instance
// is meant to catch its clients' LOCKs and RLOCKs in flight: sent before
// the signal, answered only after the continue (a stop), or cut off by the
// connection the kill closed. The workload reports every LOCK and RLOCK to
// inFlight, and such a row registers each stop or kill as a span just
// before it signals, so that it can show, and require, that its fault
// caught some.

// faultSpan is one stop or kill of a lockproxy instance on the history's
// clock: from is taken just before the signal was sent, to just before
// SIGCONT (0 while the instance is stopped; a kill has none).
type faultSpan struct {
	instance int
	from, to time.Duration
	kill     bool
	// caught counts the LOCK/RLOCKs the span caught in flight: sent before
	// from, and answered after to (a stop) or failed with the connection
	// closed at or after from (a kill); granted, those that were grants.
	caught, granted int
	// unlocks counts the UNLOCKs a kill caught in flight (their locks are
	// left to run out on the nodes).
	unlocks int
	// others counts the PINGs to another instance sent during a stop and
	// answered before its continue (stopProbe): the rest of the system
	// went on, so what the stop held up was not a stall of the whole host.
	others int
	// cmds are the LOCK/RLOCKs a stop caught, for checks after the row.
	cmds []caughtCmd
}

// caughtCmd is one LOCK or RLOCK a stop caught in flight.
type caughtCmd struct {
	key      string
	sent, at time.Duration
	granted  bool
	// validity is the validity a grant was told.
	validity time.Duration
}

// inFlight records the spans and what they caught.
type inFlight struct {
	mu    sync.Mutex
	spans []*faultSpan
	// pending counts the LOCK/RLOCKs outstanding per instance (at most
	// maxInstances).
	pending [maxInstances]atomic.Int64
	// restarted is when each instance last listened again after a kill
	// (0: never).
	restarted [maxInstances]time.Duration
}

// maxInstances bounds the lockproxy instances inFlight tracks.
const maxInstances = 4

// begin registers a span of instance starting now (call it just before
// the signal) and returns it.
func (f *inFlight) begin(now time.Duration, instance int, kill bool) *faultSpan {
	s := &faultSpan{instance: instance, from: now, kill: kill}
	f.mu.Lock()
	f.spans = append(f.spans, s)
	f.mu.Unlock()
	return s
}

// end closes a stop's span (call it just before SIGCONT).
func (f *inFlight) end(s *faultSpan, now time.Duration) {
	f.mu.Lock()
	s.to = now
	f.mu.Unlock()
}

// stopProbe PINGs addr (another instance than the one stopped) every
// 10 ms from the start of stop s until stop is closed, and counts in
// s.others the PINGs answered before s's continue.
func (f *inFlight) stopProbe(addr string, s *faultSpan, stop <-chan struct{}) {
	cl := newClient(addr)
	defer func() { _ = cl.Close() }()
	for {
		select {
		case <-stop:
			return
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := cl.Ping(ctx).Err()
		cancel()
		f.mu.Lock()
		if err == nil && s.to == 0 {
			s.others++
		}
		f.mu.Unlock()
		select {
		case <-stop:
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// caughtBy is how many LOCK/RLOCKs span s caught so far.
func (f *inFlight) caughtBy(s *faultSpan) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return s.caught
}

// restart records that instance listens again, now.
func (f *inFlight) restart(instance int, now time.Duration) {
	f.mu.Lock()
	f.restarted[instance] = now
	f.mu.Unlock()
}

// restartedAt is when instance last listened again after a kill.
func (f *inFlight) restartedAt(instance int) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.restarted[instance]
}

// killSpans is the kills' spans (copies).
func (f *inFlight) killSpans() []faultSpan {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []faultSpan
	for _, s := range f.spans {
		if s.kill {
			out = append(out, faultSpan{instance: s.instance, from: s.from, kill: true, caught: s.caught, unlocks: s.unlocks})
		}
	}
	return out
}

// sending counts a LOCK/RLOCK to instance as outstanding.
func (f *inFlight) sending(instance int) { f.pending[instance].Add(1) }

// waitPending waits up to d until instance has a LOCK/RLOCK outstanding.
func (f *inFlight) waitPending(instance int, d time.Duration) bool {
	for end := time.Now().Add(d); ; time.Sleep(time.Millisecond) {
		if f.pending[instance].Load() > 0 {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

// done reports a LOCK/RLOCK (lock) or UNLOCK (!lock) to instance sent at
// sent and answered or failed at at, with its outcome.
func (f *inFlight) done(instance int, lock bool, key string, sent, at time.Duration, granted bool, validity time.Duration, err error) {
	if lock {
		f.pending[instance].Add(-1)
	}
	answered := err == nil || isReply(err)
	closed := !answered && connClosed(err)
	if !answered && !closed {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	// The spans are in the order they began: only those that began after
	// the command was sent can have caught it; it counts for the latest.
	for i := len(f.spans) - 1; i >= 0 && f.spans[i].from > sent; i-- {
		s := f.spans[i]
		if s.instance != instance {
			continue
		}
		switch {
		case s.kill && closed && at >= s.from && lock:
			s.caught++
		case s.kill && closed && at >= s.from:
			s.unlocks++
		case !s.kill && answered && lock && s.to > 0 && at > s.to:
			s.caught++
			if granted {
				s.granted++
			}
			s.cmds = append(s.cmds, caughtCmd{key: key, sent: sent, at: at, granted: granted, validity: validity})
		default:
			continue
		}
		return
	}
}

// stopSpans is the stops' spans (copies; cmds shared).
func (f *inFlight) stopSpans() []faultSpan {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []faultSpan
	for _, s := range f.spans {
		if !s.kill {
			out = append(out, *s)
		}
	}
	return out
}

// isReply reports whether err is a reply of the server's (an error reply
// such as NOQUORUM), not a failure to get one.
func isReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// connClosed reports whether err is the connection closed under a command
// (the peer's process gone).
func connClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// heldLong reports whether a grant of key held (from its entry to its
// exit) longer than d overlapped [from, to): a LOCK sent at from and
// answered at to may have waited for it. (The LOCK's own grant entered at
// to.)
func heldLong(gs []Grant, key string, from, to, d time.Duration) bool {
	for _, g := range gs {
		if g.Key == key && g.Enter < to && g.exit() > from && g.exit()-g.Enter > d {
			return true
		}
	}
	return false
}

// stopCaughtNote sums what the stops of a row caught and returns how many
// stops held up a LOCK/RLOCK themselves: one caught in flight on a key
// that nobody held for over waitedFor while it was out (it was not
// waiting for a holder), while another instance answered at least
// minOthers PINGs sent during the stop (it was not a stall of the whole
// host, which on a loaded machine can hold every command for 400 ms). A
// stop that never happened cannot do that: the workload's sections last
// ms; a LOCK waiting for a long holder, or any command in a stall of the
// whole host, can span a stop whether or not it took effect.
func stopCaughtNote(f *inFlight, gs []Grant) (int, string) {
	spans := f.stopSpans()
	byKey := map[string][]Grant{}
	for _, g := range gs {
		byKey[g.Key] = append(byKey[g.Key], g)
	}
	catching, caught, granted, notWaiting, cut, holding := 0, 0, 0, 0, 0, 0
	minO, maxO := -1, 0
	for _, s := range spans {
		if s.caught > 0 {
			catching++
		}
		caught += s.caught
		granted += s.granted
		if minO < 0 || s.others < minO {
			minO = s.others
		}
		maxO = max(maxO, s.others)
		mine := 0
		for _, c := range s.cmds {
			if !heldLong(byKey[c.key], c.key, c.sent, c.at, waitedFor) {
				mine++
			}
			if c.granted && c.validity < ttlMS*time.Millisecond-driftFor(ttlMS*time.Millisecond)-waitedFor {
				cut++
			}
		}
		notWaiting += mine
		if mine > 0 && s.others >= minOthers {
			holding++
		}
	}
	return holding, fmt.Sprintf("%d of %d stops caught LOCK/RLOCKs in flight (sent before the stop, answered after the continue): %d (%d granted), %d of them on keys nobody held over %v meanwhile (not waiting), %d granted with a validity over %v short of TTL − drift (the stop fell within their acquisition); "+
		"the other instance answered %d–%d PINGs sent within a stop; %d stops held up a LOCK/RLOCK that was not waiting while it answered at least %d",
		catching, len(spans), caught, granted, notWaiting, waitedFor, cut, waitedFor, max(minO, 0), maxO, holding, minOthers)
}

// minOthers is how many PINGs (one each 10 ms) another instance must have
// answered within a stop for it to count as having held up a LOCK itself.
const minOthers = 5

// waitedFor: a LOCK answered after a stop whose key some grant held longer
// than this while it was out may have been waiting for that holder.
const waitedFor = 100 * time.Millisecond

// killTries bounds how many times killInFlight kills an instance in one
// injection while no kill cut off a LOCK/RLOCK.
const killTries = 3

// killInFlight SIGKILLs lockproxy instance i while a LOCK/RLOCK of the
// workload to it is outstanding (it waits up to a second for one), each
// kill a span of e.flight. While no kill cut one off (a command may be
// answered between the look and the kill), it restarts the instance and
// kills it again, killTries times in all. It returns the kills seen to
// take effect.
func killInFlight(t *testing.T, e *linkEnv, i int) int {
	t.Helper()
	n := 0
	for try := 1; ; try++ {
		if !e.flight.waitPending(i, time.Second) {
			t.Logf("kill %d of p%d: no LOCK/RLOCK outstanding within 1s; killing anyway", try, i)
		}
		span := e.flight.begin(e.hist.Now(), i, true)
		n += e.proxies[i].kill()
		// The clients see their connections closed at once.
		time.Sleep(100 * time.Millisecond)
		if e.flight.caughtBy(span) > 0 || try == killTries {
			return n
		}
		t.Logf("kill %d of p%d cut off no LOCK/RLOCK in flight; restarting it to kill it again", try, i)
		e.proxies[i].restart()
		time.Sleep(300 * time.Millisecond)
	}
}

// killCaughtCheck logs and requires what the kills of instance i caught:
// at least one LOCK/RLOCK in flight, cut off by the connection the kill
// closed. It also counts the locks held through a kill: the UNLOCKs it cut
// off, and the holders of i in their critical section at a kill (their
// UNLOCK went to the dead instance). And it requires the workload's
// clients of i to have reconnected to the restarted instance and gone on:
// at least afterHeal grants each after it listened again.
func killCaughtCheck(t *testing.T, e *linkEnv, i int, notes *rowNotes) {
	t.Helper()
	gs := e.hist.Grants()
	prefix := fmt.Sprintf("p%d.c", i)
	spans := e.flight.killSpans()
	catching, caught, unlocks, inSection := 0, 0, 0, 0
	for _, s := range spans {
		if s.caught > 0 {
			catching++
		}
		caught += s.caught
		unlocks += s.unlocks
		for _, g := range gs {
			if strings.HasPrefix(g.Client, prefix) && g.Enter < s.from && g.exit() > s.from {
				inSection++
			}
		}
	}
	notes.add("%d of %d kills of p%d caught LOCK/RLOCKs in flight (sent before the kill, failed with the connection it closed): %d; locks held through them: %d UNLOCKs cut off, %d holders in their section",
		catching, len(spans), i, caught, unlocks, inSection)
	if caught == 0 {
		t.Errorf("no kill of p%d caught a LOCK/RLOCK in flight (%d kills): the row did not kill it with grants in flight", i, len(spans))
	}

	back := e.flight.restartedAt(i)
	if back == 0 {
		t.Errorf("p%d was never restarted after its kill", i)
		return
	}
	after := map[string]int{}
	for _, g := range gs {
		if strings.HasPrefix(g.Client, prefix) {
			if _, ok := after[g.Client]; !ok {
				after[g.Client] = 0
			}
			if g.Enter > back {
				after[g.Client]++
			}
		}
	}
	least, who := -1, ""
	for c, n := range after {
		if least < 0 || n < least {
			least, who = n, c
		}
		if n < afterHeal {
			t.Errorf("client %s made %d grants after p%d was restarted; want at least %d (it reconnects and goes on)", c, n, i, afterHeal)
		}
	}
	notes.add("after p%d's restart its %d clients made at least %d grants each (fewest: %s; want %d)", i, len(after), least, who, afterHeal)
	if len(after) == 0 {
		t.Errorf("no grants of p%d's clients in the history", i)
	}
}
