package zk

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gozk "github.com/go-zookeeper/zk"
	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/fault"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestProxyKilledWhileHolding is the fault matrix's "lockproxy kill -9"
// row on ZooKeeper, judged by test/fault's checker: clients of two
// instances loop LOCK → fenced-ledger read-modify-write → UNLOCK over a
// few keys while, on instance A, a PX holder and a KEEPALIVE holder hold
// keys of their own and a LOCK … WAIT is queued (a grant in flight) behind
// a holder on instance B; a client of B waits for each of those keys. A is
// then SIGKILLed (by PID). A's holders keep acting on the validity they
// were told (each writes at 90 % of it); B's holder of the queued key
// releases it. The locks of the dead instance live in its session, so B's
// rivals must get them no sooner than the holders' validity and, as the
// README documents, about one session timeout after the kill (asserted
// generously: within 2 × the session + 3 s). The history must show no
// overlap within validity, fences increasing, no live write rejected and
// no lost update.
func TestProxyKilledWhileHolding(t *testing.T) {
	const (
		sessMS = 3000
		ttlMS  = 2000
		waitMS = 4000
		// holdMS: the PX holder's lease, longer than the session, so its
		// validity is the session's.
		holdMS     = 8000
		perInst    = 3
		keys       = 3
		rivalBound = 2*sessMS*time.Millisecond + 3*time.Second
	)
	root := newRoot(t)
	env := fmt.Sprintf("LOCKPROXY_ZOOKEEPER_SESSION_TIMEOUT=%dms", sessMS)
	a := startInstance(t, zkServers(), root, env) // killed
	b := startInstance(t, zkServers(), root, env) // serves the rivals
	zc := zkConn(t)
	hist, ledger := fault.NewHistory(), fault.NewLedger(true, false)

	w := startKillWorkload(t, hist, ledger, []string{a.addr, b.addr}, perInst, keys, ttlMS, waitMS)
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
	}{
		{name: "px-holder", key: "kill-px-" + lockclient.RandID(), args: []any{"PX", holdMS}},
		{name: "keepalive-holder", key: "kill-ka-" + lockclient.RandID(), args: []any{"PX", ttlMS, "KEEPALIVE"}},
		{name: "waiter-in-flight", key: "kill-q-" + lockclient.RandID(), args: []any{"PX", ttlMS, "WAIT", 20000}},
	}
	var holders sync.WaitGroup
	rivals := make([]chan rivalResult, len(cases))
	var qHolder *redis.Client
	var qToken string
	var qRec fault.Grant
	waiterErr := make(chan error, 1)
	for i, tc := range cases {
		ca := lc.NewClient(t, a.addr, 2)
		switch tc.name {
		case "waiter-in-flight":
			// B holds the key; A's LOCK … WAIT queues behind it.
			qHolder = lc.NewClient(t, b.addr, 2)
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
			waitLockNodes(t, zc, root, tc.key, 2)
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
		rivals[i] = startRival(hist, ledger, lc.NewClient(t, b.addr, 2), tc.key, ttlMS, 15000)
		n := 2
		if tc.name == "waiter-in-flight" {
			n = 3
		}
		waitLockNodes(t, zc, root, tc.key, n)
	}

	inflight := w.inflight[0].Load() + 1 // the queued waiter
	killAt, killWall := hist.Now(), time.Now()
	a.proc.Kill()
	w.dead[0].Store(true)
	code, err := a.proc.Wait(10 * time.Second)
	t.Logf("instance A (pid %d) SIGKILLed at %v: exit %d, %v; %d LOCKs through it in flight",
		a.proc.PID(), killAt.Round(time.Millisecond), code, err, inflight)
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
			if after > rivalBound {
				t.Errorf("%s: B's rival granted %v after A died; want within %v (session %d ms)", tc.name, after, rivalBound, sessMS)
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
	for end := time.Now().Add(10 * time.Second); len(keysAfter()) < keys && time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
	}
	w.halt()
	if got := keysAfter(); len(got) != keys {
		t.Errorf("workload keys granted through B after the kill: %v; want all %d", got, keys)
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
		"rivals on B granted after the kill: %s (session %d ms), after the previous holder's end: %s; %d overlaps, %d fence regressions, %d live writes rejected, %d late uses; "+
		"ledger %d accepted, %d rejected, %d lost",
		r.Grants, bAfter, w.errs[0].Load(), w.errs[1].Load(), w.lastErr.Load(), strings.Join(rivalTimes, ", "), sessMS, strings.Join(margins, ", "),
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

// TestPausedHolderFenced: a holder on instance A stops past its validity
// (Kleppmann's GC pause: its goroutine sleeps past the deadline it was
// told, then waits until the rival is done) while a client of instance B
// takes the lock and does its read-modify-write; then the stale holder
// writes. The fenced ledger must refuse the stale write; the same writes
// to an unfenced ledger (the negative control) are all accepted and lose
// the rival's update, so the test fails if the fence is not what saved
// the update.
func TestPausedHolderFenced(t *testing.T) {
	root := newRoot(t)
	ins := []*instance{startInstance(t, zkServers(), root), startInstance(t, zkServers(), root)}
	runPausedHolder(t, ins[0].addr, ins[1].addr)
}

// rivalResult is what a rival's LOCK … WAIT came to.
type rivalResult struct {
	at  time.Time
	err error
}

// startRival takes key through c with LOCK … WAIT, does its fenced ledger
// update, records the grant in hist and releases it; the result comes on
// the channel.
func startRival(hist *fault.History, ledger *fault.Ledger, c *redis.Client, key string, ttlMS, waitMS int) chan rivalResult {
	res := make(chan rivalResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(waitMS)*time.Millisecond+10*time.Second)
		defer cancel()
		g, ok, err := lockclient.TryLock(ctx, c, key, "PX", ttlMS, "WAIT", waitMS)
		at, enter := time.Now(), hist.Now()
		if err != nil || !ok {
			res <- rivalResult{err: fmt.Errorf("LOCK %s WAIT %d = %v, %v; want a grant", key, waitMS, ok, err)}
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
		res <- rivalResult{at: at}
	}()
	return res
}

// waitLockNodes waits up to 10 s for key to have n lock nodes under root.
func waitLockNodes(t *testing.T, c *gozk.Conn, root, key string, n int) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); lockNodes(t, c, root, key) != n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%s: %d lock nodes after 10 s; want %d", key, lockNodes(t, c, root, key), n)
		}
	}
}

