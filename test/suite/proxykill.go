//go:build linux

package suite

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/fault"
	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// ProxyKill is one backend's setting of RunProxyKilledWhileHolding: two
// running lockproxies on one lock store, the leases used, how to see a
// waiter queued in the store and how soon B's rivals must be granted.
type ProxyKill struct {
	// Client is the backend package's lock-client waits.
	Client lockclient.Config
	// A is the instance SIGKILLed, B the one that serves the rivals.
	A, B  string
	ProcA *harness.Proc

	// TTLMS is the workload's and the KEEPALIVE holder's PX, WaitMS the
	// workload's WAIT, HoldMS the PX holder's lease.
	TTLMS, WaitMS, HoldMS int

	// WaitQueued waits (and fails the test if it does not happen in a
	// bound time) until the store shows key's holder with waiters LOCK …
	// WAITs queued behind it.
	WaitQueued func(key string, waiters int)

	// The rivals on B of the PX holder, of the KEEPALIVE holder and of the
	// key A's client was waiting for must be granted within these of the
	// kill; BoundNote says what they come from, for the messages.
	PXHolderBound, KeepaliveHolderBound, WaiterBound time.Duration
	BoundNote                                        string
}

// The kill workload's size: clients on each instance, and keys.
const (
	killPerInst = 3
	killKeys    = 3
)

