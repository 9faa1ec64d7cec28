package redis

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/conf"
	"github.com/lockproxy/lockproxy/quorum"
)

// NodeConfig describes one Redis node.
type NodeConfig struct {
	Addr     string
	Username string
	Password string
	// TLS, when set, is the TLS client configuration for the node; its
	// ServerName defaults to Addr's host.
	TLS *tls.Config
	// KeyPrefix is put before every lock key and the fence hash on the node.
	KeyPrefix string
	// PoolSize is the number of go-redis connections to the node.
	PoolSize int
	// Workers is the number of batching writers; each key always goes
	// through the same writer, so the operations on one key reach the node
	// in the order they were made.
	Workers int
	// MaxBatch caps how many operations one pipelined write carries.
	MaxBatch    int
	DialTimeout time.Duration
	// Timeout bounds a batch whose operations carry no deadline.
	Timeout time.Duration
	Metrics *Metrics
	// Quarantine is how long the node stays out of every quorum once it
	// restarted (a new run_id): at least the longest lease plus drift, so
	// the locks it forgot have expired on the other nodes. 0 disables it.
	Quarantine time.Duration
	// Logger gets the node's restarts and configuration warnings; nil
	// logs nothing.
	Logger *zap.Logger
	// Clock, when set, replaces the system clock for the quarantine and
	// for the clock-rate samples (tests).
	Clock quorum.Clock
	// MaxClockRateError is the clock rate error (|rate − 1| against the
	// proxy's clock) beyond which the node stops voting; 0 never takes it
	// out.
	MaxClockRateError float64
	// WriterMark is how long a waiting writer's mark outlasts the lease
	// that refused it (see luaMarks); the Backend sets it from its retry
	// delays. 0 takes defaultMarkMargin.
	WriterMark time.Duration
}

type opKind uint8

const (
	opAcquire opKind = iota
	opRaiseFence
	opRelease
	opExtend
	opUnmark // a waiting writer's mark taken away (unmarkScript)
	numOps
)

var opNames = [numOps]string{"acquire", "raise_fence", "release", "extend", "unmark"}

// opSettle is Node.startSettle's marker: nothing is sent for it, and the
// writer answers it once the batch it came in was answered. It is past
// numOps: it is no operation on the node, and has no metrics.
const opSettle = numOps

// opResult is a node's answer to one op: n is 1/0 for a compare-and-act,
// the fence (or acquireRefused, acquireUpgrade) for an acquire, whose hold
// count is in holds.
type opResult struct {
	n       int64
	holds   int64
	counter int64 // a reentrant acquire's slot counter
	// A refused acquire's lease: the ms left until the key may be free
	// again unless released (see acquireScript), when leased; and who
	// holds it (the holder's token, readMarker, or a waiting writer's).
	lease  int64
	leased bool
	holder string
	err    error
}

// Acquire answers other than a fence.
const (
	acquireRefused = -1 // held by someone else
	acquireUpgrade = -2 // held for reading by this token; refused
)

type op struct {
	kind      opKind
	base      string // the client's key (on the node: prefix "lock:" base)
	mode      quorum.Mode
	noReentry bool
	// attempt names an acquire that may join a hold of its token: an
	// exclusive one with TOKEN, whose first step is acquireMarkedScript,
	// which marks a hold it makes afresh with it (in lockm), and every
	// read one, whose grant stores it as the token's mark among the
	// readers (readScript). So its roll-back when its answer is lost
	// removes that hold and never one the token had before, also one whose
	// fence write was lost (see lateGrantReleaseScript and
	// lateReadReleaseScript). On a release it is the attempt that release
	// rolls back ("" for one without a mark).
	attempt string
	// hold is which holds a release may remove; on an extend, AnyHold
	// is RENEW's (extendScript), WriteHold or ReadHold a watchdog's
	// renewal of that kind only (Node.extendHold).
	hold quorum.Hold
	// lateGrant marks a release that rolls back an acquire in doubt: it
	// goes out as lateGrantReleaseScript (see owed.written), with
	// lateMark when that acquire was marked by its node (mark).
	lateGrant bool
	lateMark  string
	// scoped marks the roll-back of a marked attempt (op.attempt) whose
	// answer from this node the quorum did not hear, or heard granting
	// afresh (quorum.RollbackScoped): it goes out as the roll-back of an
	// acquire in doubt, which removes only a hold the attempt made afresh
	// and still marks, never one the token had (the attempt was refused,
	// or joined it), one a later attempt of the token made or joined, nor
	// one a renewal of the token counted since.
	scoped bool
	// mark is the name an unnamed exclusive acquire (no attempt: a LOCK …
	// WAIT without TOKEN) sent as acquireScript marks its hold with: that
	// script stores the hold's fence in the same step, so the unmarked
	// roll-back rule (no stored fence) would keep a hold whose answer was
	// lost until its TTL; its doubt carries the mark instead (see
	// addAcquireScript).
	mark string
	// rollback marks a failed acquisition's release (quorum.Rollback):
	// only it settles an acquire in doubt, never a holder's UNLOCK.
	rollback bool
	waitMs   int64 // writer-waiting mark to leave when refused: at most this long, ms
	token    string
	ms       int64 // TTL in ms
	slot     uint16
	fence    uint64
	start    time.Time
	deadline time.Time
	// handedLate says the op was handed to the node past the deadline the
	// quorum set for it (see start): it passed in lockproxy itself.
	handedLate bool
	// The answer goes to done when it is set, else to res. res is
	// buffered 1, so the writer never blocks on it; done is the quorum's
	// callback, which must not block either.
	res  chan opResult
	done func(opResult)
	// queued says the op is counted in its node's inFlight until it is
	// answered (see Node.track); qslot is the slot it is counted in,
	// so that finish need not hash base again.
	queued bool
	qslot  uint16
}

var opPool = sync.Pool{New: func() any { return &op{res: make(chan opResult, 1)} }}

// Node is one Redis node seen through Lua scripts. Operations from all
// clients are queued per writer and sent as one pipelined write per batch:
// under load one write and one read on the socket carry many clients'
// commands, which is where a proxy beats a library that talks to each node
// from each client.
type Node struct {
	name   string
	client *goredis.Client
	// For the writers' own connections (nodeConn).
	username, password string
	dialTimeout        time.Duration
	tls                *tls.Config // nil without TLS
	prefix             string
	fenceKey           string
	epochKey           string // the node's data epoch (see nodeConn.epoch)
	timeout            time.Duration
	maxBatch           int
	queues             []chan *op
	stop               chan struct{}
	wg                 sync.WaitGroup
	metrics            *Metrics
	closeMu            sync.Once
	closing            sync.RWMutex
	closed             bool
	// Per-node metric children, resolved once: a label lookup per
	// operation costs more than the observation.
	durations [numOps]prometheus.Observer
	batches   prometheus.Observer

	health      *health
	log         *zap.Logger
	quarantined prometheus.Gauge
	restarts    prometheus.Counter

	clock        *nodeClock
	maxRateError float64
	clockGauge   prometheus.Gauge
	// onClock runs after each new rate estimate (the backend's drift rule).
	onClock func()

	// Warnings given once per node.
	noInfoOnce      sync.Once
	noClientIDOnce  sync.Once
	noEpochOnce     sync.Once
	noTimeOnce      sync.Once
	persistChecked  atomic.Bool
	configDeniedLog sync.Once

	// beforeFenceStore, set by tests only, runs before a batch's fence
	// writes are written: it holds them back to order them after other
	// operations.
	beforeFenceStore func()
	// beforeWrite, set by tests only, runs in a batch's send between its
	// deadline being set and its write (writer goroutine).
	beforeWrite func()
	// subscribePing, set by tests only, replaces subscribePingEvery for
	// the subscribers made on this node.
	subscribePing time.Duration
	// markMargin is NodeConfig.WriterMark in ms.
	markMargin int64
	// inFlight counts, per key slot, the operations queued on the
	// writers and not yet answered (see track): a transparent write waits
	// for its keys' writers only where one of its keys has some (see
	// settleKeys). Keys that share a slot share a count, which costs
	// nothing but a wait that was not needed.
	inFlight [numSlots]atomic.Int32
	// unsentAttempts are marked acquires (op.attempt) given up before
	// they were sent (their caller gone before the writer took them, the
	// writer past their deadline, no connection), each until its TTL has
	// passed. The quorum may decide, and roll back, before such an
	// attempt's answer comes; its roll-back has nothing to undo here and
	// is answered without being sent, where a release would take a hold
	// its token had before.
	unsentMu       sync.Mutex
	unsentAttempts []unsentAttempt
	// erredAcquires are acquires the node answered with an error (OOM,
	// BUSY, MISCONF, READONLY, NOPERM, a reply that made no sense), each
	// until its TTL has passed: the acquire did not run there, or stopped
	// part way, so its roll-back must remove only a hold the acquire
	// itself made, as the roll-back of one in doubt does (see
	// undoesErred). Under unsentMu.
	erredAcquires []erredAcquire
}

// erredAcquire is an acquire answered with an error (see
// Node.erredAcquires): its key, token, attempt ("" when unnamed) and the
// mark its node gave it (op.mark), if any.
type erredAcquire struct {
	base, token, attempt, mark string
	until                      time.Time
}

// numSlots is the number of key slots (see slot).
const numSlots = 16384

// track counts o in its key slot's inFlight until finish answers it.
// Called before o is queued, so that whoever hears of an answer that
// depends on o (a quorum answered by a majority while o waits for the
// last node) finds it counted.
func (n *Node) track(o *op) {
	o.queued, o.qslot = true, slot(o.base)
	n.inFlight[o.qslot].Add(1)
}

// busy tells whether an operation on key base (or on a key of its slot)
// is queued on a writer and not yet answered.
func (n *Node) busy(base string) bool { return n.inFlight[slot(base)].Load() > 0 }

// defaultMarkMargin is a waiting writer's mark margin in ms on a Node
// used without a Backend: the Backend's least (Backend.writerMark).
const defaultMarkMargin = 1000

