package fault

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// Long holds. The workload's critical sections last up to maxSleep (2 ms)
// of a validity near 2 s, so its grants end long before their deadlines and
// Check never tests the validity lockproxy reports: a build that reported
// three times the lease would pass on the workload alone. So every
// must-pass row also runs a few long holds: a holder keeps the lock until
// longHoldShare of the validity it was told, then does its ledger update,
// while a client of the other instance waits for the same key (and the
// workload's clients of both instances pick it too). A validity longer
// than the lease on the nodes lets the waiter in while the holder still
// holds: Check counts an overlap, and the fenced ledger refuses the
// holder's write within its validity (a live write rejected).

const (
	// longHoldShare is how much of its reported validity a long holder
	// keeps the lock before writing: 90 %, leaving the rest for a busy
	// host's scheduling.
	longHoldShare = 0.9
	// longHoldCap bounds a hold whatever the validity: a build that
	// reports more validity than the TTL is caught by any hold past the
	// TTL, and twice the TTL keeps a broken row short.
	longHoldCap = 2 * ttlMS * time.Millisecond
	// longHoldWaitMS is the waiter's WAIT: past the cap, so that it
	// outwaits an honest hold.
	longHoldWaitMS = 2*ttlMS + 1000
	// longHoldRetry is how long a holder tries again on NOQUORUM or an
	// error (a row's fault can make a try miss the quorum; what is tested
	// is what follows the grant).
	longHoldRetry = 5 * time.Second
)

// longHold is one hold: its key, the instance that holds it and the one
// whose client waits for it.
type longHold struct {
	key            string
	holder, waiter int
}

// rowLongHolds are the holds each must-pass row runs, at once: one in each
// direction, on two of the workload's keys.
var rowLongHolds = []longHold{{"k0", 0, 1}, {"k1", 1, 0}}

// longHoldOutcome is what one hold did.
type longHoldOutcome struct {
	h        longHold
	validity time.Duration
	held     time.Duration // from the grant to the holder's write
	waited   time.Duration // from the holder's exit to the waiter's grant (negative: early)
	problem  string
}

// startLongHolds runs holds, each in its own goroutine, and returns a
// function that waits for them, fails the row for every hold that was not
// granted or whose waiter never got the key, and returns a note for the
// row's log line. The holds go into the history. when names the phase
// ("during the fault", "after the heal") for the note.
func startLongHolds(t *testing.T, e *env, holds []longHold, when string) func() string {
	t.Helper()
	out := make([]longHoldOutcome, len(holds))
	var wg sync.WaitGroup
	for i, h := range holds {
		wg.Go(func() { out[i] = e.longHold(t, h) })
	}
	var once sync.Once
	var note string
	wait := func() string {
		once.Do(func() {
			wg.Wait()
			var parts []string
			for _, o := range out {
				if o.problem != "" {
					t.Errorf("long hold of %s (holder p%d, waiter p%d): %s", o.h.key, o.h.holder, o.h.waiter, o.problem)
					continue
				}
				parts = append(parts, fmt.Sprintf("%s p%d→p%d valid %v held %v, waiter in %v after",
					o.h.key, o.h.holder, o.h.waiter, o.validity.Round(time.Millisecond), o.held.Round(time.Millisecond), o.waited.Round(time.Millisecond)))
			}
			note = fmt.Sprintf("long holds %s: %s", when, strings.Join(parts, "; "))
		})
		return note
	}
	// A row that ends early (Fatalf in its fault) still waits for them
	// before its nodes and instances stop.
	t.Cleanup(func() { wait() })
	return wait
}