// RunProxyKilledWhileHolding is the fault matrix's "lockproxy kill -9"
// row, judged by test/fault's checker: clients of instances A and B loop
// LOCK → fenced-ledger read-modify-write → UNLOCK over a few keys while,
// on A, a PX holder and a KEEPALIVE holder hold keys of their own and a
// LOCK … WAIT is queued (a grant in flight) behind a holder on B; a client
// of B waits for each of those keys. A is then SIGKILLed (by PID). A's
// holders keep acting on the validity they were told (each writes at 90 %
// of it); B's holder of the queued key releases it. B's rivals must be
// granted within p's bounds of the kill, B must grant every workload key
// after it, and the history must show no overlap within validity, fences
// increasing, no live write rejected and no lost update.
func RunProxyKilledWhileHolding(t testing.TB, p ProxyKill) {
	lc := p.Client
	ttlMS := p.TTLMS
	hist, ledger := fault.NewHistory(), fault.NewLedger(true, false)

	w := startLedgerWorkload(t, lc, hist, ledger, []string{p.A, p.B}, killPerInst, killKeys, ttlMS, p.WaitMS)
	defer w.halt()
	// Let the workload run on both instances before the holders come.
	for end := time.Now().Add(20 * time.Second); w.grants[0].Load() < 20 || w.grants[1].Load() < 20; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("workload: %d and %d grants after 20 s; want 20 each (errors %d, %d: %v)",
				w.grants[0].Load(), w.grants[1].Load(), w.errs[0].Load(), w.errs[1].Load(), w.lastErr.Load())
		}
	}

	// The keys held (or queued for) through A when it dies.
	cases := []struct {
		name string
		key  string
		args []any // A's LOCK
		// bound: B's rival is granted within this of the kill.
		bound time.Duration
	}{
		{name: "px-holder", key: "kill-px-" + lockclient.RandID(), args: []any{"PX", p.HoldMS},
			bound: p.PXHolderBound},
		{name: "keepalive-holder", key: "kill-ka-" + lockclient.RandID(), args: []any{"PX", ttlMS, "KEEPALIVE"},
			bound: p.KeepaliveHolderBound},
		{name: "waiter-in-flight", key: "kill-q-" + lockclient.RandID(), args: []any{"PX", ttlMS, "WAIT", 20000},
			bound: p.WaiterBound},
	}
	var holders sync.WaitGroup
	rivals := make([]chan rivalGrant, len(cases))
	var qHolder *redis.Client
	var qToken string
	var qRec fault.Grant
	waiterErr := make(chan error, 1)
	for i, tc := range cases {
		ca := lc.NewClient(t, p.A, 2)
		switch tc.name {
		case "waiter-in-flight":
			// B holds the key; A's LOCK … WAIT queues behind it.
			qHolder = lc.NewClient(t, p.B, 2)
			g := lc.MustLock(t, qHolder, tc.key, "PX", 20000)
			qToken = g.Token
			enter := hist.Now()
			// B's holder does its update at once and keeps the lock, to
			// keep A's waiter waiting, until it releases it after the
			// kill (its exit is recorded then).
			qRec = fault.Grant{Key: tc.key, Token: g.Token, Fence: g.Fence, Client: "b.q-holder", Enter: enter,
				Deadline: enter + time.Duration(g.ValidityMS)*time.Millisecond}
			qRec.Read = ledger.Read(tc.key, qRec.Fence)
			qRec.Use = hist.Now()
			qRec.Rejected = !ledger.Write(tc.key, qRec.Fence, qRec.Read+1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
				defer cancel()
				_, ok, err := lockclient.TryLock(ctx, ca, tc.key, tc.args...)
				if err == nil && ok {
					err = fmt.Errorf("granted")
				}
				waiterErr <- err
			}()
			p.WaitQueued(tc.key, 1)
		default:
			g := lc.MustLock(t, ca, tc.key, tc.args...)
			enter := hist.Now()
			rec := fault.Grant{Key: tc.key, Token: g.Token, Fence: g.Fence, Client: "a." + tc.name, Enter: enter,
				Deadline: enter + time.Duration(g.ValidityMS)*time.Millisecond}
			holders.Go(func() {
				// The holder knows nothing of the kill: it acts on the
				// validity it was told.
				rec.Read = ledger.Read(tc.key, rec.Fence)
				time.Sleep(rec.Enter + (rec.Deadline-rec.Enter)*9/10 - hist.Now())
				rec.Use = hist.Now()
				rec.Rejected = !ledger.Write(tc.key, rec.Fence, rec.Read+1)
				rec.Exit = hist.Now()
				hist.Add(rec)
			})
		}
		rivals[i] = startWaitingRival(hist, ledger, lc.NewClient(t, p.B, 2), tc.key, ttlMS, 15000)
		n := 1
		if tc.name == "waiter-in-flight" {
			n = 2
		}
		p.WaitQueued(tc.key, n)
	}

	inflight := w.inflight[0].Load() + 1 // the queued waiter
	killAt, killWall := hist.Now(), time.Now()
	p.ProcA.Kill()
	w.dead[0].Store(true)
	code, err := p.ProcA.Wait(10 * time.Second)
	t.Logf("instance A (pid %d) SIGKILLed at %v: exit %d, %v; %d LOCKs through it in flight",
		p.ProcA.PID(), killAt.Round(time.Millisecond), code, err, inflight)
	if code != -1 || err != nil {
		t.Errorf("instance A after SIGKILL: exit %d, %v; want -1 (killed by a signal)", code, err)
	}
	qRec.Exit = hist.Now()
	hist.Add(qRec)
	if got := lc.IntCmd(t, qHolder, "UNLOCK", cases[2].key, qToken); got != 1 {
		t.Errorf("B's UNLOCK of %s = %d; want 1", cases[2].key, got)
	}
	select {
	case err := <-waiterErr:
		if err == nil || err.Error() == "granted" {
			t.Errorf("A's queued LOCK … WAIT after A died = %v; want a connection error", err)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("A's queued LOCK … WAIT did not return within 10 s of A's death")
	}

	var rivalTimes []string
	for i, tc := range cases {
		select {
		case r := <-rivals[i]:
			if r.err != nil {
				t.Errorf("%s: B's rival: %v", tc.name, r.err)
				continue
			}
			after := r.at.Sub(killWall)
			rivalTimes = append(rivalTimes, fmt.Sprintf("%s %v", tc.name, after.Round(time.Millisecond)))
			if after > tc.bound {
				t.Errorf("%s: B's rival granted %v after A died; want within %v (%s)", tc.name, after, tc.bound, p.BoundNote)
			}
		case <-time.After(25 * time.Second):
			t.Errorf("%s: B's rival not granted within 25 s of A's death", tc.name)
		}
	}
	holders.Wait()
	// B grants every workload key after the kill, those A's clients held
	// or were being granted included.
	keysAfter := func() map[string]bool {
		seen := map[string]bool{}
		for _, g := range hist.Grants() {
			if g.Enter > killAt && strings.HasPrefix(g.Client, "b.c") {
				seen[g.Key] = true
			}
		}
		return seen
	}
	for end := time.Now().Add(10 * time.Second); len(keysAfter()) < killKeys && time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
	}
	w.halt()
	if got := keysAfter(); len(got) != killKeys {
		t.Errorf("workload keys granted through B after the kill: %v; want all %d", got, killKeys)
	}

	// How long after the previous holder's end (its exit, capped at its
	// validity) each rival entered (the checker fails a negative one).
	var margins []string
	for _, tc := range cases {
		var held, rival fault.Grant
		for _, g := range hist.Grants() {
			switch {
			case g.Key == tc.key && g.Client == "b.rival":
				rival = g
			case g.Key == tc.key:
				held = g
			}
		}
		if rival.Token != "" && held.Token != "" {
			margins = append(margins, fmt.Sprintf("%s %v (%v after its grant, validity %v)", tc.name,
				(rival.Enter-min(held.Exit, held.Deadline)).Round(time.Millisecond),
				(rival.Enter-held.Enter).Round(time.Millisecond), (held.Deadline-held.Enter).Round(time.Millisecond)))
		}
	}
	r := fault.Check(hist.Grants())
	acc, rej := ledger.Counts()
	var bAfter int
	for _, g := range hist.Grants() {
		if g.Enter > killAt && strings.HasPrefix(g.Client, "b.") {
			bAfter++
		}
	}
	t.Logf("A killed with its clients holding and queued: %d grants (%d on B after the kill), workload errors %d on A, %d on B (last %v); "+
		"rivals on B granted after the kill: %s (%s), after the previous holder's end: %s; %d overlaps, %d fence regressions, %d live writes rejected, %d late uses; "+
		"ledger %d accepted, %d rejected, %d lost",
		r.Grants, bAfter, w.errs[0].Load(), w.errs[1].Load(), w.lastErr.Load(), strings.Join(rivalTimes, ", "), p.BoundNote, strings.Join(margins, ", "),
		r.OverlapCount, r.FenceRegressionCount, r.RejectedLiveCount, r.LateUseCount, acc, rej, ledger.LostTotal())
	if r.Violations() > 0 {
		t.Errorf("history check: %v", r)
	}
	if lost := ledger.LostTotal(); lost != 0 {
		t.Errorf("lost acknowledged updates: %v", ledger.Lost())
	}
	if bAfter == 0 {
		t.Errorf("no grant through B after A was killed")
	}
}