// killWorkload is clients of each instance looping LOCK → fenced-ledger
// read-modify-write → UNLOCK over a few keys, every grant recorded.
type killWorkload struct {
	stop     chan struct{}
	once     sync.Once
	wg       sync.WaitGroup
	grants   [2]atomic.Int64
	errs     [2]atomic.Int64
	inflight [2]atomic.Int64
	// dead is set once the instance was killed.
	dead    [2]atomic.Bool
	lastErr atomic.Value
}

// startKillWorkload starts perInst clients on each of the two addrs.
func startKillWorkload(t *testing.T, hist *fault.History, ledger *fault.Ledger, addrs []string, perInst, keys, ttlMS, waitMS int) *killWorkload {
	w := &killWorkload{stop: make(chan struct{})}
	for i := range perInst * 2 {
		inst := i % 2
		cl := lc.NewClient(t, addrs[inst], 2)
		name := fmt.Sprintf("%c.c%d", "ab"[inst], i)
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
				key := fmt.Sprintf("w%d", rand.N(keys))
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(waitMS)*time.Millisecond+15*time.Second)
				w.inflight[inst].Add(1)
				r, ok, err := lockclient.TryLock(ctx, cl, key, "PX", ttlMS, "WAIT", waitMS)
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
				g.Read = ledger.Read(key, g.Fence)
				time.Sleep(rand.N(2 * time.Millisecond))
				g.Use = hist.Now()
				g.Rejected = !ledger.Write(key, g.Fence, g.Read+1)
				g.Exit = hist.Now()
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
func (w *killWorkload) halt() {
	w.once.Do(func() { close(w.stop) })
	w.wg.Wait()
}

// runPausedHolder is the paused-holder rounds, holder through addrA and
// rival through addrB, one round per holder TTL.
func runPausedHolder(t *testing.T, addrA, addrB string) {
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