// NewNode starts the writers of the node at cfg.Addr, each making its
// connection at once.
func NewNode(cfg NodeConfig) *Node {
	if cfg.Workers <= 0 {
		cfg.Workers = 1
	}
	if cfg.PoolSize < cfg.Workers {
		cfg.PoolSize = cfg.Workers
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 256
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	n := &Node{
		name:        cfg.Addr,
		username:    cfg.Username,
		password:    cfg.Password,
		prefix:      cfg.KeyPrefix,
		dialTimeout: cfg.DialTimeout,
		fenceKey:    cfg.KeyPrefix + "fence",
		epochKey:    cfg.KeyPrefix + "epoch",
		timeout:     cfg.Timeout,
		maxBatch:    cfg.MaxBatch,
		queues:      make([]chan *op, cfg.Workers),
		stop:        make(chan struct{}),
		metrics:     cfg.Metrics,
		health:      newHealth(cfg.Quarantine, clockFunc(cfg.Clock)),
		log:         cfg.Logger.With(zap.String("node", cfg.Addr)),
		clock:       newNodeClock(),

		maxRateError: cfg.MaxClockRateError,
		tls:          nodeTLS(cfg.TLS, cfg.Addr),
		markMargin:   defaultMarkMargin,
	}
	if cfg.WriterMark > 0 {
		n.markMargin = max(1, cfg.WriterMark.Milliseconds())
	}
	n.client = goredis.NewClient(&goredis.Options{
		Addr:     cfg.Addr,
		Username: cfg.Username,
		Password: cfg.Password,
		Protocol: 2,
		// The quorum decides about retries: a retry here would spend the
		// lease's time behind the algorithm's back.
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
		DialTimeout:           cfg.DialTimeout,
		// One dial per attempt: go-redis's default of five dials 100 ms
		// apart outlasts the node timeout, so a dead node would read as
		// "timeout" instead of "connection refused" and slow every release.
		DialerRetries:   1,
		PoolSize:        cfg.PoolSize,
		MinIdleConns:    1,
		DisableIdentity: true,
		// Every new connection first learns the server's run_id, before
		// any command of ours runs on it: a node that restarted is
		// quarantined before it can vote, however soon after the restart
		// the connection is made.
		OnConnect: n.onConnect,
		Dialer:    n.dialGoRedis,
	})
	if n.metrics != nil {
		for k := range n.durations {
			n.durations[k] = n.metrics.requestDuration.WithLabelValues(n.name, opNames[k])
		}
		n.batches = n.metrics.batchSize.WithLabelValues(n.name)
		n.quarantined = n.metrics.quarantined.WithLabelValues(n.name)
		n.restarts = n.metrics.restarts.WithLabelValues(n.name)
		n.clockGauge = n.metrics.clockRateError.WithLabelValues(n.name)
		n.clockGauge.Set(rateUnknown)
	}
	for i := range n.queues {
		n.queues[i] = make(chan *op, cfg.MaxBatch*4)
		n.wg.Add(1)
		go n.work(n.queues[i])
	}
	return n
}

// dialGoRedis dials the node for the go-redis client (health checks,
// LOCKINFO, pub/sub, transparent mode). It does the TLS handshake itself,
// as the batching writers' connections do, so that a node that never
// answers it (a plain-text port) reads "tls handshake: no reply" in
// /readyz and the node's errors instead of a bare timeout.
func (n *Node) dialGoRedis(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: n.dialTimeout, KeepAlive: 5 * time.Minute}
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	if s, ok := ctx.Value(subscriberKey{}).(*subscriber); ok {
		// The raw connection, so that closing it also ends a TLS
		// handshake the node leaves unanswered.
		if err := s.dialed(nc); err != nil {
			_ = nc.Close()
			return nil, err
		}
	}
	if n.tls == nil {
		return nc, nil
	}
	deadline := time.Now().Add(n.dialTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = nc.SetDeadline(deadline)
	tc := tls.Client(nc, n.tls)
	if err := conf.Handshake(ctx, tc); err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("tls with %s: %w", addr, err)
	}
	_ = nc.SetDeadline(time.Time{})
	return tc, nil
}

// clockFunc is c's Now, or nil for the system clock.
func clockFunc(c quorum.Clock) func() time.Time {
	if c == nil {
		return nil
	}
	return c.Now
}

// Name is the node's address.
func (n *Node) Name() string { return n.name }

// Client is the node's go-redis client, for health checks.
func (n *Node) Client() *goredis.Client { return n.client }

// LockKey is the key a lock on key has on the node.
func (n *Node) LockKey(key string) string { return n.prefix + "lock:" + key }

// ReleaseChannel is the pub/sub channel on which the node announces each
// release of key's lock.
func (n *Node) ReleaseChannel(key string) string { return n.prefix + "released:" + key }

// Close stops the writers and closes the connections. Operations still
// queued fail with an error.
func (n *Node) Close() error {
	var err error
	n.closeMu.Do(func() {
		n.closing.Lock()
		n.closed = true
		n.closing.Unlock()
		close(n.stop)
		n.wg.Wait()
		err = n.client.Close()
	})
	return err
}

var errClosed = errors.New("redis: node closed")

// unsentError marks an operation that never reached the node (see
// quorum.Unsent).
type unsentError struct{ err error }

func (e unsentError) Error() string { return e.err.Error() }
func (e unsentError) Unwrap() error { return e.err }
func (e unsentError) Unsent() bool  { return true }

func unsent(err error) error { return unsentError{err} }

// Acquire implements quorum.Node.
func (n *Node) Acquire(ctx context.Context, req quorum.Request) (quorum.NodeGrant, error) {
	if err := n.health.refuse(); err != nil {
		n.giveUpRequest(req)
		return quorum.NodeGrant{}, unsent(err)
	}
	o := n.acquireOp(req)
	r := n.do(ctx, o)
	if r.n < 0 || req.WriterWait > 0 {
		noteAnswer(ctx, n, r)
	}
	return acquireGrant(r, req.Mode)
}

func (n *Node) acquireOp(req quorum.Request) *op {
	o := n.newOp(opAcquire, req.Key, req.Token)
	o.ms = req.TTL.Milliseconds()
	o.slot = slot(req.Key)
	o.mode = req.Mode
	o.noReentry = req.NoReentry
	if req.Mode == quorum.Shared || !req.NoReentry {
		// The quorum names its attempts; a caller of the node alone gets
		// one name per call.
		o.attempt = req.Attempt
		if o.attempt == "" {
			o.attempt = quorum.NewAttempt()
		}
	}
	if req.WriterWait > 0 {
		o.waitMs = max(1, req.WriterWait.Milliseconds())
	}
	return o
}

// acquireGrant turns an acquire in mode's answer into the quorum's terms.
// A read grant's third element is not a counter but whether the token
// holds the key for writing there too (see readScript).
func acquireGrant(r opResult, mode quorum.Mode) (quorum.NodeGrant, error) {
	switch {
	case r.err != nil:
		return quorum.NodeGrant{}, r.err
	case r.n == acquireUpgrade:
		return quorum.NodeGrant{Upgrade: true}, nil
	case r.n < 0:
		return quorum.NodeGrant{}, nil
	case mode == quorum.Shared:
		return quorum.NodeGrant{Acquired: true, Fence: uint64(r.n), Holds: r.holds, WriteHeld: r.counter == 1}, nil
	}
	return quorum.NodeGrant{Acquired: true, Fence: uint64(r.n), Holds: r.holds, Counter: uint64(r.counter)}, nil
}

// RaiseFence implements quorum.Node.
func (n *Node) RaiseFence(ctx context.Context, key, token string, fence uint64) (bool, error) {
	return n.raiseFence(ctx, key, token, quorum.Exclusive, fence)
}

// RaiseReadFence implements quorum.ReadFenceRaiser: the slot's counter
// raised to fence while token holds a live read hold of key here, nothing
// stored with the hold (see raiseFenceScript).
func (n *Node) RaiseReadFence(ctx context.Context, key, token string, fence uint64) (bool, error) {
	return n.raiseFence(ctx, key, token, quorum.Shared, fence)
}

func (n *Node) raiseFence(ctx context.Context, key, token string, mode quorum.Mode, fence uint64) (bool, error) {
	if err := n.health.refuse(); err != nil {
		return false, err
	}
	r := n.do(ctx, n.raiseOp(key, token, mode, fence))
	return r.n == 1, r.err
}

// raiseOp is a raise of key's fence for a grant to token in mode.
func (n *Node) raiseOp(key, token string, mode quorum.Mode, fence uint64) *op {
	o := n.newOp(opRaiseFence, key, token)
	o.slot = slot(key)
	o.mode = mode
	o.fence = fence
	return o
}

// Release implements quorum.Node.
func (n *Node) Release(ctx context.Context, key, token string, hold quorum.Hold) (bool, error) {
	o := n.newOp(opRelease, key, token)
	o.hold = hold
	o.rollback = quorum.Rollback(ctx)
	if o.rollback {
		o.attempt = quorum.RollbackAttempt(ctx)
		o.scoped = o.attempt != "" && quorum.RollbackScoped(ctx)
	}
	r := n.do(ctx, o)
	return r.n == 1, r.err
}

// Extend implements quorum.Node.
func (n *Node) Extend(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	if err := n.health.refuse(); err != nil {
		return false, err
	}
	o := n.newOp(opExtend, key, token)
	o.ms = ttl.Milliseconds()
	r := n.do(ctx, o)
	return r.n == extendedWrite || r.n == extendedRead, r.err
}

// The answers of the extend script (extendScript): which kind of the
// token's hold it renewed.
const (
	extendedNone  = 0
	extendedWrite = 1
	extendedRead  = 2 // a read hold alone: the key is held by readers here
)

var (
	_ quorum.AsyncNode            = (*Node)(nil)
	_ quorum.ReadFenceRaiser      = (*Node)(nil)
	_ quorum.AsyncReadFenceRaiser = (*Node)(nil)
)

// StartAcquire implements quorum.AsyncNode.
func (n *Node) StartAcquire(ctx context.Context, req quorum.Request, done func(quorum.NodeGrant, error)) {
	if err := n.health.refuse(); err != nil {
		n.giveUpRequest(req)
		done(quorum.NodeGrant{}, unsent(err))
		return
	}
	o := n.acquireOp(req)
	// Refusals, and a waiting writer's grants, are gathered for a LOCK …
	// WAIT (see refusals): other grants, the hot path, skip the look-up.
	writerWaits := req.WriterWait > 0
	o.done = func(r opResult) {
		if r.n < 0 || writerWaits {
			noteAnswer(ctx, n, r)
		}
		done(acquireGrant(r, req.Mode))
	}
	n.start(ctx, o)
}

// Unmark takes the waiting writer token's mark on key off the node (see
// unmarkScript), without waiting for the answer. It is queued before it
// returns, unless the key's writer queue is full: an operation on the key
// queued after it runs after it on the node. The node timeout bounds it.
func (n *Node) Unmark(key, token string) { n.unmark(key, token, false) }

// unmarkFromAnswer is Unmark called from an operation's answer callback,
// on a writer goroutine (noteAnswer: a refusal that came after the
// waiting writer's grant). That writer must never block: Close holds
// the closing lock's write side pending while it waits for every enqueue
// under way, one of which may be waiting for room in this writer's own
// queue, and a pending write side blocks RLock, so the writer, that
// enqueue and Close would wait for one another (the enqueue's context is
// its caller's, which may have no end). When Close is under way the mark
// is left: it ends by itself soon after the lease that refused the
// writer, as a dead instance's does.
func (n *Node) unmarkFromAnswer(key, token string) { n.unmark(key, token, true) }

