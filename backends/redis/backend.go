package redis

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// Config is the RedLock backend's configuration.
type Config struct {
	Nodes  []NodeConfig
	Quorum quorum.Config
	// RetryMin and RetryMax bound the random delay between attempts while a
	// LOCK waits and the lease that refused it is not known (or releases
	// are not announced to it yet): random so that contending clients fall
	// out of step. With the lease known, the waiter tries again when it
	// ends, up to RetryMin later, but no later than leaseSleepMax after
	// its last attempt (see Backend.leaseSleepMax).
	RetryMin, RetryMax time.Duration
	// Quarantine keeps a node that restarted out of every quorum for
	// MaxTTL plus drift, then re-seeds its fence counters from the other
	// nodes before it votes again.
	Quarantine bool
	// MaxTTL is the longest lease a client may ask for.
	MaxTTL time.Duration
	// CheckInterval is how often each node's run_id is read besides on
	// every new connection, and its TIME sampled; 0 disables the periodic
	// read, and with it the clock-rate measurement.
	CheckInterval time.Duration
	// MaxClockRateError is the measured clock rate error beyond which a
	// node stops voting (see clockrate.go); 0 never takes a node out.
	MaxClockRateError float64
	// Metrics gets the backend-wide gauges; nil takes the first node's.
	Metrics *Metrics
	Logger  *zap.Logger
}

// Backend serves locks from a quorum of Redis nodes.
type Backend struct {
	nodes    []*Node
	q        *quorum.Quorum
	holdQ    [2]*quorum.Quorum // by backends.Mode: releases and renews one kind of hold (holdkind.go)
	retryMin time.Duration
	retryMax time.Duration
	waiters  *waitQueues
	subs     []*subscriber
	log      *zap.Logger
	stop     context.CancelFunc
	wg       sync.WaitGroup
	// late counts the attempts of LOCK … WAITs under way, also those
	// that outlived their WAIT (see attemptBy): Close lets those give
	// their grants back before it closes the nodes.
	late sync.WaitGroup
	// lateMu guards closing, set once Close waits for late.
	lateMu  sync.Mutex
	closing bool

	driftFactor float64
	maxRateErr  float64
	driftMu     sync.Mutex // serializes updateDrift's writers
	// extraRatio holds the float64 bits of the drift allowance per unit
	// of TTL added by the measured clock rates; the quorum loads it on
	// every acquisition.
	extraRatio atomic.Uint64
	driftGauge prometheus.Gauge
}

var _ backends.Backend = (*Backend)(nil)