// rivalGrant is what a waiting rival's LOCK … WAIT came to: when it was
// granted, or why not.
type rivalGrant struct {
	at  time.Time
	err error
}

// startWaitingRival takes key through c with LOCK … WAIT, does its fenced
// ledger update, records the grant in hist as "b.rival" and releases it;
// the result comes on the channel.
func startWaitingRival(hist *fault.History, ledger *fault.Ledger, c *redis.Client, key string, ttlMS, waitMS int) chan rivalGrant {
	res := make(chan rivalGrant, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(waitMS)*time.Millisecond+10*time.Second)
		defer cancel()
		g, ok, err := lockclient.TryLock(ctx, c, key, "PX", ttlMS, "WAIT", waitMS)
		at, enter := time.Now(), hist.Now()
		if err != nil || !ok {
			res <- rivalGrant{err: fmt.Errorf("LOCK %s WAIT %d = %v, %v; want a grant", key, waitMS, ok, err)}
			return
		}
		rec := fault.Grant{Key: key, Token: g.Token, Fence: g.Fence, Client: "b.rival", Enter: enter,
			Deadline: enter + time.Duration(g.ValidityMS)*time.Millisecond}
		rec.Read = ledger.Read(key, rec.Fence)
		rec.Use = hist.Now()
		rec.Rejected = !ledger.Write(key, rec.Fence, rec.Read+1)
		rec.Exit = hist.Now()
		hist.Add(rec)
		_ = c.Do(ctx, "UNLOCK", key, g.Token).Err()
		res <- rivalGrant{at: at}
	}()
	return res
}

// ledgerWorkload is clients of each of two instances looping LOCK →
// fenced-ledger read-modify-write → UNLOCK over a few keys, every grant
// recorded.
type ledgerWorkload struct {
	stop     chan struct{}
	once     sync.Once
	wg       sync.WaitGroup
	grants   [2]atomic.Int64
	errs     [2]atomic.Int64
	inflight [2]atomic.Int64
	// holding counts each instance's clients between a grant and their
	// exit.
	holding [2]atomic.Int64
	// dead is set once the instance was killed.
	dead    [2]atomic.Bool
	lastErr atomic.Value
}

// startLedgerWorkload starts perInst clients on each of the two addrs,
// each looping LOCK key PX ttlMS WAIT waitMS with a hold of up to 2 ms.
func startLedgerWorkload(t testing.TB, lc lockclient.Config, hist *fault.History, ledger *fault.Ledger, addrs []string, perInst, keys, ttlMS, waitMS int) *ledgerWorkload {
	return startWorkload(t, lc, hist, ledger, workloadSpec{addrs: addrs, perInst: perInst, keys: keys, ttlMS: ttlMS, waitMS: waitMS})
}