func (n *Node) unmark(key, token string, fromAnswer bool) {
	o := n.newOp(opUnmark, key, token)
	o.done = func(opResult) {}
	o.start = time.Now()
	o.deadline = o.start.Add(n.timeout)
	if !fromAnswer {
		n.closing.RLock()
	} else if !n.closing.TryRLock() {
		// Close holds or awaits the write side.
		n.finish(o, opResult{err: unsent(errClosed)})
		return
	}
	defer n.closing.RUnlock()
	if n.closed {
		n.finish(o, opResult{err: unsent(errClosed)})
		return
	}
	n.track(o)
	select {
	case n.queue(o) <- o:
	default:
		go func() {
			ctx, cancel := context.WithDeadline(context.Background(), o.deadline)
			defer cancel()
			n.enqueue(ctx, o)
		}()
	}
}

// StartRaiseFence implements quorum.AsyncNode.
func (n *Node) StartRaiseFence(ctx context.Context, key, token string, fence uint64, done func(bool, error)) {
	n.startRaise(ctx, key, token, quorum.Exclusive, fence, done)
}

// StartRaiseReadFence implements quorum.AsyncReadFenceRaiser.
func (n *Node) StartRaiseReadFence(ctx context.Context, key, token string, fence uint64, done func(bool, error)) {
	n.startRaise(ctx, key, token, quorum.Shared, fence, done)
}

func (n *Node) startRaise(ctx context.Context, key, token string, mode quorum.Mode, fence uint64, done func(bool, error)) {
	if err := n.health.refuse(); err != nil {
		done(false, err)
		return
	}
	n.startBool(ctx, n.raiseOp(key, token, mode, fence), done)
}

// StartRelease implements quorum.AsyncNode.
func (n *Node) StartRelease(ctx context.Context, key, token string, hold quorum.Hold, done func(bool, error)) {
	o := n.newOp(opRelease, key, token)
	o.hold = hold
	o.rollback = quorum.Rollback(ctx)
	if o.rollback {
		o.attempt = quorum.RollbackAttempt(ctx)
		o.scoped = o.attempt != "" && quorum.RollbackScoped(ctx)
	}
	n.startBool(ctx, o, done)
}

// StartExtend implements quorum.AsyncNode.
func (n *Node) StartExtend(ctx context.Context, key, token string, ttl time.Duration, done func(bool, error)) {
	if err := n.health.refuse(); err != nil {
		done(false, err)
		return
	}
	n.startExtendKind(ctx, key, token, ttl, func(kind int64, err error) {
		done(kind == extendedWrite || kind == extendedRead, err)
	})
}

// startExtendKind is StartExtend answering which kind of hold it renewed
// (extendedWrite, extendedRead or extendedNone).
func (n *Node) startExtendKind(ctx context.Context, key, token string, ttl time.Duration, done func(int64, error)) {
	if err := n.health.refuse(); err != nil {
		done(extendedNone, err)
		return
	}
	o := n.newOp(opExtend, key, token)
	o.ms = ttl.Milliseconds()
	o.done = func(r opResult) { done(r.n, r.err) }
	n.start(ctx, o)
}

func (n *Node) startBool(ctx context.Context, o *op, done func(bool, error)) {
	o.done = func(r opResult) { done(r.n == 1, r.err) }
	n.start(ctx, o)
}

// start queues an op whose answer goes to o.done, called from the writer
// (or from here when the op cannot be queued).
func (n *Node) start(ctx context.Context, o *op) {
	o.start = time.Now()
	o.deadline = o.start.Add(n.timeout)
	if d, ok := ctx.Deadline(); ok {
		o.deadline = d
		if !d.After(o.start) {
			// Handed over past its deadline. Where the quorum set that
			// deadline, the time went by in lockproxy itself (a stop
			// between the quorum's setting it and this call, see
			// quorum.DeadlineSet): the operation started then, and
			// exec judges its deadline as that of one queued before
			// the stop. Otherwise it is its caller's lateness, and
			// exec gives it up.
			if set, ok := quorum.DeadlineSet(ctx); ok && set.Before(d) {
				o.start, o.handedLate = set, true
			}
		}
	}
	n.enqueue(ctx, o)
}

// enqueue hands o to its key's writer, or answers it at once when the node
// is closed or ctx ends first. It returns only then: the quorum sends an
// attempt's roll-back only after StartAcquire returned on every node
// (quorum TestRollbackNeverOvertakesItsAttempt), so the roll-back queues
// behind its attempt, or finds it among the unsent ones (giveUp). The read lock makes Close wait for every
// enqueue under way, so the writers' last drain answers everything queued.
func (n *Node) enqueue(ctx context.Context, o *op) {
	if o.kind != opSettle && !o.queued {
		n.track(o)
	}
	n.closing.RLock()
	defer n.closing.RUnlock()
	if n.closed {
		n.finish(o, opResult{err: unsent(errClosed)})
		return
	}
	select {
	case n.queue(o) <- o:
	case <-ctx.Done():
		n.giveUp(o, time.Now())
		n.finish(o, opResult{err: unsent(ctx.Err())})
	}
}

func (n *Node) queue(o *op) chan *op { return n.queueOf(o.base) }

// queueOf is the queue of the writer of key base.
func (n *Node) queueOf(base string) chan *op { return n.queues[int(slot(base))%len(n.queues)] }

// finish answers o. An op answered through done goes back to the pool here;
// one answered through res is recycled by its waiter.
func (n *Node) finish(o *op, r opResult) {
	if o.queued {
		o.queued = false
		n.inFlight[o.qslot].Add(-1)
	}
	if o.done == nil {
		o.res <- r
		return
	}
	n.observe(o.kind, o.start, r.err)
	done := o.done
	*o = op{res: o.res}
	opPool.Put(o)
	done(r)
}

func (n *Node) newOp(kind opKind, key, token string) *op {
	o := opPool.Get().(*op)
	o.kind, o.base, o.token = kind, key, token
	return o
}

// do queues o on its key's writer and waits for the answer or ctx.
func (n *Node) do(ctx context.Context, o *op) opResult {
	o.start = time.Now()
	o.deadline = o.start.Add(n.timeout)
	if d, ok := ctx.Deadline(); ok {
		o.deadline = d
	}
	kind, start := o.kind, o.start
	n.enqueue(ctx, o)
	select {
	case r := <-o.res:
		n.observe(kind, start, r.err)
		*o = op{res: o.res}
		opPool.Put(o)
		return r
	case <-ctx.Done():
		// The writer still owns o and will answer into its buffered
		// channel; o is not reused.
		n.observe(kind, start, ctx.Err())
		return opResult{err: ctx.Err()}
	}
}

func (n *Node) observe(kind opKind, start time.Time, err error) {
	if n.metrics == nil {
		return
	}
	n.durations[kind].Observe(time.Since(start).Seconds())
	if err != nil {
		n.metrics.errors.WithLabelValues(n.name, reasonLabel(err)).Inc()
	}
}

// work is one writer: it takes whatever operations are queued (up to
// maxBatch) and sends them in one pipelined write.
//
// The fence writes of a batch's fresh grants (see send) are written before
// their callers learn of the grants (see exec), and their answers are read
// with the next batch's when more operations are already queued: that
// saves the proxy a read per batch. With nothing queued they are read at
// once.
func (n *Node) work(q chan *op) {
	defer n.wg.Done()
	w := &writer{waited: time.Now()}
	defer w.drop()
	defer w.abandonDial()
	defer func() {
		if w.owed != nil {
			w.owed.stop()
		}
	}()
	// The connection is made at once, not by the first batch: its set-up
	// is several round trips, which a first LOCK with a short TTL (a node
	// timeout of 25 ms for PX 500) could not wait for on a loaded host.
	// A dial that fails now is made again by the first batch (see get).
	w.startDial(n)
	batch := make([]*op, 0, n.maxBatch)
	for {
		if w.pending > 0 && len(q) == 0 {
			// Give the callers just answered a moment to queue their
			// next operation before the answers are read alone.
			runtime.Gosched()
			if len(q) == 0 {
				n.readPending(w)
				w.waited = time.Now()
			}
		}
		// What a dropped connection left owed is paid by the next batch,
		// or by the writer itself when none comes (see owed).
		var debt <-chan time.Time
		if w.owed != nil {
			now := time.Now()
			w.owed.prune(now)
			switch {
			case w.owed.due(), w.owed.watching():
				debt = w.owed.wait(now)
			case w.owed.empty():
				w.owed.stop()
				w.owed = nil
			}
		}
		idle := len(q) == 0
		select {
		case o := <-q:
			batch = append(batch[:0], o)
		case <-debt:
			n.payDebts(w)
			w.waited = time.Now()
			continue
		case <-n.stop:
			n.readPending(w)
			n.drain(q)
			return
		}
		// Let the goroutines that are about to queue run first: one
		// yield makes batches several times larger under load, and each
		// batch costs a write and a read on the socket.
		runtime.Gosched()
		batch = n.fill(q, batch)
		// Since the writer last waited on the node, a deadline that
		// passed passed for lockproxy (see writer.ours): exec records
		// that span.
		w.idle = idle
		n.execSettling(w, batch)
	}
}

// execSettling is exec for a batch that may hold startSettle's markers,
// which it answers after the batch's operations: every operation queued
// on the writer before a marker was answered by then.
func (n *Node) execSettling(w *writer, batch []*op) {
	var settled []*op
	ops := batch[:0]
	for _, o := range batch {
		if o.kind == opSettle {
			settled = append(settled, o)
		} else {
			ops = append(ops, o)
		}
	}
	n.exec(w, ops)
	for _, o := range settled {
		n.finish(o, opResult{})
	}
}

// startSettle queues a marker on base's writer, whose answer (see
// awaitSettle) says that the operations on base queued on the node before
// it have been answered. A transparent-mode write goes out on a go-redis
// connection of its own (see Backend.Run), not through base's writer, so
// without this it can overtake an operation its client's earlier command
// left queued there: a SET NX is answered once a majority granted it, and
// the client's release could reach the last node before that node's
// acquire, which would then hold the key there until its TTL. An
// operation answered with a transport error may still reach the node
// later (see owed): the marker does not wait for that.
func (n *Node) startSettle(ctx context.Context, base string) *op {
	o := &op{kind: opSettle, base: base, res: make(chan opResult, 1)}
	n.enqueue(ctx, o)
	return o
}