// New starts a client for every node. It does not wait for the nodes: a
// node that is down counts as failed in each quorum until it answers.
func New(cfg Config) (*Backend, error) {
	if len(cfg.Nodes) == 0 {
		return nil, errors.New("redis: no nodes configured")
	}
	b := &Backend{retryMin: cfg.RetryMin, retryMax: cfg.RetryMax}
	if b.retryMin <= 0 {
		b.retryMin = 20 * time.Millisecond
	}
	if b.retryMax < b.retryMin {
		b.retryMax = b.retryMin * 10
	}
	b.waiters = newWaitQueues(len(cfg.Nodes)/2+1, min(earlyWake, b.retryMin))
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	b.log = cfg.Logger
	var period time.Duration
	if cfg.Quarantine {
		period = QuarantinePeriod(cfg.MaxTTL, cfg.Quorum)
	}
	b.driftFactor, b.maxRateErr = cfg.Quorum.DriftFactor, cfg.MaxClockRateError
	if cfg.Metrics == nil && len(cfg.Nodes) > 0 {
		cfg.Metrics = cfg.Nodes[0].Metrics
	}
	if cfg.Metrics != nil {
		b.driftGauge = cfg.Metrics.driftExtra
	}
	qnodes := make([]quorum.Node, len(cfg.Nodes))
	for i, nc := range cfg.Nodes {
		nc.Quarantine = period
		nc.WriterMark = b.writerMark()
		nc.MaxClockRateError = cfg.MaxClockRateError
		if nc.Clock == nil {
			nc.Clock = cfg.Quorum.Clock
		}
		if nc.Logger == nil {
			nc.Logger = cfg.Logger
		}
		b.nodes = append(b.nodes, NewNode(nc))
		b.nodes[i].onClock = b.updateDrift
		qnodes[i] = b.nodes[i]
		b.subs = append(b.subs, newSubscriberLive(b.nodes[i], b.waiters.watched,
			func(key string) { b.waiters.wake(key, i) },
			func(key string, on bool) { b.waiters.subscribed(key, i, on) },
			func() { b.waiters.lost(i) }))
	}
	qc := cfg.Quorum
	if prev := qc.ExtraDrift; prev != nil {
		qc.ExtraDrift = func(ttl time.Duration) time.Duration { return b.extraDrift(ttl) + prev(ttl) }
	} else {
		qc.ExtraDrift = b.extraDrift
	}
	q, err := quorum.New(qnodes, qc)
	if err != nil {
		b.Close()
		return nil, fmt.Errorf("redis backend: %w", err)
	}
	b.q = q
	if b.holdQ, err = newHoldQuorums(b.nodes, qc); err != nil {
		b.Close()
		return nil, fmt.Errorf("redis backend: %w", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	b.stop = stop
	if cfg.CheckInterval > 0 {
		for i := range b.nodes {
			b.wg.Add(1)
			go b.watchNode(ctx, i, cfg.CheckInterval)
		}
	}
	return b, nil
}

// QuarantinePeriod is how long a restarted node stays out: the longest
// lease plus its drift allowance, by which time every lock the node may
// have granted before its restart has expired on the other nodes.
func QuarantinePeriod(maxTTL time.Duration, qc quorum.Config) time.Duration {
	return maxTTL + time.Duration(float64(maxTTL)*qc.DriftFactor) + qc.DriftMin
}

// watchNode reads node i's run_id every interval (at once first, so that a
// restart soon after start-up is seen as one) and re-seeds the node when
// its quarantine period is over; the same read learns its role (INFO
// replication). It returns when ctx ends.
func (b *Backend) watchNode(ctx context.Context, i int, every time.Duration) {
	defer b.wg.Done()
	n := b.nodes[i]
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, checkTimeout)
		n.check(cctx)
		if n.health.seedDue() {
			if err := b.reseed(cctx, i); err != nil {
				n.log.Warn("redis node stays quarantined: its fence counters could not be re-seeded yet",
					zap.String("reason", quorum.Reason(err)))
			}
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// checkTimeout bounds one check of a node, re-seed included.
const checkTimeout = 2 * time.Second

// errSeedSources means too few other nodes answered to re-seed a node.
var errSeedSources = errors.New("redis: too few nodes answered with their fence counters")

// reseed raises node i's fence counters to the per-slot maximum read from
// the other nodes, then lets it vote again. Every fence granted before the
// restart is on a majority; without node i at least Majority-1 of those
// kept it, so reading N-Majority+1 healthy other nodes meets at least one
// of them. Healthy is neither quarantined nor a replica: a replica's
// counters are its master's copy, not a state of its own, so it cannot
// stand for a node that kept the fences. If fewer healthy nodes exist at
// all, a majority lost its state and no read can restore the fences: the
// node is seeded from whatever answers, with an error logged, rather than
// staying out forever.
func (b *Backend) reseed(ctx context.Context, i int) error {
	need := len(b.nodes) - b.q.Majority() + 1
	healthy := 0
	for j, o := range b.nodes {
		if j != i && !o.health.stateLost() {
			healthy++
		}
	}
	lost := healthy < need
	type answer struct {
		h   map[string]string
		err error
	}
	answers := make(chan answer, len(b.nodes))
	asked := 0
	for j, o := range b.nodes {
		if j == i || (!lost && o.health.stateLost()) {
			continue
		}
		asked++
		go func(o *Node) {
			// A source that restarted since its last check is seen only
			// by the read's own new connection (onConnect), and the read
			// then runs on the empty server: its answer must not count as
			// a node that kept the fences (when a majority lost theirs,
			// every answer is taken). The generation is read first, as
			// Node.exec does.
			gen := o.health.gen.Load()
			h, err := o.readFences(ctx)
			if err == nil && !lost && (o.health.gen.Load() != gen || o.health.stateLost()) {
				err = errQuarantined
			}
			answers <- answer{h, err}
		}(o)
	}
	var hashes []map[string]string
	for ; asked > 0; asked-- {
		if a := <-answers; a.err == nil {
			hashes = append(hashes, a.h)
		}
	}
	if !lost && len(hashes) < need {
		return fmt.Errorf("%w: %d of %d", errSeedSources, len(hashes), need)
	}
	if err := b.nodes[i].seedFences(ctx, mergeFences(hashes)); err != nil {
		return err
	}
	if b.nodes[i].endQuarantine() && lost {
		b.log.Error("redis node voting again after a restart while a majority of nodes restarted too: "+
			"fences issued before may be issued again", zap.String("node", b.nodes[i].Name()))
	}
	return nil
}

// NodeStates describes each node for INFO, in configuration order, as
// "addr=…,state=ok|quarantined|replica|clock|down,quarantine_left_ms=…,restarts=…,
// rate_error_ppm=…", the last -1 until the node's clock rate is estimated.
func (b *Backend) NodeStates() []string {
	out := make([]string, len(b.nodes))
	for i, n := range b.nodes {
		st, left, restarts := n.State()
		ppm := int64(-1)
		if e, ok := n.ClockRateError(); ok {
			ppm = int64(math.Round(e * 1e6))
		}
		out[i] = fmt.Sprintf("addr=%s,state=%s,quarantine_left_ms=%d,restarts=%d,rate_error_ppm=%d",
			n.Name(), st, left, restarts, ppm)
	}
	return out
}

// The drift rule. RedLock's drift allowance covers nodes whose clocks run
// within drift_factor of the proxy's. Safety needs that of every node a
// grant may count, not only of most of them: A may hold exactly a majority
// and B win another majority that shares a single node with it, so one
// node expiring A's key early is enough for an overlap. The rule therefore
// takes the largest measured rate error e among the nodes that may vote,
// every node but those out of bound (which do not vote), and adds
// ttl × max(0, e − drift_factor) to the drift. A node without an estimate
// yet (fewer than 5 samples or less than 10 s of them, or just restarted)
// counts as within drift_factor, as it did before the clock was measured;
// a node that is down keeps its last estimate. The largest error is
// simpler than a majority-order statistic and never smaller, at the price
// of shorter validities when one node's clock is off but within bound.

// updateDrift recomputes the extra drift after a node's estimate changed.
// It runs on the health checks, never on an operation.
func (b *Backend) updateDrift() {
	b.driftMu.Lock()
	defer b.driftMu.Unlock()
	worst := 0.0
	for _, n := range b.nodes {
		e, ok := n.ClockRateError()
		if !ok || (b.maxRateErr > 0 && e > b.maxRateErr) {
			continue
		}
		worst = max(worst, e)
	}
	extra := max(0, worst-b.driftFactor)
	b.extraRatio.Store(math.Float64bits(extra))
	if b.driftGauge != nil {
		b.driftGauge.Set(extra)
	}
}

// ExtraDriftRatio is the drift allowance per unit of TTL currently added
// by the measured clock rates.
func (b *Backend) ExtraDriftRatio() float64 { return math.Float64frombits(b.extraRatio.Load()) }

// extraDrift is quorum.Config.ExtraDrift: one atomic load per acquisition.
func (b *Backend) extraDrift(ttl time.Duration) time.Duration {
	r := b.ExtraDriftRatio()
	if r == 0 {
		return 0
	}
	// Rounded up: the allowance must not come out short.
	return time.Duration(math.Ceil(float64(ttl) * r))
}

// Quorum exposes the algorithm, for INFO and tests.
func (b *Backend) Quorum() *quorum.Quorum { return b.q }

// Nodes returns the node clients.
func (b *Backend) Nodes() []*Node { return b.nodes }

// earlyWake is how long after a release's first announcement the head of
// the key's queue tries even though fewer than a majority of nodes have
// announced it. The nodes announce one release within about a millisecond
// of each other on a LAN (it goes to all of them at once), so the rest are
// not coming soon: their subscriptions are down or lag (a link that was
// slow delivers them late for a while after it heals), and waiting for
// them would leave every release to the waiters' retry timers.
const earlyWake = 5 * time.Millisecond

// Lock implements backends.Backend. Without Wait it tries once. With Wait
// the caller joins the key's queue of waiters on this instance and tries
// only at its head: at once when the waiter before it gave up or there was
// none, whenever a majority of nodes announced a release of the key
// (through whichever instance it was made), earlyWake after a release was
// announced by fewer (a node's subscription is down or lagging), and
// otherwise, for an expiry (never announced), when the lease of the hold
// that refused its last attempt on a majority of nodes ends (see
// refusals.until; a promoted head takes the lease of the grant before
// it), up to RetryMin later so that waiters of several instances fall out
// of step, and not before RetryMin; but never more than leaseSleepMax
// after its last attempt, since the key can also become free unannounced
// long before that lease ends (see leaseSleepMax). So a head makes about
// one attempt per release, and one per leaseSleepMax while the key stays
// held. Where no one hold refused it on a majority (the votes were split
// between attempts, whose grants are rolled back unannounced; nodes
// failed; a key without expiry), or no node had confirmed the key's
// subscription when it tried (a release could go unheard), it tries again
// after a random delay in [RetryMin, RetryMax], as before leases were
// reported.
//
// A writer's refused attempts mark it waiting on the nodes (writer
// preference); one that leaves without the lock takes its mark off them
// (Node.Unmark) before the waiter behind it is signaled, so that a reader
// behind it is not refused by the mark of a writer that is gone.
func (b *Backend) Lock(ctx context.Context, req backends.LockRequest) (backends.Lease, error) {
	// A token lockproxy made for this request alone (LOCK or RLOCK
	// without TOKEN): a refused attempt rolls back a node that has not
	// answered without hearing it out, so that a silent node neither
	// keeps a waiter from trying again when the key is released nor holds
	// a refused LOCK's nil up by two node timeouts (see
	// quorum.Request.OwnToken). A LOCK or RLOCK with TOKEN (not
	// NoReentry) is refused as fast, its roll-back to such a node scoped
	// to the attempt (Node sends it as lateGrantReleaseScript or
	// lateReadReleaseScript). Never transparent mode's SET NX, whose
	// token is the client's value and whose attempt has no mark.
	qreq := quorum.Request{Key: req.Key, Token: req.Token, TTL: req.TTL, Mode: quorum.Exclusive, NoReentry: req.NoReentry,
		OwnToken: req.OwnToken && req.NoReentry}
	if req.Mode == backends.Read {
		qreq.Mode = quorum.Shared
	}
	if req.Wait <= 0 {
		return b.tryOnce(ctx, qreq)
	}
	end := time.Now().Add(req.Wait)
	// An attempt of the same token under way here keeps ours waiting at
	// most until the WAIT ends (see quorum.enterJoin).
	qreq.JoinBy = end
	deadline := time.NewTimer(req.Wait)
	defer deadline.Stop()
	// A waiter that names its token may hold the key already: then it is
	// let try out of its turn (see waiter.token).
	var reentry string
	if !req.NoReentry {
		reentry = req.Token
	}
	w := b.join(req.Key, req.Mode == backends.Read, reentry)
	var (
		granted   bool
		heldUntil time.Time // the granted lease's end at the latest
		marked    bool      // an attempt may have left this writer's mark
		refused   bool      // an attempt of this writer was refused somewhere
		handedOff bool      // an attempt outlived the answer: it ends the wait (left)
	)
	// left takes this writer's mark off the nodes, if it may have left
	// one, and leaves the queue, in that order; run when Lock returns, or,
	// when an attempt outlived its answer (attemptBy), once that attempt
	// has ended.
	left := func() {
		if marked && !granted {
			// Queued on the nodes before the next waiter is signaled,
			// so its attempt finds the mark gone.
			b.unmark(b.nodes, req.Key, req.Token)
		}
		b.leave(w, granted, heldUntil)
	}
	defer func() {
		if !handedOff {
			left()
		}
	}()

	err := backends.ErrNotAcquired
	var retry *time.Timer
	var retryC <-chan time.Time // nil while no retry is due
	// A waiter that never reached the head returns ErrNotAcquired without
	// having tried: first come, first served.
	defer func() {
		if retry != nil {
			retry.Stop()
		}
	}()
	// armRetry sets the fallback attempt for a key that may be free at
	// until (zero: not known, or releases may go unheard). There is always
	// one, also when until is past the WAIT's end: a lease told is only
	// the latest the key may stay held, and some freeings before it are
	// never announced (see leaseSleepMax).
	armRetry := func(until time.Time) {
		var delay time.Duration
		if until.IsZero() {
			delay = b.retryMin + rand.N(b.retryMax-b.retryMin+1)
		} else {
			delay = max(min(time.Until(until), b.leaseSleepMax())+rand.N(b.retryMin+1), b.retryMin)
		}
		if retry == nil {
			retry = time.NewTimer(delay)
		} else {
			retry.Reset(delay)
		}
		retryC = retry.C
	}
	for {
		// Only the head is signaled, and only the head's retry timer runs.
		select {
		case <-w.turn:
		case <-retryC:
		case <-w.promoted:
			var until time.Time
			if b.waiters.hearsReleases(req.Key) {
				until = b.waiters.promotion(w)
			}
			armRetry(until)
			continue
		case <-deadline.C:
			return backends.Lease{}, err
		case <-ctx.Done():
			return backends.Lease{}, err
		}
		if !b.waiters.isHead(w) {
			// Signaled out of turn: the head was refused by a hold
			// this waiter's attempt may join (waiter.mayJoin). It leaves
			// no writer mark (it is not waiting for anyone), and a
			// refusal (the hold ended meanwhile) sends it back to wait
			// for its turn, with no retry of its own: only the head's
			// runs.
			out := qreq
			out.WriterWait = 0
			started := time.Now()
			lease, answered, aerr := b.attemptBy(ctx, deadline.C, out, req.Mode, left)
			if !answered {
				handedOff = true
				return backends.Lease{}, err
			}
			err = aerr
			if err == nil {
				granted = true
				heldUntil = started.Add(req.TTL)
				return lease, nil
			}
			if ctx.Err() != nil || errors.Is(err, backends.ErrUpgrade) {
				return backends.Lease{}, err
			}
			b.waiters.refusedOutOfTurn(w)
			continue
		}
		if qreq.Mode == quorum.Exclusive {
			// Mark this writer waiting on the nodes until well after its
			// next attempt (see luaMarks), so readers on every instance
			// queue behind it, but not past its WAIT.
			qreq.WriterWait = time.Until(end)
			marked = marked || qreq.WriterWait > 0
		}
		// Read before the attempt: a release after it is then announced.
		heard := b.waiters.hearsReleases(req.Key)
		rs := &refusals{}
		started := time.Now()
		lease, answered, aerr := b.attemptBy(withRefusals(ctx, rs), deadline.C, qreq, req.Mode, left)
		if !answered {
			handedOff = true
			return backends.Lease{}, err
		}
		err = aerr
		if err == nil {
			granted = true
			heldUntil = started.Add(req.TTL)
			if qreq.WriterWait > 0 {
				// The nodes that granted took this writer's mark off.
				// Those that refused set it, also those whose refusal
				// comes after the majority's grants (they take it off
				// themselves: see refusals.won), and those that did not
				// grant may keep one from an earlier attempt: a mark
				// left keeps readers out until it ends.
				b.unmark(rs.won(b.nodes, refused, req.Key, req.Token), req.Key, req.Token)
			}
			return lease, nil
		}
		if ctx.Err() != nil || errors.Is(err, backends.ErrUpgrade) {
			return backends.Lease{}, err
		}
		refused = refused || rs.refusedAny()
		b.watch(req.Key)
		b.waiters.refused(req.Key)
		b.waiters.heldBy(req.Key, rs.holder(b.q.Majority()))
		until, ok := rs.until(b.q.Majority())
		if !ok || !heard {
			until = time.Time{}
		}
		armRetry(until)
	}
}

// attemptBy makes one attempt of a LOCK … WAIT and waits for its answer
// until the WAIT ends (expired fires) or ctx is done, and reports whether
// it got one (answered). An attempt can take far longer than a healthy
// node's round trip: where a node does not answer (a blackholed link, a
// paused server), a refused attempt hears that node out for the node
// timeout and then waits up to another for its roll-back there, so the
// answer of one started just before the WAIT's end came up to about two
// node timeouts late (TestWaitEndsOnTimeWithSilentNode). Past the WAIT's
// end the client is answered at once, and the attempt finishes on its
// own: it runs without ctx's cancellation, which comes as soon as the
// client is answered, so that it hears out every node and rolls back as
// it would have. ctx done while Lock waits (the client gone, CLIENT
// UNBLOCK, shutdown) cancels the attempt, as it did before, and is
// answered at once too. Either way a grant the attempt makes is given
// back, as nobody is told of it, and a writer's mark it may have left on
// the nodes is taken off after it, and only then does the waiter leave
// the queue (after, Lock's left): the waiters behind it try once that
// attempt has ended, as when Lock waited for it, not beside an attempt
// that may still be granted (then given back) or refused (then leave a
// writer's mark, taken off only after it). Both are bounded by the node
// timeouts.
func (b *Backend) attemptBy(ctx context.Context, expired <-chan time.Time, req quorum.Request, mode backends.Mode, after func()) (backends.Lease, bool, error) {
	type answer struct {
		lease backends.Lease
		err   error
	}
	done := make(chan answer) // taken only while Lock waits for it
	gaveUp := make(chan struct{})
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	tracked := b.trackLate()
	go func() {
		if tracked {
			defer b.late.Done()
		}
		defer cancel()
		l, err := b.tryOnce(actx, req)
		select {
		case done <- answer{l, err}:
			return
		case <-gaveUp:
		}
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), b.lateReleaseTimeout())
		defer rcancel()
		if err == nil {
			if _, err := b.UnlockHold(rctx, req.Key, req.Token, mode); err != nil {
				b.log.Warn("giving back a grant that came after its LOCK … WAIT was answered failed; the lease will expire on its own",
					zap.Error(fmt.Errorf("release of a late %v grant: %w", mode, err)))
			}
		}
		after()
	}()
	select {
	case a := <-done:
		return a.lease, true, a.err
	case <-expired:
	case <-ctx.Done():
		cancel()
	}
	close(gaveUp)
	return backends.Lease{}, false, nil
}

// trackLate counts an attempt in late, unless Close has begun waiting for
// them: an Add then would race with its Wait. An attempt made that late
// finishes on nodes being closed, which answer it at once.
func (b *Backend) trackLate() bool {
	b.lateMu.Lock()
	defer b.lateMu.Unlock()
	if b.closing {
		return false
	}
	b.late.Add(1)
	return true
}

// lateReleaseTimeout bounds the release of a grant that came after its
// LOCK … WAIT was answered: the quorum's longest node timeout, which the release gives
// each node anyway, and a second for the nodes' queues.
func (b *Backend) lateReleaseTimeout() time.Duration {
	return b.q.NodeTimeout(time.Duration(math.MaxInt64)) + time.Second
}

// leaseSleepMax is the longest a head sleeps on a lease it was told
// (a refusal's, or its predecessor's grant's) before trying again:
// max(1 s, 5 × RetryMax). The lease is only the latest the key may stay
// held; it becomes free earlier without an announcement this instance
// hears when it is deleted in transparent mode (DEL, UNLINK, a library's
// compare-and-delete script), when the longest reader unlocks while a
// shorter one remains (nothing is freed, so nothing is published) and
// the shorter lease then ends, when RENEW shortens a lease that then
// ends, or when the node user may SUBSCRIBE but not PUBLISH (the release
// script's PUBLISH fails quietly); a promoted head, which sleeps on its
// predecessor's TTL, meets the same cases. Each is then found within
// this bound rather than at the lease's end, past the WAIT for long
// leases.
// 1 s keeps a head on a held key at about one attempt a second, several
// times below the jittered retry's (one per RetryMin–RetryMax, 13–16 in
// 1.5 s by default); scaling with RetryMax keeps it so where an operator
// raised RetryMax to spare the nodes.
func (b *Backend) leaseSleepMax() time.Duration { return max(time.Second, 5*b.retryMax) }

// unmark takes token's waiting-writer mark on key off nodes, without
// waiting for them (Node.Unmark).
func (b *Backend) unmark(nodes []*Node, key, token string) {
	for _, n := range nodes {
		n.Unmark(key, token)
	}
}

// writerMark is the margin by which a waiting writer's mark on the nodes
// outlasts the lease that refused it (when its next attempt is due at the
// latest): three of its longest retry delays, so the mark outlives the
// gap to that attempt, which renews it, also where the lease was not
// known, and a writer whose instance is gone stops holding readers back
// soon after.
func (b *Backend) writerMark() time.Duration { return max(3*b.retryMax, time.Second) }

// join queues a waiter for key, whose attempts may join a hold of token
// ("" for none: see waiter.token). One that joins behind another
// subscribes the key's release announcements on every node, if that is
// not done yet.
func (b *Backend) join(key string, read bool, token string) *waiter {
	w, watch := b.waiters.joinToken(key, read, token)
	if watch {
		b.updateSubscriptions(key)
	}
	return w
}

// watch subscribes key's release announcements on every node after a
// failed attempt, if that is not done yet.
func (b *Backend) watch(key string) {
	if b.waiters.watch(key) {
		b.updateSubscriptions(key)
	}
}

// leave takes w out of its queue and, after the last waiter of a watched
// key, unsubscribes the key's announcements. heldUntil is the end of a
// granted w's lease, for the waiter promoted behind it.
func (b *Backend) leave(w *waiter, granted bool, heldUntil time.Time) {
	if b.waiters.leaveHeld(w, granted, heldUntil) {
		b.updateSubscriptions(w.key)
	}
}

func (b *Backend) updateSubscriptions(key string) {
	for _, s := range b.subs {
		s.update(key)
	}
}

// Waiting is the number of LOCK … WAIT calls queued on this instance.
func (b *Backend) Waiting() int { return b.waiters.len() }

func (b *Backend) tryOnce(ctx context.Context, req quorum.Request) (backends.Lease, error) {
	l, err := b.q.Acquire(ctx, req)
	switch {
	case err == nil:
		return backends.Lease{Token: l.Token, Validity: l.Validity, Fence: l.Fence, Holds: l.Holds, At: time.Now()}, nil
	case errors.Is(err, quorum.ErrNotAcquired), errors.Is(err, quorum.ErrExpired):
		return backends.Lease{}, backends.ErrNotAcquired
	case errors.Is(err, quorum.ErrUpgrade):
		return backends.Lease{}, backends.ErrUpgrade
	default:
		return backends.Lease{}, err
	}
}

// Unlock implements backends.Backend.
func (b *Backend) Unlock(ctx context.Context, key, token string) (bool, error) {
	// Local waiters learn of the release from the nodes' announcements,
	// like everyone else's: waking them here as well would make the
	// announcements that follow look like a second release.
	return b.q.Release(ctx, key, token, 0)
}

// Renew implements backends.Backend: the quorum's Extend, but told which
// kind of hold each node renewed. A downgraded token holds the key for
// writing and reading, and a node where it holds only the read hold (it
// missed the write grant) renews that: such a node must not count towards
// renewing the write hold. Where the write hold was renewed on fewer nodes
// than a majority, but on a majority counting the nodes that failed, the
// write hold may be on that majority, its holder relying on it: the
// renewal is undecided (NOQUORUM), not told as the write hold's while the
// nodes that renewed only a read hold let readers in once the failed
// nodes' lease ends (TestRenewOfDowngradeCountsWriteHolds). Otherwise
// every renewed hold counts, as in quorum.Extend: a write hold on too few
// nodes for the failed ones to make a majority was lost already.
func (b *Backend) Renew(ctx context.Context, key, token string, ttl time.Duration) (time.Duration, error) {
	start := time.Now()
	n, need := len(b.nodes), b.q.Majority()
	// The nodes not waited for still finish, even once the caller's
	// context ends (as quorum.Extend's do). Its deadline is the quorum's
	// kind, without a timer: one that fires during a stop of the process
	// must not fail at random the renewals handed over after it, and
	// those handed over past the deadline are judged as having waited out
	// the stop in the node's queue (see quorum.DeadlineSet).
	nodeCtx := quorum.NodeContext(ctx, b.q.NodeTimeout(ttl))
	type answer struct {
		idx  int
		kind int64
		err  error
	}
	answers := make(chan answer, n) // buffered: a late answer never blocks
	for i, nd := range b.nodes {
		nd.startExtendKind(nodeCtx, key, token, ttl, func(kind int64, err error) {
			answers <- answer{i, kind, err}
		})
	}
	var writes, reads, got int
	var failures []quorum.NodeError
	// Decided: the write hold renewed on a majority, or read holds
	// renewed on a majority and no write hold (the nodes left cannot
	// make the write hold a majority's).
	for ; got < n && writes < need && (writes > 0 || reads < need); got++ {
		a := <-answers
		switch {
		case a.err != nil:
			failures = append(failures, quorum.NodeError{Node: b.nodes[a.idx].Name(), Err: a.err})
		case a.kind == extendedWrite:
			writes++
		case a.kind == extendedRead:
			reads++
		}
	}
	oks := writes + reads
	undecided := &quorum.NoQuorumError{OK: n - len(failures), Total: n, Failures: failures}
	if writes > 0 && writes < need && writes+len(failures) >= need {
		return 0, undecided
	}
	if oks < need {
		if oks+len(failures) >= need {
			return 0, undecided
		}
		return 0, nil
	}
	validity := ttl - time.Since(start) - b.q.Drift(ttl)
	if validity < time.Millisecond {
		return 0, nil
	}
	return validity, nil
}

// Ready implements backends.Backend: a majority of nodes must answer PING
// and be allowed to vote. A node that answers while quarantined after a
// restart or a promotion from replica, out for its clock, or a replica,
// grants nothing, so it counts as failed here as in every quorum (the test
// lockproxy_node_voting makes). The role is also read here, with the PING:
// a node made a replica since its last health check grants nothing
// already, and /readyz promises a lock can be granted now. That read
// changes nothing in the node's health: only the checks do, in order.
//
// A node that answers PING may still refuse every write, and so every
// grant: maxmemory reached under noeviction (OOM), a failed RDB save with
// stop-writes-on-bgsave-error (MISCONF), fewer replicas than
// min-replicas-to-write (NOREPLICAS). Each node therefore also gets the
// write that every new connection to it sends (HINCRBY of the fence
// hash's pad by 0, which changes no value), and one it refuses counts as
// failed.
//
// LOCK and RLOCK grants, releases and renewals are scripts sent with
// EVALSHA (see Node.send; only transparent mode's SET NX grants are plain
// commands, and their releases are scripts): a node that takes writes but
// refuses scripts (an ACL without @scripting or EVALSHA, EVALSHA renamed
// away) refuses every LOCK. Each node therefore also runs a script that
// does nothing, by SHA as the batches send theirs, loaded with EVAL when
// the node does not have it, as they are; one refused counts as failed.
func (b *Backend) Ready(ctx context.Context) error {
	type res struct {
		name string
		err  error
	}
	ch := make(chan res, len(b.nodes))
	for _, n := range b.nodes {
		go func(n *Node) {
			pipe := n.client.Pipeline()
			ping := pipe.Ping(ctx)
			repl := pipe.Info(ctx, "replication")
			write := pipe.HIncrBy(ctx, n.fenceKey, fenceHashPad, 0)
			probe := pipe.EvalSha(ctx, scriptProbe.sha, nil)
			_, _ = pipe.Exec(ctx) // per-command errors are read from the commands
			err := ping.Err()
			if err == nil {
				// Read after the PING: a restart that the PING's new
				// connection revealed has quarantined the node by now.
				err = n.health.refuse()
			}
			if err == nil {
				// A refused INFO (an ACL, a server without it) leaves
				// the role to what the checks know.
				if info, ierr := repl.Result(); ierr == nil && parseReplInfo(info).role == "slave" {
					err = errReplica
				}
			}
			if werr := write.Err(); err == nil && werr != nil {
				err = fmt.Errorf("redis: node refuses writes: %w", werr)
			}
			if err == nil {
				perr := probe.Err()
				if perr != nil && goredis.HasErrorPrefix(perr, "NOSCRIPT") {
					perr = n.client.Eval(ctx, scriptProbe.src, nil).Err()
				}
				if perr != nil {
					err = fmt.Errorf("redis: node refuses scripts: %w", perr)
				}
			}
			ch <- res{n.Name(), err}
		}(n)
	}
	var failures []quorum.NodeError
	for range b.nodes {
		r := <-ch
		if r.err != nil {
			failures = append(failures, quorum.NodeError{Node: r.name, Err: r.err})
		}
	}
	if len(b.nodes)-len(failures) < b.q.Majority() {
		return &quorum.NoQuorumError{OK: len(b.nodes) - len(failures), Total: len(b.nodes), Failures: failures}
	}
	return nil
}

// Close stops the subscriptions and every node client.
func (b *Backend) Close() error {
	// The attempts of WAITs that ended are bounded by the node timeouts;
	// the nodes must still be there for their roll-backs and give-backs.
	b.lateMu.Lock()
	b.closing = true
	b.lateMu.Unlock()
	b.late.Wait()
	if b.q != nil {
		// So are the roll-backs that refused attempts of theirs sent
		// without waiting (quorum.Request.OwnToken), bounded alike.
		ctx, cancel := context.WithTimeout(context.Background(), b.lateReleaseTimeout())
		_ = b.q.WaitRollbacks(ctx)
		cancel()
	}
	if b.stop != nil {
		b.stop()
		b.wg.Wait()
	}
	for _, s := range b.subs {
		s.close()
	}
	var errs []error
	for _, n := range b.nodes {
		errs = append(errs, n.Close())
	}
	return errors.Join(errs...)
}