// longHold runs one hold: the holder's grant, its read at once and its
// write at longHoldShare of its validity; the waiter's grant as soon as
// lockproxy gives it, and its update at once.
func (e *env) longHold(t *testing.T, h longHold) longHoldOutcome {
	o := longHoldOutcome{h: h}
	holder := newClient(e.proxies[h.holder].addr)
	defer func() { _ = holder.Close() }()
	var r lockclient.Grant
	var ok bool
	var err error
	for end := time.Now().Add(longHoldRetry); ; time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		r, ok, err = lockclient.TryLock(ctx, holder, h.key, "PX", ttlMS, "WAIT", waitMS)
		cancel()
		if ok || time.Now().After(end) {
			break
		}
	}
	enter := e.hist.Now()
	if err != nil || !ok {
		o.problem = fmt.Sprintf("holder LOCK %s = %v, %v for %v; want a grant", h.key, ok, err, longHoldRetry)
		return o
	}
	o.validity = time.Duration(r.ValidityMS) * time.Millisecond
	hg := Grant{Key: h.key, Token: r.Token, Fence: r.Fence, Client: fmt.Sprintf("p%d.long-holder", h.holder),
		Enter: enter, Deadline: enter + o.validity, TTL: ttlMS * time.Millisecond, Validity: o.validity}
	hg.Read = e.ledger.Read(h.key, hg.Fence)

	type result struct {
		g   Grant
		err error
	}
	got := make(chan result, 1)
	go func() {
		cl := newClient(e.proxies[h.waiter].addr)
		defer func() { _ = cl.Close() }()
		// It tries again on NOQUORUM (a fault) until the hold must be
		// over; a Null after its WAIT is an answer.
		for end := time.Now().Add(longHoldCap + time.Second); ; time.Sleep(50 * time.Millisecond) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			wr, ok, err := lockclient.TryLock(ctx, cl, h.key, "PX", ttlMS, "WAIT", longHoldWaitMS)
			cancel()
			if ok {
				g := Grant{Key: h.key, Token: wr.Token, Fence: wr.Fence, Client: fmt.Sprintf("p%d.long-waiter", h.waiter),
					Enter: e.hist.Now()}
				g.Deadline = g.Enter + time.Duration(wr.ValidityMS)*time.Millisecond
				g.TTL, g.Validity = ttlMS*time.Millisecond, time.Duration(wr.ValidityMS)*time.Millisecond
				e.critical(h.key, &g)
				g.Exit = e.hist.Now()
				e.hist.Add(g)
				_ = cl.Do(lockclient.CtxFor(t, 5*time.Second), "UNLOCK", h.key, wr.Token).Err()
				got <- result{g: g}
				return
			}
			if time.Now().After(end) || (err == nil && !ok) {
				got <- result{err: fmt.Errorf("waiter LOCK %s WAIT %d = %v, %v", h.key, longHoldWaitMS, ok, err)}
				return
			}
		}
	}()

	hold := min(time.Duration(float64(o.validity)*longHoldShare), longHoldCap)
	if d := enter + hold - e.hist.Now(); d > 0 {
		time.Sleep(d)
	}
	hg.Use = e.hist.Now()
	hg.Rejected = !e.ledger.Write(h.key, hg.Fence, hg.Read+1)
	hg.Exit = e.hist.Now()
	e.hist.Add(hg)
	o.held = hg.Use - hg.Enter
	_ = holder.Do(lockclient.CtxFor(t, 5*time.Second), "UNLOCK", h.key, r.Token).Err()

	var res result
	select {
	case res = <-got:
	case <-time.After(30 * time.Second):
		res.err = fmt.Errorf("the waiter never answered")
	}
	if res.err != nil {
		o.problem = res.err.Error() + "; want a grant once the holder let go"
		return o
	}
	o.waited = res.g.Enter - hg.Exit
	return o
}

// longHoldsDuring reports whether a row runs its long holds from the
// injection on (both instances can grant while the fault is on) or after
// the heal (an instance is down or cut off by design, or nothing grants
// during the fault). Rows that break RedLock's assumptions on purpose run
// their own (fastClockRow) and none of these.
func longHoldsDuring(x expect) (run, during bool) {
	if x.unsafe {
		return false, false
	}
	return true, x.progress && x.blocked < 0
}