// workloadSpec is a ledger workload's shape: perInst clients on each of
// the two addrs over keys keys, each LOCK with PX ttlMS and WAIT waitMS.
type workloadSpec struct {
	addrs                        []string
	perInst, keys, ttlMS, waitMS int
	// keepalive, if set, says which clients (by index on their instance)
	// add KEEPALIVE to their LOCK.
	keepalive func(j int) bool
	// longHold, if set, says which clients hold each grant for a random
	// 50–90 % of the validity they were told (read at once, write at the
	// end), instead of up to 2 ms: a grant handed to another client within
	// that validity is then an overlap, and its stale write a rejected or
	// lost update.
	longHold func(j int) bool
}

// startWorkload starts the clients of spec. A client whose LOCK fails
// tries again 50 ms later (go-redis dials again), so the clients of an
// instance that is killed and restarted go on through its next
// incarnation, unless its dead flag is set: they then stop.
func startWorkload(t testing.TB, lc lockclient.Config, hist *fault.History, ledger *fault.Ledger, spec workloadSpec) *ledgerWorkload {
	w := &ledgerWorkload{stop: make(chan struct{})}
	waitMS := spec.waitMS
	for i := range spec.perInst * 2 {
		inst, j := i%2, i/2
		cl := lc.NewClient(t, spec.addrs[inst], 2)
		name := fmt.Sprintf("%c.c%d", "ab"[inst], i)
		args := []any{"PX", spec.ttlMS, "WAIT", waitMS}
		if spec.keepalive != nil && spec.keepalive(j) {
			args = append(args, "KEEPALIVE")
			name += "-ka"
		}
		long := spec.longHold != nil && spec.longHold(j)
		if long {
			name += "-long"
		}
		w.wg.Go(func() {
			for n := 0; n < 100000; n++ {
				select {
				case <-w.stop:
					return
				default:
				}
				if w.dead[inst].Load() {
					return
				}
				key := fmt.Sprintf("w%d", rand.N(spec.keys))
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(waitMS)*time.Millisecond+15*time.Second)
				w.inflight[inst].Add(1)
				r, ok, err := lockclient.TryLock(ctx, cl, key, args...)
				w.inflight[inst].Add(-1)
				enter := hist.Now()
				if err != nil {
					cancel()
					w.errs[inst].Add(1)
					w.lastErr.Store(name + ": " + err.Error())
					if w.dead[inst].Load() {
						// Its instance was killed: nothing more to do.
						return
					}
					select {
					case <-w.stop:
						return
					case <-time.After(50 * time.Millisecond):
					}
					continue
				}
				if !ok {
					cancel()
					continue
				}
				g := fault.Grant{Key: key, Token: r.Token, Fence: r.Fence, Client: name, Enter: enter,
					Deadline: enter + time.Duration(r.ValidityMS)*time.Millisecond}
				w.holding[inst].Add(1)
				g.Read = ledger.Read(key, g.Fence)
				if long {
					time.Sleep(g.Enter + (g.Deadline-g.Enter)*time.Duration(50+rand.N(41))/100 - hist.Now())
				} else {
					time.Sleep(rand.N(2 * time.Millisecond))
				}
				g.Use = hist.Now()
				g.Rejected = !ledger.Write(key, g.Fence, g.Read+1)
				g.Exit = hist.Now()
				w.holding[inst].Add(-1)
				hist.Add(g)
				w.grants[inst].Add(1)
				_ = cl.Do(ctx, "UNLOCK", key, r.Token).Err()
				cancel()
			}
		})
	}
	return w
}

// halt stops the clients and waits for them (each returns within one
// LOCK … WAIT and its slack).
func (w *ledgerWorkload) halt() {
	w.once.Do(func() { close(w.stop) })
	w.wg.Wait()
}