// awaitSettle waits for startSettle's marker o to be answered, or ctx.
func (n *Node) awaitSettle(ctx context.Context, o *op) error {
	select {
	case r := <-o.res:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// writer is one batching writer's state: its own connection to the node
// (see nodeConn), dialed when first needed and dropped after any
// transport error, when its state is unknown.
type writer struct {
	conn *nodeConn
	// dialing, while a connection is being made, brings its outcome;
	// dialTLS is true while its TLS handshake runs.
	dialing chan dialResult
	dialTLS *atomic.Bool
	// pending is how many answers to fence writes (see exec) are still to
	// be read on conn, ahead of anything sent after them; fenceWrites are
	// those writes (see owed.lost: a connection dropped with them
	// unanswered is killed, and they are owed again).
	pending     int
	fenceWrites []fenceWrite
	// owed is what a connection dropped with acquires unanswered left to
	// send on the next one; nil until then (see owed).
	owed *owed
	// until is the latest deadline of the batch exec sends (see exec).
	until time.Time
	// ours are the spans of time, since the writer last found its queue
	// empty, in which it waited on no node, yet deadlines may have passed
	// (see exec): from when it last waited on the node (waited), or when
	// a read or write found what it waited for past its deadline
	// (nodeConn.late), to when it went on; the last few (maxOurs), and
	// between batches only the long ones (ourLongerThan).
	ours   []lateSpan
	waited time.Time
	// idle is set while the batch exec is handed was taken from an empty
	// queue (see notWaiting).
	idle bool
	// capped is the batch's capped (see exec), for lateness.heard.
	capped time.Time
	// epochLost is set by send when a batch found the node's data epoch
	// changed (see nodeConn.epoch): its answers are no votes.
	epochLost bool
	// Reused from batch to batch.
	seen     map[string]int
	shared   []bool
	answered []bool
	r        reply
}

// maxOurs bounds writer.ours, and ourLongerThan is the least time between
// two batches it keeps: the writer's own work between them takes
// microseconds.
const (
	maxOurs       = 8
	ourLongerThan = time.Millisecond
)

// notWaiting records that the writer, free at from (idle: it found its
// queue empty), waited on no node until to (see ours).
func (w *writer) notWaiting(from, to time.Time, idle bool) {
	switch {
	case idle:
		// Everything queued before was answered: no span before
		// matters.
		w.ours = append(w.ours[:0], lateSpan{from: from, to: to})
	case to.Sub(from) > ourLongerThan:
		w.add(lateSpan{from: from, to: to})
	}
}

func (w *writer) add(s lateSpan) {
	if len(w.ours) == maxOurs {
		w.ours = slices.Delete(w.ours, 0, 1)
	}
	w.ours = append(w.ours, s)
}

// oursAt tells whether t is within one of the writer's spans (see ours).
func (w *writer) oursAt(t time.Time) bool {
	for i := range w.ours {
		if w.ours[i].has(t) {
			return true
		}
	}
	return false
}

type unsentAttempt struct {
	attempt string
	until   time.Time
}

// giveUp records that o, given up before it was sent, never reaches the
// node (see Node.unsentAttempts).
func (n *Node) giveUp(o *op, now time.Time) {
	if o.kind != opAcquire || o.attempt == "" {
		return
	}
	n.unsentMu.Lock()
	defer n.unsentMu.Unlock()
	n.unsentAttempts = slices.DeleteFunc(n.unsentAttempts, func(u unsentAttempt) bool { return !now.Before(u.until) })
	if len(n.unsentAttempts) >= maxOwed {
		n.unsentAttempts = slices.Delete(n.unsentAttempts, 0, 1)
	}
	n.unsentAttempts = append(n.unsentAttempts, unsentAttempt{o.attempt, now.Add(time.Duration(o.ms) * time.Millisecond)})
}

// giveUpRequest is giveUp for an attempt refused before it became an op:
// the quorum may not read that answer before it decides, and its
// roll-back then comes (see giveUp).
func (n *Node) giveUpRequest(req quorum.Request) {
	if req.Attempt != "" {
		n.giveUp(&op{kind: opAcquire, attempt: req.Attempt, ms: req.TTL.Milliseconds()}, time.Now())
	}
}

// erred records that acquire o was answered with an error (see
// Node.erredAcquires). A NOSCRIPT answer is not one: the batch sends the
// acquire again as EVAL, and that answer counts.
func (n *Node) erred(o *op, err error) {
	if o.kind != opAcquire || err == nil || strings.HasPrefix(err.Error(), "NOSCRIPT") {
		return
	}
	now := time.Now()
	n.unsentMu.Lock()
	defer n.unsentMu.Unlock()
	n.erredAcquires = slices.DeleteFunc(n.erredAcquires, func(e erredAcquire) bool { return !now.Before(e.until) })
	if len(n.erredAcquires) >= maxOwed {
		n.erredAcquires = slices.Delete(n.erredAcquires, 0, 1)
	}
	n.erredAcquires = append(n.erredAcquires, erredAcquire{base: o.base, token: o.token, attempt: o.attempt, mark: o.mark,
		until: now.Add(time.Duration(o.ms) * time.Millisecond)})
}

// undoesErred tells whether o is the roll-back of an acquire this node
// answered with an error, and forgets that acquire; mark is the mark the
// node gave it. Such a roll-back goes out as the roll-back of an acquire
// in doubt (lateGrant), which removes a hold only where that acquire
// made it: a plain release would take one the token held before (a
// LOCK or RLOCK with TOKEN that the holder repeated), or, for a
// transparent SET NX, the hold of another client that locks with the
// same value.
func (n *Node) undoesErred(o *op) (mark string, ok bool) {
	if o.kind != opRelease || !o.rollback || o.lateGrant {
		return "", false
	}
	n.unsentMu.Lock()
	defer n.unsentMu.Unlock()
	for i, e := range n.erredAcquires {
		if e.base == o.base && e.token == o.token && e.attempt == o.attempt {
			n.erredAcquires = slices.Delete(n.erredAcquires, i, i+1)
			return e.mark, true
		}
	}
	return "", false
}

// undoesUnsent tells whether o is the roll-back of an attempt given up
// before it was sent, and forgets that attempt.
func (n *Node) undoesUnsent(o *op) bool {
	if o.kind != opRelease || !o.rollback || o.attempt == "" {
		return false
	}
	n.unsentMu.Lock()
	defer n.unsentMu.Unlock()
	for i, u := range n.unsentAttempts {
		if u.attempt == o.attempt {
			n.unsentAttempts = slices.Delete(n.unsentAttempts, i, i+1)
			return true
		}
	}
	return false
}

// get returns the writer's connection, dialing one when there is none or
// the one it has was closed by the node meanwhile.
func (w *writer) get(ctx context.Context, n *Node) (*nodeConn, error) {
	if w.conn != nil && w.pending == 0 {
		// With answers pending the socket has data to read by design.
		if alive(w.conn.nc) != nil {
			w.drop()
		}
	}
	// The connection is made under the dial timeout, not the operation's
	// node timeout: its set-up (TCP, TLS, AUTH, INFO) is a few round trips
	// where an operation is one, and bounded by the operation it would be
	// lost with it, and made again for the next, forever, on links slow
	// enough (a 60 ms round trip against a 100 ms node timeout:
	// TestConnectOverSlowLinks). An operation that cannot wait for it
	// fails unsent; the connection is there for the next batch.
	asked := time.Now()
	for w.conn == nil {
		if w.dialing == nil {
			w.startDial(n)
		}
		select {
		case r := <-w.dialing:
			w.dialing = nil
			// A dial that ended before this batch asked, its batch gone,
			// says nothing of the node now: a failure is dialed again
			// (TestStaleDialErrorNotReplayed), a connection checked.
			stale := r.at.Before(asked)
			if r.err != nil {
				if stale {
					continue
				}
				return nil, r.err
			}
			if stale && alive(r.c.nc) != nil {
				r.c.close()
				continue
			}
			w.conn = r.c
			// A batch left less than a round trip cannot be answered in
			// time, and its timeout would drop the connection just
			// made: it goes unsent, and the connection waits for the
			// next batch, which has its whole node timeout.
			if d, ok := ctx.Deadline(); ok && time.Until(d) < r.c.rtt {
				return nil, fmt.Errorf("connecting to %s: %w (set-up left less than its %v round trip)",
					n.name, context.DeadlineExceeded, r.c.rtt.Round(time.Millisecond))
			}
		case <-ctx.Done():
			if w.dialTLS.Load() {
				// The node has not answered the TLS hello within the
				// operation's whole node timeout: most likely a
				// plain-text port, which never will. Said as a bare
				// timeout, that reads like a slow node.
				return nil, fmt.Errorf("tls with %s: %w", n.name, &conf.HandshakeNoReplyError{Err: ctx.Err()})
			}
			return nil, fmt.Errorf("connecting to %s: %w", n.name, ctx.Err())
		}
	}
	return w.conn, nil
}

// answeredFor returns the writer's answered marks for a batch of n
// operations, all false: send sets each as its answer is read, and a
// failed connection leaves the others unanswered (see owed.lost).
func (w *writer) answeredFor(n int) []bool {
	if cap(w.answered) < n {
		w.answered = make([]bool, n)
	}
	w.answered = w.answered[:n]
	clear(w.answered)
	return w.answered
}

// startDial starts making a connection, whose outcome comes on w.dialing.
func (w *writer) startDial(n *Node) {
	ch, inTLS := make(chan dialResult, 1), new(atomic.Bool)
	w.dialing, w.dialTLS = ch, inTLS
	go func() {
		dctx, cancel := context.WithTimeout(context.Background(), n.dialTimeout)
		defer cancel()
		c, err := n.connectTracked(dctx, inTLS)
		ch <- dialResult{c, err, time.Now()}
	}()
}

// dialResult is the outcome of a writer's connect.
type dialResult struct {
	c   *nodeConn
	err error
	at  time.Time // when the dial ended
}

// abandonDial closes the connection a stopping writer was still making,
// once it is made (within the dial timeout).
func (w *writer) abandonDial() {
	if ch := w.dialing; ch != nil {
		w.dialing = nil
		go func() {
			if r := <-ch; r.c != nil {
				r.c.close()
			}
		}()
	}
}

// lost drops the writer's connection c, on which unanswered (operations
// of its batch whose answers were not read) were left, keeping what that
// leaves owed (see owed.lost): acquires in doubt, and fence writes that
// store a lockf (a kill, or a sweep once c is gone).
func (w *writer) lost(c *nodeConn, unanswered []*op) {
	fences := unansweredFences(w.fenceWrites)
	if w.owed == nil && (inDoubt(unanswered) || fences.ttl() > 0) {
		w.owed = &owed{}
	}
	if w.owed != nil {
		w.owed.lost(unanswered, fences, c.id, c.run, time.Now())
	}
	w.drop()
}

// payDebts sends what the writer owes (see owed) when no batch came to
// carry it: on the connection it has, or one it is making, without
// waiting for it.
func (n *Node) payDebts(w *writer) {
	o := w.owed
	if w.conn != nil && w.pending == 0 && alive(w.conn.nc) != nil {
		w.drop()
	}
	if w.conn == nil {
		if w.dialing == nil {
			w.startDial(n)
		}
		select {
		case r := <-w.dialing:
			w.dialing = nil
			switch {
			case r.err != nil:
			case alive(r.c.nc) != nil:
				r.c.close()
			default:
				w.conn = r.c
			}
			if w.conn == nil {
				// Failed: the next one starts now, looked at later.
				o.retry = min(2*o.retry, debtRetryMax)
				w.startDial(n)
			}
		default:
			// Still being made: looked at again soon.
		}
		if w.conn == nil {
			o.down = time.Now()
			return
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), n.timeout)
	defer cancel()
	n.send(ctx, w, nil, true)
	if d, _ := ctx.Deadline(); o.sweepsReady() && w.conn != nil && time.Until(d) > w.conn.rtt {
		// The write just found dropped connections gone: their sweeps go
		// now rather than a retry later, as the lockf they undo lasts.
		// Not when the first write left the second less than a round
		// trip: its deadline would drop a working connection.
		n.send(ctx, w, nil, true)
	}
	if o.due() {
		o.retry = min(2*o.retry, debtRetryMax)
	} else {
		o.retry = debtRetryMin
	}
}

func (w *writer) drop() {
	if w.conn != nil {
		w.conn.close()
		w.conn = nil
	}
	w.pending = 0 // they went with the connection
	w.fenceWrites = w.fenceWrites[:0]
}

// fill adds what is queued to batch, up to maxBatch, without waiting.
func (n *Node) fill(q chan *op, batch []*op) []*op {
	for len(batch) < n.maxBatch {
		select {
		case o := <-q:
			batch = append(batch, o)
		default:
			return batch
		}
	}
	return batch
}

func (n *Node) drain(q chan *op) {
	for {
		select {
		case o := <-q:
			n.finish(o, opResult{err: unsent(errClosed)})
		default:
			return
		}
	}
}

// exec sends one batch and answers its operations. Operations whose caller
// has given up already are answered without being sent.
//
// The fence writes of the batch's fresh grants (the hold's fence, the
// cleared writer mark) are written to the node before any caller hears of
// its grant, so that what the grant's holder does next, through any
// instance, nearly always reaches the node after them and finds the
// hold's fence stored. Nearly: written first is not run first, as the
// node serves its connections in turn. So the fence write is a plain SET
// of a key that holds the fence alone (lockf): a late one cannot undo
// what an operation on the hold stored meanwhile (extra holds and the
// downgrade flag live in lockm), and an operation that found no fence
// answers 0, which the quorum makes up from the other nodes. Their
// answers are read later (see work).
func (n *Node) exec(w *writer, batch []*op) {
	now := time.Now()
	// The span since the writer last waited on the node ends now, when
	// the deadlines are looked at, not when the batch was taken: a stop
	// of the process in between (while the writer answered the batch
	// before, or took this one) passed deadlines for lockproxy as well
	// (see writer.ours).
	if !w.waited.IsZero() {
		w.notWaiting(w.waited, now, w.idle)
	}
	w.idle = false
	live := batch[:0]
	// until is the latest deadline of the batch's operations. A
	// background release (UnlockHold) may have one well past the node
	// timeout: it may wait that long for its turn in the queue, behind
	// thousands of others, and its batch may take that long to be
	// answered while the node answers on. But a node that says nothing
	// for a node timeout is taken as silent, whatever the deadlines (see
	// nodeConn.read): waiting on it until a release's deadline would keep
	// every operation queued behind that batch, on every key of the
	// writer, unanswered for as long, where the quorum counts on an answer
	// within about two node timeouts
	// (TestUnlockHoldKeepsOtherOpsWithinNodeTimeout).
	var until time.Time
	// later: roll-backs of acquires in this batch, sent once the batch is
	// answered (see rollsBackInBatch).
	var later []*op
	// capped, when set, is when the quorum may stop listening for an
	// acquire of the batch sent past its deadline: the batch is read no
	// longer.
	var capped time.Time
	// An operation whose deadline passed while the writer sent earlier
	// batches and waited for their answers waited for the node. One whose
	// deadline passed while the writer waited on no node (w.ours: it was
	// free, or late to read or write what the socket held) waited for
	// lockproxy itself: a stop of the process (SIGSTOP, a VM pause) or a
	// long stall, with the operation queued or the batch before it
	// answered in the socket. A release, a renewal or a fence raise of
	// that kind still goes out and is answered as the node answers it,
	// within a node timeout from now, rather than failed unheard: what
	// the node says of it is a fact whenever it comes (a release done, a
	// lease extended from when it ran, whose validity the caller measures
	// after the answer; the quorum waits for every raise). So does an
	// acquire, but answered well before the end of the time the quorum
	// still listens for it (by answeredBy: hearOut's limit is the
	// deadline and the longest node timeout after it), as the whole
	// batch is (capped): a refusal the quorum did not hear would get a
	// roll-back, which where the token already holds the key (a NoReentry
	// attempt, a transparent SET NX) takes that hold. An acquire with too
	// little of that time left is given up unsent, as before. Its grant
	// is safe however late: the quorum counts the validity from its own
	// start, and rolls back a grant whose validity ran out. An operation
	// whose deadline had passed when it was handed over is its caller's
	// lateness, given up too, unless the quorum set that deadline (see
	// start).
	if w.conn != nil && w.conn.late != nil && !w.conn.late.to.IsZero() {
		w.add(w.conn.late.lateSpan)
		w.conn.late.lateSpan = lateSpan{}
	}
	for _, o := range batch {
		if n.undoesUnsent(o) {
			// Its attempt never went out here: nothing to undo.
			n.finish(o, opResult{})
			continue
		}
		if mark, ok := n.undoesErred(o); ok {
			o.lateGrant, o.lateMark = true, mark
		}
		if rollsBackInBatch(live, o) || touchesKeyOf(later, o) {
			later = append(later, o)
			continue
		}
		if !o.deadline.After(now) {
			if d, ok := n.waitedForUs(w, o, now); ok {
				o.deadline = d
				if o.kind == opAcquire && (capped.IsZero() || d.Before(capped)) {
					capped = d
				}
			} else if o.kind == opRelease {
				// The caller has stopped waiting, but the release still
				// goes out (its answer dropped): it may be the roll-back
				// of an acquire already on its way to this node, which
				// would otherwise hold the key here until its TTL.
				late := &op{kind: opRelease, base: o.base, token: o.token,
					hold: o.hold, rollback: o.rollback, attempt: o.attempt, lateGrant: o.lateGrant, lateMark: o.lateMark, scoped: o.scoped,
					start: now, deadline: now.Add(n.timeout), res: make(chan opResult, 1),
					done: func(opResult) {}}
				n.track(late)
				n.finish(o, opResult{err: context.DeadlineExceeded})
				o = late
			} else {
				n.giveUp(o, now)
				n.finish(o, opResult{err: unsent(context.DeadlineExceeded)})
				continue
			}
		}
		if o.deadline.After(until) {
			until = o.deadline
		}
		live = append(live, o)
	}
	if len(live) > 0 && n.metrics != nil {
		n.batches.Observe(float64(len(live)))
	}
	// The restart generation is read before the check that the node may
	// vote: a restart detected in between then shows as a new generation
	// after the batch (see restarted below) instead of slipping past both.
	gen := n.health.gen.Load()
	if len(live) > 0 {
		if err := n.health.refuse(); err != nil {
			// Queued before the node was taken out: only releases go out.
			live = n.failVotes(live, err)
		}
	}
	if len(later) > 0 {
		// After this batch's answers are read, whatever happens to it.
		defer n.exec(w, later)
	}
	if len(live) == 0 {
		return
	}
	deadline := earlier(until, now.Add(n.timeout))
	if !capped.IsZero() {
		deadline, until = earlier(deadline, capped), earlier(until, capped)
	}
	w.capped = capped
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()

	w.epochLost = false
	w.until = until
	res, writes := n.send(ctx, w, live, true)
	w.waited = time.Now()
	var retry []int
	for i, r := range res {
		if r.err != nil && strings.HasPrefix(r.err.Error(), "NOSCRIPT") {
			retry = append(retry, i)
		}
	}
	if len(retry) > 0 {
		// The node lost its script cache (restart, SCRIPT FLUSH): EVAL
		// loads the scripts again.
		again := make([]*op, len(retry))
		for j, i := range retry {
			again[j] = live[i]
		}
		res2, writes2 := n.send(ctx, w, again, false)
		w.waited = time.Now()
		for j, r := range res2 {
			res[retry[j]] = r
		}
		writes = append(writes, writes2...)
	}
	w.capped = time.Time{} // the batch's only (payDebts sends too)
	// A restart seen while the batch was sent (onConnect runs on the new
	// connection before our commands) makes its answers worthless as
	// votes: they come from a server that forgot its locks.
	// So does a batch that found the node's data replaced (its epoch
	// changed), quarantine or not: they come from data without the
	// locks they are votes about.
	restarted := w.epochLost || n.health.gen.Load() != gen && n.health.restarting()
	if len(writes) > 0 && !restarted {
		n.writeFences(w, writes)
	}
	for i, o := range live {
		if restarted && o.kind != opRelease {
			n.finish(o, opResult{err: errQuarantined})
			continue
		}
		n.finish(o, res[i])
	}
}

// waitedForUs tells whether o, found past its deadline at now, waited
// for lockproxy itself rather than for the node, and so still goes out,
// with the deadline it then has (see exec): its deadline passed while the
// writer waited on no node (w.ours), after it was handed over, or before
// (it was handed over past the deadline the quorum set, see start), and
// it is a release, a renewal, a fence
// raise, or an acquire the quorum still listens for, for more than
// stoppedLate.
func (n *Node) waitedForUs(w *writer, o *op, now time.Time) (time.Time, bool) {
	// One handed over past its deadline did not wait for the node,
	// whatever the writer did meanwhile: a batch it ran after the stop (or
	// answers it read from the socket's buffer when the process stopped,
	// which look like no wait) leave that span out of w.ours
	// (TestOpHandedOverPastQuorumDeadlineAfterWriterRan).
	if !o.deadline.After(o.start) || !o.handedLate && !w.oursAt(o.deadline) {
		return time.Time{}, false
	}
	switch o.kind {
	case opRelease, opExtend, opRaiseFence:
		return now.Add(n.timeout), true
	case opAcquire:
		heard := answeredBy(o)
		return heard, heard.Sub(now) > stoppedLate
	}
	return time.Time{}, false
}

// answeredBy is when an acquire's answer must be in, when it is read past
// its deadline (sent late, or written late, see lateness.rewait): its
// deadline and its node timeout more, less answerSpare, but never before
// its deadline. The quorum hears it out until its deadline and the
// longest node timeout after it (hearOut), at least its own node timeout;
// an answer read at that very limit reaches the quorum as its timer
// fires, and one the quorum did not hear gets a plain roll-back, which
// for a refusal where the token already holds the key (a NoReentry
// attempt, a transparent SET NX with the same value) takes that hold
// (TestLateAcquireAnsweredBeforeQuorumLimit).
func answeredBy(o *op) time.Time {
	t := o.deadline.Sub(o.start)
	return o.deadline.Add(max(t-answerSpare(t), 0))
}

// answerSpare is the time an acquire's answer read past its deadline
// leaves to the quorum's limit, for a node timeout t: the writer's and the
// quorum's wake-ups on a loaded host, which the quorum does not take for
// a stop (hearOut stretches its limit only when it fires more than
// TimeoutMin late).
func answerSpare(t time.Duration) time.Duration {
	return max(2*stoppedLate, t/8)
}

// rollsBackInBatch tells whether o is the roll-back of an acquire among
// before (the ops going out ahead of it in its batch): the quorum decided before this
// node's writer sent the acquire. Written behind it in the same pipeline,
// the roll-back would go out before the acquire's answer says what it
// did, and one answered with an error (it did not run) must not be
// rolled back with a plain release (see undoesErred); so it waits for the
// batch's answers. (Matching on key and token may also hold back the
// roll-back of another unnamed attempt with the same token, a transparent
// SET NX's value: it only waits a round trip.)
func rollsBackInBatch(before []*op, o *op) bool {
	if o.kind != opRelease || !o.rollback {
		return false
	}
	for _, p := range before {
		if p.kind == opAcquire && p.base == o.base && p.token == o.token && p.attempt == o.attempt {
			return true
		}
	}
	return false
}

// touchesKeyOf tells whether o is on the key of one of deferred, the ops
// of a batch held back until its answers (see rollsBackInBatch): it goes
// after them, as it was queued. The next attempt of a waiter's token,
// queued behind the roll-back of its refused one (quorum.Request.OwnToken),
// sent ahead of it would have its hold removed by it.
func touchesKeyOf(deferred []*op, o *op) bool {
	for _, p := range deferred {
		if p.base == o.base {
			return true
		}
	}
	return false
}

// failVotes answers every op of batch but the releases (and unmarks,
// which give up something too) with err (the reason the node may not
// vote) and returns those.
func (n *Node) failVotes(batch []*op, err error) []*op {
	keep := batch[:0]
	for _, o := range batch {
		if o.kind == opRelease || o.kind == opUnmark {
			if n.undoesUnsent(o) {
				// The roll-back of an attempt answered unsent earlier in
				// this batch: nothing to undo.
				n.finish(o, opResult{})
				continue
			}
			keep = append(keep, o)
			continue
		}
		// Its roll-back, if the quorum decided without this answer, is
		// behind it (in this batch or a later one) and must know there is
		// nothing to undo.
		n.giveUp(o, time.Now())
		n.finish(o, opResult{err: unsent(err)})
	}
	return keep
}

// lockKeys returns the first k of a lock's keys on this node, in the
// scripts' order (see scripts.go).
func (n *Node) lockKeys(lockKey, base string, k int) []string {
	keys := make([]string, k)
	keys[keyLock] = lockKey
	for i := keyFence; i < k && i < keyFenceHash; i++ {
		keys[i] = n.prefix + keyNames[i] + base
	}
	if k > keyFenceHash {
		keys[keyFenceHash] = n.fenceKey
	}
	return keys
}

// fenceWrite stores a fresh grant's fence with its hold (see send).
// Its parts are kept, not the key and value: written straight into the
// connection's buffer, a fence write allocates nothing.
type fenceWrite struct {
	base  string // the client's key
	token string // lockf names the hold it is for
	fence int64
	slot  uint16
	// start is when the grant's acquire was queued: the hold cannot
	// matter to its holder past start + ms (its validity counts from
	// before), see owed.fences.
	start time.Time
	ms    int64
	mark  bool // take the granted waiting writer's mark off lockw
	op    int  // the grant's place in its batch
	gone  bool // the batch released the hold: only the mark is left to clear
}

// send writes ops as one pipeline and reads their answers, after those to
// the fence writes still pending on the connection (see exec).
//
// An exclusive acquire goes first as two plain commands, SET NX PX and
// HINCRBY of the slot's fence counter (one marked with an attempt, which
// may join its token's hold, as acquireMarkedScript, which does both and
// stores the fence and the mark): on a free key that is the whole
// grant, at a fraction of a Lua call's cost on the node (a script call
// costs Redis several plain commands' time, and acquires are half of a
// node's work). The increment runs right after the SET on the same
// connection; a previous holder's raise of the counter happened while it
// still held the key, so before our SET could succeed, and the increment
// sees it. An increment after a failed SET only makes the counter jump,
// which fences allow. Where the SET finds the key held, the acquire script
// follows in a second pipeline, for what needs the key's state: a
// reentrant hold, a refused upgrade, a waiting writer's mark. It is
// skipped when none of that can apply (a token that cannot hold the key
// already, no wait).
//
// A fresh grant's fence is stored with the hold (lockf) for reentrant
// grants, downgrades and LOCKINFO, and a waiting writer's mark is cleared
// once it is granted; these writes are returned, and exec writes them
// before it answers the batch's callers.
//
// The releases of keys that nothing else in the batch touches share one
// script call (up to maxReleasesPerCall); a release whose key another
// operation of the batch touches keeps its place among them.
// Everything else is a script.
func (n *Node) send(ctx context.Context, w *writer, ops []*op, sha bool) ([]opResult, []fenceWrite) {
	out := make([]opResult, len(ops))
	c, err := w.get(ctx, n)
	if err != nil {
		// Nothing reached the node.
		now := time.Now()
		for i, o := range ops {
			out[i].err = unsent(err)
			n.giveUp(o, now)
		}
		if w.owed != nil {
			w.owed.unsent(ops, time.Now())
		}
		return out, nil
	}
	if d, ok := ctx.Deadline(); ok {
		if w.until.After(d) {
			// The node gets a node timeout from now, and another from
			// each answer read, up to the batch's latest deadline (see
			// exec).
			c.until, c.quiet = w.until, n.timeout
			defer func() { c.until, c.quiet = time.Time{}, 0 }()
			d = earlier(w.until, time.Now().Add(n.timeout))
		}
		_ = c.nc.SetDeadline(d)
	}
	pending := w.pending // answers to fence writes, ahead of this batch's
	w.pending = 0
	if w.owed != nil {
		// What a dropped connection left owed goes first (see owed).
		n.writeDebts(c, w.owed, time.Now())
		w.owed.written(ops)
	}
	answered := w.answeredFor(len(ops))
	shared := w.sharedReleases(ops)
	whole := wholeAcquires(ops)
	var calls [][]int // the shared release calls: the ops each answers
	for i, o := range ops {
		switch o.kind {
		case opAcquire:
			if whole != nil && whole[i] {
				n.addAcquireScript(c, sha, o)
				continue
			}
			if o.mode != quorum.Shared && o.attempt != "" {
				n.addAcquireMarked(c, sha, o)
				continue
			}
			if o.mode != quorum.Shared {
				c.begin(6)
				c.bulk("SET")
				c.bulk3(n.prefix, "lock:", o.base)
				c.bulk(o.token)
				c.bulk("NX")
				c.bulk("PX")
				c.bulkInt(o.ms)
				c.begin(4)
				c.bulk("HINCRBY")
				c.bulk(n.fenceKey)
				c.bulkInt(int64(o.slot))
				c.bulk("1")
				continue
			}
			n.addScript(c, scriptRead, sha, o, numLockKeys, 5)
			c.bulk(o.token)
			c.bulkInt(o.ms)
			c.bulkInt(int64(o.slot))
			c.bulk(readMarker)
			c.bulk(o.attempt)
		case opRaiseFence:
			n.addRaise(c, sha, o.base, o.token, o.slot, int64(o.fence), o.mode == quorum.Shared)
		case opRelease:
			if shared != nil && shared[i] {
				continue
			}
			if o.lateGrant || o.scoped {
				n.addLateGrantRelease(c, o.base, o.token, cmp.Or(o.attempt, o.lateMark), o.hold == quorum.ReadHold)
				continue
			}
			n.addScript(c, scriptRelease, sha, o, keyWriterWaits, 4)
			n.addReleaseArgs(c, o)
		case opExtend:
			// RENEW's extend, or a watchdog's renewal of one kind of hold
			// (Node.extendHold): the same keys and arguments.
			s := scriptExtend
			switch o.hold {
			case quorum.WriteHold:
				s = scriptExtendHold[backends.Write]
			case quorum.ReadHold:
				s = scriptExtendHold[backends.Read]
			}
			n.addScript(c, s, sha, o, keyWriterWaits, 3)
			c.bulk(o.token)
			c.bulkInt(o.ms)
			c.bulk(readMarker)
		case opUnmark:
			// Always EVAL: a NOSCRIPT answer would send it again after
			// the batch's other operations, among them the attempt of
			// the waiter signaled after it, which must find the mark
			// gone. It is rare enough for its source's bytes.
			n.addScript(c, scriptUnmark, false, o, keyWriterWaits+1, 3)
			c.bulk(o.token)
			c.bulk3(n.prefix, "released:", o.base)
			c.bulk(readMarker)
		}
	}
	// The shared releases, in calls of at most maxReleasesPerCall.
	if shared != nil {
		var idx []int
		for i := range ops {
			if shared[i] {
				idx = append(idx, i)
			}
		}
		for len(idx) > 0 {
			part := idx[:min(len(idx), maxReleasesPerCall)]
			idx = idx[len(part):]
			c.begin(3 + 9*len(part))
			c.bulk(evalName(sha))
			c.bulk(scriptSource(scriptRelease, sha))
			c.bulkInt(int64(5 * len(part)))
			for _, i := range part {
				for k := keyLock; k < keyWriterWaits; k++ {
					c.bulk3(n.prefix, keyNames[k], ops[i].base)
				}
			}
			for _, i := range part {
				n.addReleaseArgs(c, ops[i])
			}
			calls = append(calls, part)
		}
	}
	// The data epoch last: read after every command of the write, the
	// value the connection was made with proves that the data they ran
	// on is the data it has seen all along (see nodeConn.epoch).
	checkEpoch := c.epoch != nil
	if checkEpoch {
		c.addEpochGet()
	}
	var epochGot string
	epochSame, epochOK, epochUnknown := true, false, false
	readEpoch := func() error {
		same, got, ok, unknown, err := c.readEpoch()
		if err != nil {
			return err
		}
		if unknown {
			epochUnknown = true
			return nil
		}
		if !same && epochSame {
			epochSame, epochGot, epochOK = false, got, ok
		}
		return nil
	}
	// A transport failure withdraws every answer of the batch, even those
	// read before it: that only errs on the safe side (the quorum rolls an
	// acquire back, a release counts as not confirmed), and the batch's
	// fence writes go with them.
	fail := func(err error) ([]opResult, []fenceWrite) {
		var unanswered []*op
		for i, o := range ops {
			if !answered[i] {
				unanswered = append(unanswered, o)
			}
		}
		w.lost(c, unanswered)
		for i := range out {
			out[i] = opResult{err: err}
		}
		return out, nil
	}
	if c.late != nil {
		c.late.rewait, c.late.heard = true, w.capped
		for _, o := range ops {
			if o.kind == opAcquire {
				// Answered while the quorum surely listens (an
				// acquire sent late has its limit in w.capped).
				if h := answeredBy(o); c.late.heard.IsZero() || h.Before(c.late.heard) {
					c.late.heard = h
				}
			}
		}
		defer func() { c.late.rewait = false }()
	}
	if n.beforeWrite != nil {
		n.beforeWrite()
	}
	if err := c.flush(); err != nil {
		return fail(err)
	}
	r := &w.r
	for range pending {
		// Their answers do not matter (see writeFences).
		if err := c.read(r); err != nil {
			return fail(err)
		}
	}
	w.fenceWrites = w.fenceWrites[:0]
	if w.owed != nil && w.owed.reading() {
		if err := n.readDebts(c, w.owed, r); err != nil {
			return fail(err)
		}
	}
	var held []int // exclusive acquires whose SET found the key held
	var writes []fenceWrite
	for i, o := range ops {
		switch {
		case whole != nil && whole[i]:
			if err := c.read(r); err != nil {
				return fail(err)
			}
			answered[i] = true
			out[i] = acquireResult(r)
			n.erred(o, out[i].err)
		case o.kind == opAcquire && o.mode != quorum.Shared && o.attempt != "":
			// A marked acquire: its fence (and mark) stored with the hold.
			if err := c.read(r); err != nil {
				return fail(err)
			}
			answered[i] = true
			switch {
			case r.err != nil:
				out[i].err = r.err
			case r.kind == '$' && r.null:
				// Held: it goes on as acquireScript, which adds a
				// reentrant hold (see acquireMarkedScript).
				answered[i] = false
				held = append(held, i)
			case r.kind != ':':
				out[i].err = fmt.Errorf("unexpected reply to a marked acquire: %q", r.kind)
			default:
				out[i] = opResult{n: r.n, holds: 1}
			}
			n.erred(o, out[i].err)
		case o.kind == opAcquire && o.mode != quorum.Shared:
			if err := c.read(r); err != nil {
				return fail(err)
			}
			// The SET's answer is judged before the HINCRBY's is read
			// (a simple string's bytes live in the read buffer).
			var setErr error
			setNull := r.kind == '$' && r.null
			switch {
			case r.err != nil:
				setErr = r.err
			case !setNull && (r.kind != '+' || string(r.s) != "OK"):
				// Whatever answers here is not a Redis we can trust with locks.
				setErr = fmt.Errorf("unexpected reply to SET: %q %.40q", r.kind, r.s)
			}
			if err := c.read(r); err != nil {
				return fail(err)
			}
			answered[i] = true
			switch {
			case setErr != nil:
				out[i].err = setErr
			case setNull:
				if o.noReentry && o.waitMs == 0 {
					out[i].n = acquireRefused
				} else {
					// Unanswered until its script is: the SET alone
					// did nothing, which a plain roll-back would not
					// know (it would take the token's earlier hold,
					// see owed).
					answered[i] = false
					held = append(held, i)
				}
			case r.err != nil:
				out[i].err = r.err
			case r.kind != ':':
				out[i].err = fmt.Errorf("unexpected reply to HINCRBY: %q", r.kind)
			default:
				out[i] = opResult{n: r.n, holds: 1}
				writes = append(writes, fenceWrite{base: o.base, token: o.token, fence: r.n, slot: o.slot, start: o.start, ms: o.ms, mark: o.waitMs > 0, op: i})
			}
			n.erred(o, out[i].err)
		case o.kind == opRelease && shared != nil && shared[i]:
			// Answered with its call, below.
		default:
			if err := c.read(r); err != nil {
				return fail(err)
			}
			answered[i] = true
			switch o.kind {
			case opAcquire:
				out[i] = acquireResult(r)
				n.erred(o, out[i].err)
			case opRelease:
				if rs, err := releaseResults(r, 1); err != nil {
					out[i].err = err
				} else {
					out[i].n = rs[0]
				}
			default:
				out[i] = intResult(r)
			}
		}
	}
	for _, part := range calls {
		if err := c.read(r); err != nil {
			return fail(err)
		}
		rs, err := releaseResults(r, len(part))
		for j, i := range part {
			answered[i] = true
			if err != nil {
				out[i].err = err
			} else {
				out[i].n = rs[j]
			}
		}
	}
	if checkEpoch {
		if err := readEpoch(); err != nil {
			return fail(err)
		}
	}
	if len(held) > 0 {
		for _, i := range held {
			n.addAcquireScript(c, sha, ops[i])
		}
		if checkEpoch {
			c.addEpochGet()
		}
		if err := c.flush(); err != nil {
			return fail(err)
		}
		for _, i := range held {
			if err := c.read(r); err != nil {
				return fail(err)
			}
			answered[i] = true
			out[i] = acquireResult(r)
			n.erred(ops[i], out[i].err)
		}
		if checkEpoch {
			if err := readEpoch(); err != nil {
				return fail(err)
			}
		}
	}
	if epochUnknown && epochSame {
		// The epoch could not be read (an error reply): no change to
		// quarantine the node for, but the answers are no votes; the
		// next connection's set-up reads the node (a restart, its
		// epoch) again.
		w.epochLost = true
		w.drop()
		return out, nil
	}
	if !epochSame {
		// The node's data was replaced since the connection was made:
		// a restart the connection did not see (a full sync, FLUSHALL,
		// a proxy that kept it open). The node is quarantined as after
		// one, and the connection dropped (every answer read), so that
		// the next one's set-up learns the new epoch.
		n.learnEpoch(epochGot, epochOK)
		w.epochLost = true
		w.drop()
		return out, nil
	}
	if len(writes) > 0 {
		markReleased(ops, shared, out, writes)
	}
	return out, writes
}

// markReleased marks the fence writes of holds that their own batch
// released. A grant and its holder's release share a batch where the
// holder heard of the grant from the other nodes before this node's writer
// sent the grant (a busy or slow node): the fence write, sent after the
// batch, would store a fence for a hold already gone, and its lockf would
// stay on the node until its TTL (a key left per such cycle, which long
// leases make many). A node that lags far enough gets several such
// cycles of one key in a batch (LOCK, UNLOCK, LOCK again by the next
// holder, …: seen in TestUnlockRightAfterLockLeavesNoKey under load),
// where every hold but the last is released by the batch too. Such a
// release is never a shared one (another operation of the batch touches
// its key), and those are few.
func markReleased(ops []*op, shared []bool, out []opResult, writes []fenceWrite) {
	for j, p := range ops {
		if p.kind != opRelease || shared != nil && shared[j] {
			continue
		}
		for k := range writes {
			if fw := &writes[k]; fw.op < j && ops[fw.op].base == p.base {
				fw.gone = releasedLater(ops, out, fw.op)
			}
		}
	}
}

// releasedLater tells whether the batch released the fresh grant ops[i]:
// a later release of write holds by its token on its key released a
// hold, and no other operation of that token on the key came before it
// (a release that released nothing, or failed, is passed over). A fresh
// grant is its token's only hold, so that release ended it. Other
// tokens' operations on the key (the next holder's grant and release, a
// refused attempt) can neither add to that hold nor end it, and are
// passed over too. Anything else of the token's first (a reentrant or
// read acquire, an extend) keeps the fence write, as before.
func releasedLater(ops []*op, out []opResult, i int) bool {
	o := ops[i]
	for j := i + 1; j < len(ops); j++ {
		p := ops[j]
		if p.base != o.base || p.token != o.token {
			continue
		}
		if p.kind != opRelease || p.hold == quorum.ReadHold {
			return false
		}
		if out[j].err == nil && out[j].n == 1 {
			return true
		}
	}
	return false
}

// addScript begins an EVALSHA (or EVAL) of s with o's first k lock keys;
// the caller adds the argc arguments.
func (n *Node) addScript(c *nodeConn, s script, sha bool, o *op, k, argc int) {
	beginScript(c, s, sha, k, argc)
	c.bulk3(n.prefix, "lock:", o.base)
	for i := keyFence; i < k && i < keyFenceHash; i++ {
		c.bulk3(n.prefix, keyNames[i], o.base)
	}
	if k > keyFenceHash {
		c.bulk(n.fenceKey)
	}
}

// beginScript starts an EVALSHA (sha) or EVAL of s with k keys and argc
// arguments, which the caller adds.
func beginScript(c *nodeConn, s script, sha bool, k, argc int) {
	c.begin(3 + k + argc)
	c.bulk(evalName(sha))
	c.bulk(scriptSource(s, sha))
	c.bulkInt(int64(k))
}

// keyNames are the lock's key names after the prefix, before the client's
// key (see scripts.go).
var keyNames = [...]string{keyLock: "lock:", keyFence: "lockf:", keyHolds: "lockm:", keyReaders: "lockr:", keyReaderHolds: "lockrh:", keyWriterWaits: "lockw:"}

// addLateGrantRelease adds the roll-back of an acquire in doubt of base by
// token, marked with attempt or not ("", see op.attempt and owed); of a
// read acquire (always marked) when read. Always EVAL: it is rare, and a
// NOSCRIPT answer would leave it unsent with its doubt settled.
func (n *Node) addLateGrantRelease(c *nodeConn, base, token, attempt string, read bool) {
	if read {
		beginScript(c, scriptLateRead, false, keyWriterWaits, 3)
		for k := keyLock; k < keyWriterWaits; k++ {
			c.bulk3(n.prefix, keyNames[k], base)
		}
		c.bulk(token)
		c.bulk(attempt)
		c.bulk(readMarker)
		return
	}
	beginScript(c, scriptLateGrant, false, 3, 2)
	c.bulk3(n.prefix, "lock:", base)
	c.bulk3(n.prefix, "lockf:", base)
	c.bulk3(n.prefix, "lockm:", base)
	c.bulk(token)
	c.bulk(attempt)
}

// addAcquireScript adds o as acquireScript: an acquire whose first step
// found the key held, or one sent whole (see wholeAcquires). A marked one
// (op.attempt) marks a hold it makes afresh, as acquireMarkedScript does.
func (n *Node) addAcquireScript(c *nodeConn, sha bool, o *op) {
	if o.attempt == "" && o.mode != quorum.Shared && o.mark == "" {
		o.mark = quorum.NewAttempt()
	}
	n.addScript(c, scriptAcquire, sha, o, numLockKeys, 8)
	c.bulk(o.token)
	c.bulkInt(o.ms)
	c.bulkInt(int64(o.slot))
	c.bulkInt(o.waitMs)
	c.bulk(readMarker)
	c.bulk(boolArg(o.noReentry))
	c.bulkInt(n.markMargin)
	c.bulk(cmp.Or(o.attempt, o.mark))
}

// wholeAcquires marks the exclusive acquires of ops to send as
// acquireScript at once, or is nil when there are none: those whose first
// step could find the key held and leave the rest to a second round trip
// (send), while a later operation of the batch touches the same key. That
// one would run before the acquire's second step: its own roll-back would
// release the token's earlier hold, and another token's SET NX could be
// granted in between. An acquire that a held key refuses outright (a
// token lockproxy generated, no wait) has no second step.
func wholeAcquires(ops []*op) []bool {
	var whole []bool
	for i, o := range ops {
		if o.kind != opAcquire || o.mode == quorum.Shared || o.noReentry && o.waitMs == 0 {
			continue
		}
		for _, p := range ops[i+1:] {
			if p.base == o.base {
				if whole == nil {
					whole = make([]bool, len(ops))
				}
				whole[i] = true
				break
			}
		}
	}
	return whole
}

// addAcquireMarked adds the first step of an acquire marked with an
// attempt (see op.attempt and acquireMarkedScript).
func (n *Node) addAcquireMarked(c *nodeConn, sha bool, o *op) {
	beginScript(c, scriptAcquireMarked, sha, 5, 5)
	c.bulk3(n.prefix, "lock:", o.base)
	c.bulk3(n.prefix, "lockf:", o.base)
	c.bulk3(n.prefix, "lockm:", o.base)
	c.bulk3(n.prefix, "lockw:", o.base)
	c.bulk(n.fenceKey)
	c.bulk(o.token)
	c.bulkInt(o.ms)
	c.bulkInt(int64(o.slot))
	c.bulk(o.attempt)
	c.bulk(boolArg(o.waitMs > 0))
}

// addReleaseArgs adds o's four release script arguments.
func (n *Node) addReleaseArgs(c *nodeConn, o *op) {
	c.bulk(o.token)
	c.bulk3(n.prefix, "released:", o.base)
	c.bulk(readMarker)
	c.bulk(releaseHoldArg[o.hold])
}

// addFenceWrite adds SET lockf:<key> "<fence>,<token>" PX ms, and the
// ZREM of a granted writer's mark (an older lockproxy's string mark
// answers WRONGTYPE and stays: it is not this writer's).
func (n *Node) addFenceWrite(c *nodeConn, fw fenceWrite) {
	if !fw.gone {
		c.begin(5)
		c.bulk("SET")
		c.bulk3(n.prefix, "lockf:", fw.base)
		c.bulkIntTail(fw.fence, ",", fw.token)
		c.bulk("PX")
		c.bulkInt(fw.ms)
	}
	if fw.mark {
		c.begin(3)
		c.bulk("ZREM")
		c.bulk3(n.prefix, "lockw:", fw.base)
		c.bulk(fw.token)
	}
}

// addRaise adds a raise of base's fence for a grant to token (see
// raiseFenceScript): a read grant's (read) or a write grant's.
func (n *Node) addRaise(c *nodeConn, sha bool, base, token string, slot uint16, fence int64, read bool) {
	c.begin(3 + 4 + 4)
	c.bulk(evalName(sha))
	c.bulk(scriptSource(scriptRaiseFence, sha))
	c.bulk("4")
	c.bulk3(n.prefix, "lock:", base)
	c.bulk(n.fenceKey)
	c.bulk3(n.prefix, "lockf:", base)
	c.bulk3(n.prefix, "lockr:", base)
	c.bulk(token)
	c.bulkInt(int64(slot))
	c.bulkInt(fence)
	if read {
		c.bulk(readMarker)
	} else {
		c.bulk("")
	}
}

// fenceWriteCommands is how many commands addFenceWrite sends for ws.
func fenceWriteCommands(ws []fenceWrite) int {
	k := 0
	for _, w := range ws {
		if !w.gone {
			k++
		}
		if w.mark {
			k++
		}
	}
	return k
}

func evalName(sha bool) string {
	if sha {
		return "EVALSHA"
	}
	return "EVAL"
}

func scriptSource(s script, sha bool) string {
	if sha {
		return s.sha
	}
	return s.src
}

// intResult reads a 0/1 script answer.
func intResult(r *reply) opResult {
	switch {
	case r.err != nil:
		return opResult{err: r.err}
	case r.kind == ':':
		return opResult{n: r.n}
	}
	return opResult{err: fmt.Errorf("unexpected reply %q to a lock script", r.kind)}
}

// maxReleasesPerCall bounds the releases one script call carries: the
// node runs nothing else for the call's length.
const maxReleasesPerCall = 64

// sharedReleases marks the releases of ops whose key no other op of the
// batch touches; they may share a script call. nil when fewer than two.
func (w *writer) sharedReleases(ops []*op) []bool {
	releases := 0
	for _, o := range ops {
		if o.kind == opRelease {
			releases++
		}
	}
	if releases < 2 {
		return nil
	}
	if w.seen == nil {
		w.seen = make(map[string]int, len(ops))
	}
	seen := w.seen
	clear(seen)
	for _, o := range ops {
		seen[o.base]++
	}
	shared := append(w.shared[:0], make([]bool, len(ops))...)
	w.shared = shared
	count := 0
	for i, o := range ops {
		if o.kind == opRelease && !o.lateGrant && !o.scoped && seen[o.base] == 1 {
			shared[i] = true
			count++
		}
	}
	if count < 2 {
		return nil
	}
	return shared
}

// releaseResults reads a release script's answers, one 0 or 1 per release.
func releaseResults(r *reply, want int) ([]int64, error) {
	if r.err != nil {
		return nil, r.err
	}
	if r.kind == '*' && !r.null && len(r.arr) == want {
		out := make([]int64, want)
		ok := true
		for i := range r.arr {
			e := &r.arr[i]
			if e.kind != ':' || (e.n != 0 && e.n != 1) {
				ok = false
				break
			}
			out[i] = e.n
		}
		if ok {
			return out, nil
		}
	}
	// Whatever answers here is not a node we can trust with locks.
	return nil, fmt.Errorf("unexpected reply to the release script (%q, %d elements)", r.kind, len(r.arr))
}

// writeFences writes a batch's fence writes on the writer's connection,
// under the batch's deadline, without waiting for their answers (see
// exec); the next batch or readPending reads them. Their answers do not
// matter: a write that fails leaves reentrant grants to take the other
// nodes' fence or the slot counter, and LOCKINFO the slot counter (see the
// scripts).
func (n *Node) writeFences(w *writer, ws []fenceWrite) {
	c := w.conn
	if c == nil {
		return // the batch's connection failed: nothing to write them on
	}
	if n.beforeFenceStore != nil {
		n.beforeFenceStore()
	}
	for _, f := range ws {
		n.addFenceWrite(c, f)
	}
	w.fenceWrites = append(w.fenceWrites, ws...)
	w.pending += fenceWriteCommands(ws)
	if err := c.flush(); err != nil {
		// Part of the write may have gone out.
		w.lost(c, nil)
	}
}

// readPending reads the answers to fence writes still on the connection,
// within the node timeout: on a node that stopped answering the writer
// must not stall longer than a batch could, or every operation queued
// behind it is late.
func (n *Node) readPending(w *writer) {
	if w.pending == 0 || w.conn == nil {
		return
	}
	c := w.conn
	_ = c.nc.SetDeadline(time.Now().Add(n.timeout))
	var r reply
	for ; w.pending > 0; w.pending-- {
		if err := c.read(&r); err != nil {
			// The fence writes may still be on their way to the node and
			// run after what the next connection sends (see owed.lost).
			w.lost(c, nil)
			return
		}
	}
	w.fenceWrites = w.fenceWrites[:0]
}

func boolArg(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// releaseHoldArg is the release script's ARGV[4] for each quorum.Hold.
var releaseHoldArg = [...]string{quorum.AnyHold: "", quorum.WriteHold: "w", quorum.ReadHold: "r"}

// acquireResult reads an acquire script's answer: {fence, holds} or
// {fence, holds, slot counter} (granted), {-1, lease ms or -1, holder}
// (refused), 0 (refused, lease unknown) or -1 (upgrade).
func acquireResult(r *reply) opResult {
	switch {
	case r.err != nil:
		return opResult{err: r.err}
	case r.kind == ':':
		if r.n == -1 {
			return opResult{n: acquireUpgrade}
		}
		return opResult{n: acquireRefused}
	case r.kind == '*' && !r.null && len(r.arr) == 3 && r.arr[0].kind == ':' && r.arr[0].n == -1:
		// A refusal: a grant's first element is a fence, never negative.
		if l, h := &r.arr[1], &r.arr[2]; l.kind == ':' && l.n >= -1 && h.kind == '$' && !h.null {
			return opResult{n: acquireRefused, lease: max(l.n, 0), leased: l.n >= 0, holder: string(h.s)}
		}
	case r.kind == '*' && !r.null && (len(r.arr) == 2 || len(r.arr) == 3):
		var v [3]int64
		ok := true
		for i := range r.arr {
			if r.arr[i].kind != ':' {
				ok = false
				break
			}
			v[i] = r.arr[i].n
		}
		if ok && v[0] >= 0 && v[1] > 0 && v[2] >= 0 {
			return opResult{n: v[0], holds: v[1], counter: v[2]}
		}
	}
	// Whatever answers here is not a node we can trust with locks.
	return opResult{err: fmt.Errorf("unexpected reply to the acquire script (%q, %d elements)", r.kind, len(r.arr))}
}

// reasonLabel maps an error to a closed set of metric label values.
func reasonLabel(err error) string {
	switch r := quorum.Reason(err); r {
	case "timeout", "canceled", "connection refused", "connection reset", "connection closed", "quarantined", "replica", "clock":
		return strings.ReplaceAll(r, " ", "_")
	default:
		return "error"
	}
}

// String names the node for logs.
func (n *Node) String() string { return fmt.Sprintf("redis node %s", n.name) }

// earlier is the earlier of t and u.
func earlier(t, u time.Time) time.Time {
	if u.Before(t) {
		return u
	}
	return t
}