// RunPausedHolderFenced is the paused-holder rounds (Kleppmann's GC
// pause), one per holder TTL: a holder through addrA stops past its
// validity and then until a rival through addrB took the lock and did its
// read-modify-write; then the stale holder writes. The fenced ledger must
// refuse exactly the stale writes and lose nothing; the same writes to an
// unfenced ledger (the negative control) are all accepted and lose the
// rivals' updates, so the test fails if the fence is not what saved them.
// lc is the backend package's lock-client waits.
func RunPausedHolderFenced(t testing.TB, lc lockclient.Config, addrA, addrB string) {
	hist := fault.NewHistory()
	fenced, unfenced := fault.NewLedger(true, true), fault.NewLedger(false, true)
	holder := lc.NewClient(t, addrA, 2)
	rival := lc.NewClient(t, addrB, 2)
	rounds := []struct {
		name  string
		ttlMS int
	}{{"PX 300", 300}, {"PX 600", 600}, {"PX 1000", 1000}}
	var pausedPast []string
	var pausedFences []int64
	for _, rd := range rounds {
		key := "paused-" + lockclient.RandID()
		g := lc.MustLock(t, holder, key, "PX", rd.ttlMS)
		enter := hist.Now()
		a := fault.Grant{Key: key, Token: g.Token, Fence: g.Fence, Client: "a.paused", Enter: enter,
			Deadline: enter + time.Duration(g.ValidityMS)*time.Millisecond}
		readF, readU := fenced.Read(key, a.Fence), unfenced.Read(key, a.Fence)

		rivalDone := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			r, ok, err := lockclient.TryLock(ctx, rival, key, "PX", 5000, "WAIT", 10000)
			enter := hist.Now()
			if err != nil || !ok {
				rivalDone <- fmt.Errorf("rival's LOCK %s WAIT = %v, %v; want a grant once the paused lease ran out", key, ok, err)
				return
			}
			b := fault.Grant{Key: key, Token: r.Token, Fence: r.Fence, Client: "b.rival", Enter: enter,
				Deadline: enter + time.Duration(r.ValidityMS)*time.Millisecond}
			vF, vU := fenced.Read(key, b.Fence), unfenced.Read(key, b.Fence)
			b.Use, b.Read = hist.Now(), vF
			b.Rejected = !fenced.Write(key, b.Fence, vF+1)
			unfenced.Write(key, b.Fence, vU+1)
			b.Exit = hist.Now()
			hist.Add(b)
			rivalDone <- rival.Do(ctx, "UNLOCK", key, r.Token).Err()
		}()

		// The holder's goroutine pauses past its validity, then (to make
		// the order certain) until the rival is done, then writes.
		paused := make(chan error, 1)
		go func() {
			time.Sleep(a.Deadline + 50*time.Millisecond - hist.Now())
			select {
			case err := <-rivalDone:
				if err != nil {
					paused <- err
					return
				}
			case <-time.After(20 * time.Second):
				paused <- fmt.Errorf("the rival never finished")
				return
			}
			a.Use, a.Read = hist.Now(), readF
			a.Rejected = !fenced.Write(key, a.Fence, readF+1)
			unfenced.Write(key, a.Fence, readU+1)
			a.Exit = hist.Now()
			hist.Add(a)
			paused <- nil
		}()
		if err := <-paused; err != nil {
			t.Fatalf("%s: %v", rd.name, err)
		}
		pausedFences = append(pausedFences, a.Fence)
		pausedPast = append(pausedPast, fmt.Sprintf("%s: wrote %v past its validity", rd.name, (a.Use-a.Deadline).Round(time.Millisecond)))
		if a.Use <= a.Deadline {
			t.Errorf("%s: the paused holder wrote at %v, before its deadline %v", rd.name, a.Use, a.Deadline)
		}
		if got := lc.IntCmd(t, holder, "UNLOCK", key, g.Token); got != 0 {
			t.Errorf("%s: UNLOCK by the paused holder = %d; want 0 (its lock ran out)", rd.name, got)
		}
	}

	n := len(rounds)
	r := fault.Check(hist.Grants())
	accF, rejF := fenced.Counts()
	accU, rejU := unfenced.Counts()
	t.Logf("paused holder, %d rounds (%s): fenced ledger accepted %d, rejected %d stale writes, lost %d updates; "+
		"unfenced ledger accepted %d of %d writes (rejected %d), lost %d updates; checker: %d grants, %d overlaps, %d late uses, %d violations",
		n, strings.Join(pausedPast, "; "), accF, rejF, fenced.LostTotal(), accU, 2*n, rejU, unfenced.LostTotal(),
		r.Grants, r.OverlapCount, r.LateUseCount, r.Violations())
	if rejF != n || fenced.LostTotal() != 0 {
		t.Errorf("fenced ledger: %d rejects, %d lost; want %d rejects (every stale write), 0 lost", rejF, fenced.LostTotal(), n)
	}
	// Exactly the paused holders' writes were refused.
	var refused []int64
	for _, e := range fenced.Log() {
		if !e.Accepted {
			refused = append(refused, e.Fence)
		}
	}
	if fmt.Sprint(refused) != fmt.Sprint(pausedFences) {
		t.Errorf("fenced ledger refused the writes of fences %v; want the paused holders' %v", refused, pausedFences)
	}
	if rejU != 0 || unfenced.LostTotal() != int64(n) {
		t.Errorf("unfenced ledger (negative control): %d rejects, %d lost; want 0 rejects and %d lost (the stale writes accepted)", rejU, unfenced.LostTotal(), n)
	}
	if r.LateUseCount != n || r.Violations() != 0 {
		t.Errorf("checker: %v; want %d late uses and no violation (lockproxy kept its promise; the holder did not)", r, n)
	}
}
