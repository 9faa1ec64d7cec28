package quorum

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Mode says whether a lock is exclusive or shared.
type Mode uint8

const (
	// Exclusive is a write lock: one holder at a time.
	Exclusive Mode = iota
	// Shared is a read lock: many readers, exclusive with writers.
	Shared
)

// Hold says which holds a release may remove.
type Hold uint8

const (
	// AnyHold is UNLOCK: the token's write hold if it has one, else a read
	// hold.
	AnyHold Hold = iota
	// WriteHold only: the roll-back of a failed exclusive attempt, which
	// must not take a read hold the token has (a refused upgrade).
	WriteHold
	// ReadHold only: the roll-back of a failed read attempt, which must not
	// take the write hold of a token that was downgrading.
	ReadHold
)

// rollbackHold is the hold a failed attempt in mode m may have added.
func rollbackHold(m Mode) Hold {
	if m == Shared {
		return ReadHold
	}
	return WriteHold
}

// Request is one acquisition as every node sees it.
type Request struct {
	Key   string
	Token string
	TTL   time.Duration
	Mode  Mode
	// WriterWait, for an exclusive request that will try again (LOCK …
	// WAIT), asks nodes where the key is held to mark a writer waiting
	// for at most this long (a node ends the mark sooner, when the lease
	// that refused it ends plus a grace), so that new readers queue
	// behind it (writer preference across instances). Zero for a single
	// attempt.
	WriterWait time.Duration
	// NoReentry: a node where the token already holds the key refuses,
	// like SET NX, instead of adding a hold.
	NoReentry bool
	// Attempt names an attempt that may join a hold of its token: an
	// exclusive one that is not NoReentry, and every shared one (a read
	// hold of the token may be there before it). Acquire sets it when
	// empty, and its roll-back carries it (RollbackAttempt), so that a
	// node that lost the attempt's answer removes only a hold that
	// attempt made.
	Attempt string
	// JoinBy is the latest an attempt that may join its token's hold
	// waits for that token's other attempts on the key to end (see
	// enterJoin): LOCK … WAIT sets its WAIT's end, so that a client is
	// not kept past it by an attempt of its own token. Zero: the node
	// timeout after Acquire is called. Past it, Acquire answers
	// ErrNotAcquired without having tried.
	JoinBy time.Time
	// OwnToken, for a NoReentry attempt, says that Token holds nothing on
	// any node but what this caller's own attempts made there: lockproxy
	// made it for one LOCK or RLOCK without TOKEN. A roll-back that reaches a node where
	// the attempt was refused then takes nothing it should not, so a
	// refused attempt need not hear out a node that has not answered (a
	// silent one takes the node timeout and more, and its roll-back as
	// long again, while the caller, a waiter, could not try again): once
	// the answer is ErrNotAcquired whatever the nodes still unheard say,
	// it gives them TimeoutMin to answer, as healthy nodes answer within
	// about a millisecond of each other, and then sends them its
	// roll-back at once, queued behind the attempt on each node, and
	// answers without waiting for the roll-back's answers
	// (backends/redis TestWaitHandOverWithSilentNode). Only where every
	// node is an AsyncNode, whose Start methods queue operations in the
	// order they are started, so that the same token's next attempt
	// reaches each node after the roll-back (a plain Node's roll-back
	// would run on a goroutine of its own, in no order with it).
	//
	// An attempt that may join its token's hold (not NoReentry: a LOCK
	// or RLOCK with TOKEN) is refused as fast, without OwnToken: its
	// token may hold the key on a node not heard, so a plain release
	// there could take that hold, but the roll-back those nodes get is
	// scoped to the attempt (RollbackScoped): it removes only a hold the
	// attempt made there and its mark still names, and nothing where the
	// attempt was refused, joined a hold, or a later request of the token
	// (its next attempt included) changed the hold since, whatever order
	// the node runs them in. A hold it joined on such a node is left
	// there until its lease ends: one of a token that holds the key on no
	// majority (every node where the token holds it grants, and a
	// majority refused), which no one was told of. A node heard granting
	// afresh gets the scoped roll-back too, one heard joining the plain
	// one (it takes one hold, the attempt's).
	// Transparent mode's SET NX (NoReentry without OwnToken) still hears
	// every node out: its attempt carries no mark, and its value may hold
	// the key on a node not heard.
	OwnToken bool
}

// attemptPrefix makes the attempt names of this process unlike those of
// any other on the same nodes; attemptSeq unlike each other.
var (
	attemptPrefix = func() string {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			panic("quorum: no randomness for attempt names: " + err.Error())
		}
		return hex.EncodeToString(b[:])
	}()
	attemptSeq atomic.Uint64
)

// NewAttempt is a new attempt name (see Request.Attempt).
func NewAttempt() string {
	return attemptPrefix + strconv.FormatUint(attemptSeq.Add(1), 36)
}

// NodeGrant is one node's answer to an acquisition.
type NodeGrant struct {
	// Acquired is false when another holder has the key on this node.
	Acquired bool
	// Fence is the node's fence counter for the key after the acquisition;
	// for a reentrant grant, the fence stored with the hold it joins.
	Fence uint64
	// Holds is the token's hold count on this node after the grant.
	Holds int64
	// Upgrade is set on a refusal because the token holds the key for
	// reading on this node and asked for it exclusively.
	Upgrade bool
	// Counter, for a reentrant grant, is the key's fence counter on the
	// node: at least the hold's fence, for when Fence is 0 (not stored).
	Counter uint64
	// WriteHeld, for a read grant, says the token holds the key for
	// writing on this node too (a downgrade).
	WriteHeld bool
}

// Node is one independent lock store. Every method must return by the time
// ctx is done. Implementations report a key held by someone else as a normal
// answer (Acquired false, or false from Release/Extend), and only transport
// or server failures as errors.
type Node interface {
	Name() string
	Acquire(ctx context.Context, req Request) (NodeGrant, error)
	// RaiseFence raises the key's fence counter to at least fence, only
	// while token still holds key on this node. It reports whether it did.
	RaiseFence(ctx context.Context, key, token string, fence uint64) (bool, error)
	// Release removes one hold of key by token, of the kind hold says.
	Release(ctx context.Context, key, token string, hold Hold) (bool, error)
	Extend(ctx context.Context, key, token string, ttl time.Duration) (bool, error)
}

// AsyncNode is a Node that can start an operation and report its answer
// through a callback, run on the node's own goroutine. The quorum then
// needs no goroutine per node per operation, which on the hot path is a
// measurable share of the CPU (see test/bench). Each Start method must call
// done exactly once, by ctx's deadline (which it enforces itself: ctx may
// carry a deadline without being canceled at it) or soon after, and done
// must not block.
type AsyncNode interface {
	Node
	StartAcquire(ctx context.Context, req Request, done func(NodeGrant, error))
	StartRaiseFence(ctx context.Context, key, token string, fence uint64, done func(bool, error))
	StartRelease(ctx context.Context, key, token string, hold Hold, done func(bool, error))
	StartExtend(ctx context.Context, key, token string, ttl time.Duration, done func(bool, error))
}

// ReadFenceRaiser is a Node that can raise its fence counter for a read
// grant. RaiseReadFence raises the key's fence counter to at least fence,
// only while token still holds key for reading on this node (its read
// lease has not ended there), and stores nothing with the hold: a read
// grant's fence is not the write hold's. It reports whether it did. A node
// without it cannot be raised for a read grant, which then stands only
// where a majority of its granting nodes already agree on the fence.
type ReadFenceRaiser interface {
	RaiseReadFence(ctx context.Context, key, token string, fence uint64) (bool, error)
}

// AsyncReadFenceRaiser is RaiseReadFence in AsyncNode's form.
type AsyncReadFenceRaiser interface {
	StartRaiseReadFence(ctx context.Context, key, token string, fence uint64, done func(bool, error))
}

// errNoReadRaise is the failure of a node that cannot raise a read grant's
// fence (it is no ReadFenceRaiser).
var errNoReadRaise error = noReadRaiseError{}

type noReadRaiseError struct{}

func (noReadRaiseError) Error() string  { return "quorum: node cannot raise a read grant's fence" }
func (noReadRaiseError) Reason() string { return "cannot raise a read grant's fence" }

// Clock gives monotonic time. Tests inject their own.
type Clock interface {
	Now() time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Config holds the tunables of the algorithm. Zero timeouts take the
// defaults below; a zero drift factor or minimum means no allowance, which
// only tests should want.
type Config struct {
	// DriftFactor and DriftMin give the clock-drift allowance subtracted from
	// every validity: ttl*DriftFactor + DriftMin.
	DriftFactor float64
	DriftMin    time.Duration
	// TimeoutFactor of the TTL is the per-node timeout, clamped to
	// [TimeoutMin, TimeoutMax]: a node that cannot answer within a small part
	// of the lease is worth less than the lease time it would eat.
	TimeoutFactor float64
	TimeoutMin    time.Duration
	TimeoutMax    time.Duration
	Clock         Clock
	// ExtraDrift, when set, returns further drift to allow for, such as the
	// clock-rate error measured on the nodes.
	ExtraDrift func(ttl time.Duration) time.Duration
}

// Defaults for Config; the drift formula is antirez's reference
// implementation's (1 % of the TTL plus 2 ms for expiry precision).
const (
	DefaultDriftFactor   = 0.01
	DefaultDriftMin      = 2 * time.Millisecond
	DefaultTimeoutFactor = 0.05
	DefaultTimeoutMin    = 10 * time.Millisecond
	DefaultTimeoutMax    = 250 * time.Millisecond
)

// Lease is a successful acquisition.
type Lease struct {
	Token string
	// Validity is how long, from the moment Acquire returned, the holder may
	// act as the holder.
	Validity time.Duration
	Fence    uint64
	// Holds is the token's hold count after the grant (more than 1 for a
	// reentrant grant), the highest any granting node reports.
	Holds int64
	// Nodes is how many nodes granted.
	Nodes int
}

var (
	// ErrNotAcquired means another holder has the key on enough nodes that
	// no majority could grant it.
	ErrNotAcquired = errors.New("quorum: lock held by another holder")
	// ErrNoQuorum means too many nodes failed to answer to decide.
	ErrNoQuorum = errors.New("quorum: no quorum")
	// ErrExpired means a majority granted, but the time spent doing so left
	// no validity, so the grant was rolled back.
	ErrExpired = errors.New("quorum: validity ran out while acquiring")
	// ErrUpgrade means the token holds the key for reading and asked for
	// it exclusively; no node grants that.
	ErrUpgrade = errors.New("quorum: read lock held by this token; upgrade refused")
)

// errHoldLost is a granting node's failure when raising its fence found
// the token no longer holding the key there (its lease ran out meanwhile).
var errHoldLost error = holdLostError{}

type holdLostError struct{}

func (holdLostError) Error() string  { return "quorum: hold lost before its fence was stored" }
func (holdLostError) Reason() string { return "hold lost before its fence was stored" }

// NodeError is one node's failure.
type NodeError struct {
	Node string
	Err  error
}

func (e NodeError) Error() string { return e.Node + " " + Reason(e.Err) }
func (e NodeError) Unwrap() error { return e.Err }

// NoQuorumError lists the nodes that failed when a majority could not answer.
type NoQuorumError struct {
	OK       int // nodes that answered
	Total    int
	Failures []NodeError
}

func (e *NoQuorumError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d/%d nodes", e.OK, e.Total)
	for i, f := range e.Failures {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString(", ")
		}
		b.WriteString(f.Error())
	}
	return b.String()
}

func (e *NoQuorumError) Unwrap() error { return ErrNoQuorum }

// noQuorum builds the error with the failures in configuration order, so
// the same fault always reads the same.
func (q *Quorum) noQuorum(ok int, failures []NodeError) *NoQuorumError {
	order := make(map[string]int, len(q.nodes))
	for i, nd := range q.nodes {
		order[nd.Name()] = i
	}
	sort.SliceStable(failures, func(i, j int) bool { return order[failures[i].Node] < order[failures[j].Node] })
	return &NoQuorumError{OK: ok, Total: len(q.nodes), Failures: failures}
}

// Unsent reports whether err says that the node never received the
// operation (it was dropped before it was sent: a deadline that passed in
// the node's queue, a node taken out of quorums). Nodes mark such errors
// with an Unsent() bool method. A failed acquisition does not roll back on
// such a node: there is nothing to undo, and a release could take a hold
// the token already had there (a reentrant attempt).
func Unsent(err error) bool {
	var u interface{ Unsent() bool }
	return errors.As(err, &u) && u.Unsent()
}

// Reason names a node failure in a few words for error replies: the words
// operators grep for, never a raw internal error chain.
func Reason(err error) string {
	if err == nil {
		return "ok"
	}
	// An error that names its own cause comes before the deadline it may
	// wrap: a TLS handshake the node never answered (TLS towards a
	// plain-text port, conf.HandshakeNoReplyError) ran out its deadline
	// too, and "timeout" would hide why.
	var r interface{ Reason() string }
	if errors.As(err, &r) {
		return r.Reason()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	if errors.Is(err, context.Canceled) {
		return "canceled"
	}
	if why := tlsReason(err); why != "" {
		return why
	}
	s := err.Error()
	switch {
	case strings.Contains(s, "connection refused"):
		return "connection refused"
	case strings.Contains(s, "connection reset"):
		return "connection reset"
	case strings.Contains(s, "i/o timeout"), strings.Contains(s, "deadline exceeded"):
		return "timeout"
	case strings.Contains(s, "EOF"), strings.Contains(s, "broken pipe"), strings.Contains(s, "use of closed"):
		return "connection closed"
	}
	if len(s) > 80 {
		s = s[:80]
	}
	return "error: " + s
}

// tlsReason names a failed TLS handshake, or is "".
func tlsReason(err error) string {
	var (
		unknownCA x509.UnknownAuthorityError
		badName   x509.HostnameError
		invalid   x509.CertificateInvalidError
		notTLS    tls.RecordHeaderError
	)
	switch {
	case errors.As(err, &unknownCA):
		return "tls: certificate signed by an unknown authority"
	case errors.As(err, &badName):
		return "tls: certificate not valid for this address"
	case errors.As(err, &invalid):
		return "tls: certificate invalid (expired or not for a server?)"
	case errors.As(err, &notTLS):
		return "tls: the node does not speak TLS"
	}
	return ""
}

// Quorum runs RedLock over a fixed set of nodes.
type Quorum struct {
	nodes    []Node
	cfg      Config
	allAsync bool
	// joins runs a token's overlapping attempts on one key one
	// after another (see enterJoin).
	joins joinGate
	// rollbacks counts the roll-backs sent without waiting for their
	// answers (see startReleaseAll).
	rollbacks inFlight
}

// joinGate holds the attempts that may join a hold (not
// NoReentry) under way, by key and token. A token's attempts that overlap
// would otherwise meet on the nodes in different orders: on each node one
// of them grants afresh and the others join its hold, some before the
// fresh grant's fence is stored there (a node stores it after answering,
// see backends/redis Node.exec), so each attempt settles on a fence of its
// own from what it happened to see (the stored fence, the slot counter,
// which the other attempts' increments moved on) and the token's one hold
// ends up with several fences told to its holders. Run one after another,
// a later attempt is a reentry that starts after the earlier one answered
// and settled its fence on the nodes, and keeps that fence (reentryFence),
// or, if the earlier one failed and was rolled back, an attempt of its
// own.
type joinGate struct {
	mu sync.Mutex
	// A present entry is an attempt under way; the attempts waiting
	// behind it are its turns, first come first served.
	m map[joinKey]*joinTurns
}

type joinKey struct{ key, token string }

// joinTurns is the attempts waiting for the one under way on a key and
// token, in order. An ending attempt hands the gate to the first by
// closing its channel (the entry stays: it is now that one's), so one
// waiter wakes, not all of them.
type joinTurns struct{ waiting []chan struct{} }

// enterJoin waits until no other attempt of req's token on its key is
// under way in this Quorum, then registers req's; the returned func ends
// it. Only attempts that may join a hold wait: a NoReentry attempt (a
// token lockproxy generated, transparent mode's SET NX) never joins one,
// so the common grant pays nothing here. A read attempt's fence is not
// the hold's (see settleFence), but a node keeps one attempt mark per
// reader token (backends/redis lateReadReleaseScript): two overlapping
// read attempts of a token that both fail on a node whose answers were
// lost would leave one of their holds there until its lease ends, so
// read attempts with a TOKEN wait too.
//
// A waiter gives up with ctx, or at req.JoinBy (the node timeout from now
// when zero) with ErrNotAcquired: an attempt ahead of it can take a node
// timeout and more (a roll-back, the fence's settling), and a queue of
// them longer still, which a LOCK without WAIT, or one whose WAIT ends
// sooner, must not wait for.
func (q *Quorum) enterJoin(ctx context.Context, req Request) (func(), error) {
	if req.NoReentry {
		return func() {}, nil
	}
	g, k := &q.joins, joinKey{req.Key, req.Token}
	leave := func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		t := g.m[k]
		if len(t.waiting) == 0 {
			delete(g.m, k)
			return
		}
		next := t.waiting[0]
		t.waiting = t.waiting[1:]
		close(next) // under mu: a waiter that gives up sees it (below)
	}
	g.mu.Lock()
	t, busy := g.m[k]
	if !busy {
		if g.m == nil {
			g.m = make(map[joinKey]*joinTurns)
		}
		g.m[k] = &joinTurns{}
		g.mu.Unlock()
		return leave, nil
	}
	turn := make(chan struct{})
	t.waiting = append(t.waiting, turn)
	g.mu.Unlock()

	by := req.JoinBy
	if by.IsZero() {
		by = time.Now().Add(q.NodeTimeout(req.TTL))
	}
	timer := time.NewTimer(time.Until(by))
	defer timer.Stop()
	var err error
	select {
	case <-turn:
		return leave, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-timer.C:
		err = ErrNotAcquired
	}
	g.mu.Lock()
	select {
	case <-turn:
		// Handed the gate as it gave up: pass it on.
		g.mu.Unlock()
		leave()
		return nil, err
	default:
	}
	t.waiting = slices.DeleteFunc(t.waiting, func(c chan struct{}) bool { return c == turn })
	g.mu.Unlock()
	return nil, err
}

// deadlineCtx carries a deadline without arming a timer. AsyncNodes
// enforce their deadlines themselves, so the hot path need not pay for a
// timer per operation.
type deadlineCtx struct {
	context.Context
	deadline time.Time
	// timeout is the node timeout the deadline was set with, from when
	// it was set; 0 where the deadline is parent's (see DeadlineSet). A
	// duration, not the time it was set: the context stays in the
	// allocation size it had.
	timeout time.Duration
}

func (c deadlineCtx) Deadline() (time.Time, bool) { return c.deadline, true }

// DeadlineSet tells when the deadline of ctx, a node context of the
// quorum's (or NodeContext's), was set. A node handed an operation after
// such a deadline knows that it passed in lockproxy itself, between the
// quorum's setting it and the handing over, where nothing waits but the
// process (it was stopped: SIGSTOP, a VM pause, a long stall), and not
// at the caller: a deadline that had passed when the caller asked (a
// KEEPALIVE renewal asked for after the validity it last answered) is
// the caller's own, never one set here (Extend's node timeout, cut to
// what is left of its caller's, is then none). It reports false for any
// other context.
func DeadlineSet(ctx context.Context) (time.Time, bool) {
	c, ok := ctx.(deadlineCtx)
	if !ok || c.timeout <= 0 {
		return time.Time{}, false
	}
	return c.deadline.Add(-c.timeout), true
}

// NodeContext is a context for operations on AsyncNodes, which enforce
// their deadlines themselves: parent's values, without its cancellation
// or deadline, and a deadline timeout from now, which DeadlineSet tells
// of. No timer is armed, and nothing cancels it.
func NodeContext(parent context.Context, timeout time.Duration) context.Context {
	return deadlineCtx{Context: context.WithoutCancel(parent), deadline: time.Now().Add(timeout), timeout: timeout}
}

// nodeContext is the context node operations run under, bounded by
// timeout. The deadline is wall time (not cfg.Clock), as nodes compare it
// with the time they answer.
func (q *Quorum) nodeContext(parent context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if q.allAsync {
		c := deadlineCtx{Context: parent, deadline: time.Now().Add(timeout), timeout: timeout}
		if pd, ok := parent.Deadline(); ok && pd.Before(c.deadline) {
			c.deadline, c.timeout = pd, 0
		}
		return c, func() {}
	}
	return context.WithTimeout(parent, timeout)
}

// New returns a Quorum over nodes. It needs at least one node.
func New(nodes []Node, cfg Config) (*Quorum, error) {
	if len(nodes) == 0 {
		return nil, errors.New("quorum: no nodes")
	}
	if !(cfg.DriftFactor >= 0 && cfg.DriftFactor < 0.5) { // NaN too
		return nil, fmt.Errorf("quorum: drift factor %v out of [0, 0.5)", cfg.DriftFactor)
	}
	if cfg.TimeoutFactor == 0 {
		cfg.TimeoutFactor = DefaultTimeoutFactor
	}
	if cfg.TimeoutMin == 0 {
		cfg.TimeoutMin = DefaultTimeoutMin
	}
	if cfg.TimeoutMax == 0 {
		cfg.TimeoutMax = DefaultTimeoutMax
	}
	if cfg.TimeoutMax < cfg.TimeoutMin {
		cfg.TimeoutMax = cfg.TimeoutMin
	}
	if cfg.Clock == nil {
		cfg.Clock = systemClock{}
	}
	q := &Quorum{nodes: append([]Node(nil), nodes...), cfg: cfg, allAsync: true}
	for _, nd := range nodes {
		if _, ok := nd.(AsyncNode); !ok {
			q.allAsync = false
		}
	}
	return q, nil
}

// Size is the number of nodes.
func (q *Quorum) Size() int { return len(q.nodes) }

// Majority is the number of nodes that must agree: N/2+1.
func (q *Quorum) Majority() int { return len(q.nodes)/2 + 1 }

// Nodes returns the nodes, in configuration order.
func (q *Quorum) Nodes() []Node { return q.nodes }

// Drift is the allowance for clock drift subtracted from a lease of ttl.
func (q *Quorum) Drift(ttl time.Duration) time.Duration {
	d := time.Duration(float64(ttl)*q.cfg.DriftFactor) + q.cfg.DriftMin
	if q.cfg.ExtraDrift != nil {
		d += q.cfg.ExtraDrift(ttl)
	}
	return d
}

// NodeTimeout is the time each node gets to answer for a lease of ttl.
func (q *Quorum) NodeTimeout(ttl time.Duration) time.Duration {
	t := time.Duration(float64(ttl) * q.cfg.TimeoutFactor)
	if t < q.cfg.TimeoutMin {
		t = q.cfg.TimeoutMin
	}
	if t > q.cfg.TimeoutMax {
		t = q.cfg.TimeoutMax
	}
	return t
}

type grantResult struct {
	idx   int
	grant NodeGrant
	err   error
}

type boolResult struct {
	idx int
	ok  bool
	err error
}

// Acquire tries once to take req on a majority of nodes. It returns the
// lease, or ErrNotAcquired, ErrExpired, or a *NoQuorumError. On any failure
// the key is released on every node, including those that did not answer.
func (q *Quorum) Acquire(ctx context.Context, req Request) (Lease, error) {
	leave, err := q.enterJoin(ctx, req)
	if err != nil {
		return Lease{}, err
	}
	// Left only once the attempt settled its fence or was rolled back on
	// every node it reached: what the next attempt of the token finds.
	defer leave()
	if (req.Mode == Shared || !req.NoReentry) && req.Attempt == "" {
		req.Attempt = NewAttempt()
	}
	n, need := len(q.nodes), q.Majority()
	// After the wait: the lease on the nodes starts with this attempt.
	start := q.cfg.Clock.Now()
	nodeCtx, cancel := q.nodeContext(ctx, q.NodeTimeout(req.TTL))
	defer cancel()

	// Buffered to N so that a node answering after we decided never blocks.
	// An AsyncNode's StartAcquire is called in turn, not from a goroutine,
	// and the decision waits for the loop: a roll-back never reaches such a
	// node before its attempt was handed over there
	// (TestRollbackNeverOvertakesItsAttempt). A plain Node has no such
	// promise; backends/redis's nodes are AsyncNodes.
	results := make(chan grantResult, n)
	for i, nd := range q.nodes {
		if an, ok := nd.(AsyncNode); ok {
			an.StartAcquire(nodeCtx, req, func(g NodeGrant, err error) {
				results <- grantResult{idx: i, grant: g, err: err}
			})
			continue
		}
		go func(i int, nd Node) {
			g, err := nd.Acquire(nodeCtx, req)
			results <- grantResult{idx: i, grant: g, err: err}
		}(i, nd)
	}

	var (
		granted  = make([]grantResult, 0, n)
		refused  int
		upgrades int
		failures []NodeError
		// refusedBy marks the nodes that answered "held", or never got
		// the attempt: it changed nothing there, so there is nothing to
		// roll back. A release there could even take a hold the token
		// has in another mode (a refused upgrade) or from before (a
		// reentrant attempt).
		refusedBy = make([]bool, n)
	)
	tally := func(r grantResult) {
		switch {
		case r.err != nil:
			failures = append(failures, NodeError{Node: q.nodes[r.idx].Name(), Err: r.err})
			refusedBy[r.idx] = Unsent(r.err)
		case r.grant.Acquired:
			granted = append(granted, r)
		default:
			refused++
			refusedBy[r.idx] = true
			if r.grant.Upgrade {
				upgrades++
			}
		}
	}
	// reentrant counts grants that joined the token's hold: a reentrant
	// grant must keep the hold's fence, which it can only do when a
	// majority joined (see reentryFence).
	reentrant := func() int {
		c := 0
		for _, g := range granted {
			if g.grant.Holds > 1 {
				c++
			}
		}
		return c
	}
	// downgrades counts read grants made where the token holds the key
	// for writing too.
	downgrades := func() int {
		c := 0
		for _, g := range granted {
			if g.grant.WriteHeld {
				c++
			}
		}
		return c
	}
	got := 0
	for ; got < n; got++ {
		// Decide as soon as the outcome is known. A reentrant grant hears
		// out every node (within the node timeout), so that the nodes
		// that lost the hold and grant afresh are set to the hold's fence
		// too, not only those heard first.
		if refused+len(failures) > n-need {
			break
		}
		if len(granted) >= need && (req.Mode == Shared || reentrant() == 0) {
			break
		}
		tally(<-results)
	}

	// hearOut waits for the nodes still answering (each within the node
	// timeout) before a roll-back, so that it skips every node that
	// refused: a refusal not heard yet would get a release, and where the
	// token already holds the key (a NoReentry attempt, transparent
	// mode's SET NX, refused because its value holds it there) that
	// release takes the holder's hold, which the attempt never made
	// (backends/redis TestRefusedSetNXKeepsSameValueHold). It costs no
	// time a roll-back would not: a node's release queues behind its
	// acquire, and the roll-back waits for every node's answer anyway.
	// It also lets the error name every failed node. A node that has not
	// answered by the node timeout's end and the longest node timeout
	// after it (each must answer by the first, "or soon after": a
	// backends/redis writer answers with its batch, whose deadline may be
	// another operation's) gets the release unheard, as before. A limit
	// found passed well after it was due, though, was passed while the
	// process did not run (a stop: SIGSTOP, a VM pause, a long stall):
	// the nodes' answers, there when it runs again, are on their way
	// (backends/redis reads what arrived past a deadline), and the limit
	// first gives them the longest node timeout more, once: a refusal
	// heard only after the roll-back went out would have had it
	// (TestHearOutAcrossStop).
	hearOut := func() {
		if got == n {
			return
		}
		d, _ := nodeCtx.Deadline()
		due := d.Add(q.cfg.TimeoutMax)
		limit := time.NewTimer(time.Until(due))
		defer limit.Stop()
		stretched := false
		for got < n {
			select {
			case r := <-results:
				tally(r)
				got++
			case <-limit.C:
				if !stretched && time.Since(due) > q.cfg.TimeoutMin {
					stretched = true
					limit.Reset(q.cfg.TimeoutMax)
					continue
				}
				return
			}
		}
	}
	// hearWithin waits up to d for the nodes still answering, and
	// reports whether every node was heard.
	hearWithin := func(d time.Duration) bool {
		if got == n {
			return true
		}
		limit := time.NewTimer(d)
		defer limit.Stop()
		for got < n {
			select {
			case r := <-results:
				tally(r)
				got++
			case <-limit.C:
				return false
			}
		}
		return true
	}
	if len(granted) < need {
		// The answer is the one decided on: a refused upgrade heard only
		// now (a leftover read hold on a minority) does not turn it into
		// ErrUpgrade.
		decidedUpgrades := upgrades
		// The answer is ErrNotAcquired (ErrUpgrade when upgrades were
		// refused) even if every node still unheard fails: with OwnToken,
		// or for an attempt marked as one that may join its token's hold,
		// those not heard within TimeoutMin get the roll-back unheard,
		// and it is not waited for (see Request.OwnToken). In the common
		// case the last node answers within it, and the attempt ends as
		// below: one timer, as hearOut's.
		marked := !req.NoReentry
		if q.allAsync && (marked || req.OwnToken && decidedUpgrades == 0) && refused > 0 && len(failures)+(n-got) <= n-need &&
			!hearWithin(q.cfg.TimeoutMin) {
			q.rollBack(ctx, req, refusedBy, granted, false)
			if decidedUpgrades > 0 {
				return Lease{}, ErrUpgrade
			}
			return Lease{}, ErrNotAcquired
		}
		hearOut()
		q.rollBack(ctx, req, refusedBy, granted, true)
		if decidedUpgrades > 0 {
			return Lease{}, ErrUpgrade
		}
		if len(failures) > n-need || (len(failures) > 0 && refused == 0) {
			return Lease{}, q.noQuorum(len(granted)+refused, failures)
		}
		return Lease{}, ErrNotAcquired
	}

	// A grant that joined the token's hold on fewer nodes than a majority
	// is a new one where the hold lapsed (see settleFence). But the nodes
	// that failed may hold it too, its holder still relying on it on a
	// majority: granted, the nodes' hold counts would differ (the nodes
	// granting afresh one lower than those that joined, the failed ones
	// without the added hold), and the UNLOCK of one of the token's holds
	// would take the key off every node but those that joined, leaving the
	// holds left on a minority (backends/redis
	// TestReentryOnMinorityWithFailedNodesKeepsHold: another token was
	// then granted the key within their validity). Whether the hold is on
	// a majority cannot be told, so the attempt is not granted: NOQUORUM,
	// as UNLOCK answers when failed nodes leave it undecided. A read
	// grant stops listening at a majority: the others are heard first,
	// as they may join too; a node still unheard then counts as failed.
	if j := reentrant(); j > 0 && j < need {
		hearOut()
		if j = reentrant(); j > 0 && j < need && j+len(failures)+(n-got) >= need {
			q.rollBack(ctx, req, refusedBy, granted, true)
			return Lease{}, q.noQuorum(len(granted)+refused, failures)
		}
	}

	// Likewise a downgrade (a read grant to the write holder) made where
	// the token holds the key for writing on fewer nodes than a majority,
	// but on a majority counting the nodes that failed: its write hold may
	// be on that majority, its holder told so. Granted, the nodes without
	// the write hold would give their read hold to the UNLOCK that
	// releases the write hold (write holds first), and the read hold would
	// be left on a minority (TestReentryOnMinorityWithFailedNodesKeepsHold,
	// downgrade). Where the write hold is on a majority of the nodes that
	// answered, or on too few for the failed ones to make a majority
	// (it was lost), the grant stands as before.
	if d := downgrades(); d > 0 && d < need {
		hearOut()
		if d = downgrades(); d > 0 && d < need && d+len(failures)+(n-got) >= need {
			q.rollBack(ctx, req, refusedBy, granted, true)
			return Lease{}, q.noQuorum(len(granted)+refused, failures)
		}
	}

	var holds int64
	for _, g := range granted {
		holds = max(holds, g.grant.Holds)
	}
	fresh := reentrant() < need
	if expired(req.TTL - q.cfg.Clock.Now().Sub(start) - q.Drift(req.TTL)) {
		// Already gone: no raise for a grant no one will hold (each costs
		// up to a node timeout, and a raise that finds the hold expired
		// would turn the answer into NOQUORUM).
		hearOut()
		q.rollBack(ctx, req, refusedBy, granted, true)
		return Lease{}, ErrExpired
	}
	fence, raiseFailures, settled := q.settleFence(ctx, req, granted, need, fresh)
	if !settled {
		hearOut()
		q.rollBack(ctx, req, refusedBy, granted, true)
		// Counted once every node was heard out: the nodes that answered
		// are those that granted, less those whose fence could not be
		// raised, and those that refused; every other node is named with
		// why it failed (PROTOCOL.md's k/n). Before, k was the nodes at
		// the fence, which left out the refusals and the late grants.
		return Lease{}, q.noQuorum(len(granted)+refused-len(raiseFailures), append(slices.Clone(failures), raiseFailures...))
	}

	validity := req.TTL - q.cfg.Clock.Now().Sub(start) - q.Drift(req.TTL)
	if expired(validity) {
		hearOut()
		q.rollBack(ctx, req, refusedBy, granted, true)
		return Lease{}, ErrExpired
	}
	return Lease{Token: req.Token, Validity: validity, Fence: fence, Holds: holds, Nodes: len(granted)}, nil
}

// expired reports whether a validity is too short to be of use. Replies
// give validities in whole milliseconds, so one under 1 ms would read as
// 0 (a RENEW answer of 0 says "no longer held"): it counts as none.
func expired(validity time.Duration) bool { return validity < time.Millisecond }

// settleFence makes sure a majority holds the grant's fence (the highest
// counter among the granting nodes) before the grant is returned.
//
// A read grant (req.Mode Shared) is not unique: its fence is the highest
// counter the granting nodes report, at least the fence of every earlier
// grant whose majority shares a node with it. It is strictly below the
// fence of every later write grant only if a majority stores a counter at
// least as high, so that the later write's majority shares a node with
// it, whose HINCRBY goes past it: the granting nodes below it are raised
// to it (ReadFenceRaiser) while the token still holds its read hold there,
// and the grant stands only if a majority is then at the fence. A node's
// answer to a read grant is its counter (or, for a downgrade, the write
// hold's stored fence, which its counter is at least), reentrant or not,
// so reentrant read grants are settled alike; HoldFence is for write
// holds only.
//
// A reentrant grant (fresh false: a majority joined the token's hold)
// keeps the hold's fence, the highest the joining nodes stored; nodes that
// granted afresh (they had lost the hold) are set to it. That is safe: no
// other holder can have been granted the key since the token's last grant,
// as its majority would share a node with the joining majority, where the
// key has been the token's since a grant whose fence that node stored.
// Otherwise the grant is a new one and gets the highest counter of all,
// plus one on a node that joined a hold of the token's (a minority did: a
// leftover of an earlier attempt), which did not count: its answer is the
// hold's fence, or 0 when that was never stored, and only its counter is
// sure to be at least the fence of every grant whose majority it was in.
//
// When too few nodes could be raised it reports false, with the nodes
// that failed to be raised and why: the caller names them with those that
// failed to grant.
func (q *Quorum) settleFence(ctx context.Context, req Request, granted []grantResult, need int, fresh bool) (uint64, []NodeError, bool) {
	var fence uint64
	if req.Mode == Shared {
		for _, g := range granted {
			fence = max(fence, g.grant.Fence)
		}
	} else if fresh {
		for _, g := range granted {
			fence = max(fence, g.grant.Fence)
			if g.grant.Holds > 1 {
				fence = max(fence, g.grant.Counter+1)
			}
		}
	} else {
		fence = reentryFence(granted, need)
	}
	atFence := 0
	for _, g := range granted {
		if g.grant.Fence == fence {
			atFence++
		}
	}
	if atFence >= need && (fresh || req.Mode == Shared || atFence == len(granted)) {
		return fence, nil, true
	}
	// Raise the lagging granting nodes, in parallel, within the node timeout.
	nodeCtx, cancel := q.nodeContext(ctx, q.NodeTimeout(req.TTL))
	defer cancel()
	lagging := 0
	results := make(chan boolResult, len(granted))
	for _, g := range granted {
		if g.grant.Fence == fence {
			continue
		}
		lagging++
		q.startRaise(nodeCtx, g.idx, req, fence, func(ok bool, err error) {
			results <- boolResult{idx: g.idx, ok: ok, err: err}
		})
	}
	var failures []NodeError
	for i := 0; i < lagging; i++ {
		r := <-results
		switch {
		case r.err != nil:
			failures = append(failures, NodeError{Node: q.nodes[r.idx].Name(), Err: r.err})
		case r.ok:
			atFence++
		default:
			failures = append(failures, NodeError{Node: q.nodes[r.idx].Name(), Err: errHoldLost})
		}
	}
	if atFence >= need {
		return fence, nil, true
	}
	return 0, failures, false
}

// startRaise raises node idx's fence for req's grant (RaiseFence, or for
// a read grant RaiseReadFence), calling done once with its answer, in the
// node's own way: its Start method, or a goroutine of its own. ctx is the
// node context, which carries the node timeout.
func (q *Quorum) startRaise(ctx context.Context, idx int, req Request, fence uint64, done func(bool, error)) {
	nd := q.nodes[idx]
	if req.Mode == Shared {
		if an, ok := nd.(AsyncReadFenceRaiser); ok {
			an.StartRaiseReadFence(ctx, req.Key, req.Token, fence, done)
			return
		}
		rr, ok := nd.(ReadFenceRaiser)
		if !ok {
			done(false, errNoReadRaise)
			return
		}
		go func() {
			// ctx may carry its deadline without a timer (every node
			// async, see nodeContext): this call gets one.
			cctx, cancel := ctx, context.CancelFunc(func() {})
			if d, ok := ctx.Deadline(); ok {
				cctx, cancel = context.WithDeadline(ctx, d)
			}
			defer cancel()
			done(rr.RaiseReadFence(cctx, req.Key, req.Token, fence))
		}()
		return
	}
	if an, ok := nd.(AsyncNode); ok {
		an.StartRaiseFence(ctx, req.Key, req.Token, fence, done)
		return
	}
	go func() { done(nd.RaiseFence(ctx, req.Key, req.Token, fence)) }()
}

// reentryFence is the fence of the hold a reentrant grant joins (see
// HoldFence), from the nodes where the grant joined a hold. The counter
// is taken from those that store no fence for it: their hold may be a
// fresh grant made after another holder's (the token's hold lapsed there
// and was granted again, its fence write lost), which only their counter
// is sure to be above.
func reentryFence(granted []grantResult, need int) uint64 {
	var fences []uint64
	var counter uint64
	for _, g := range granted {
		if g.grant.Holds > 1 {
			if g.grant.Fence == 0 {
				counter = max(counter, g.grant.Counter)
			}
			fences = append(fences, g.grant.Fence)
		}
	}
	return HoldFence(fences, counter, need)
}

// HoldFence is the fence of a hold, from the fences the nodes holding it
// stored (0 where none is: the node's answer to the grant was lost, or its
// store is still on its way) and the highest of those nodes' counters. The
// fence a majority stored is the one the hold was granted: those nodes
// held the key for the token since that grant, so no other holder can
// have been granted it meanwhile, and a node that answered the grant late
// may store a fence of its own, higher or lower. Without such a majority,
// the highest stored fence or counter, which is at least that of any grant
// the token's nodes have seen: counter is the highest counter of the nodes
// that store none, where the token's hold may have been granted afresh
// after another holder's grant (its fence write lost), with a fence above
// that grant's and above every stored one.
func HoldFence(stored []uint64, counter uint64, need int) uint64 {
	votes := map[uint64]int{}
	var highest uint64
	for _, f := range stored {
		if f > 0 {
			votes[f]++
			highest = max(highest, f)
		}
	}
	for f, n := range votes {
		if n >= need {
			return f
		}
	}
	return max(highest, counter)
}

// releaseAll releases req on every node, bounded by the node timeout, and
// ignores the outcome: it runs only after a failed acquisition, where each
// node either has our key (and loses it) or does not. A release removes
// one hold, so on a node where the attempt was reentrant it undoes just
// that attempt's hold. scoped makes it the roll-back scoped to the
// attempt (see RollbackScoped and rollBack).
func (q *Quorum) releaseAll(ctx context.Context, req Request, skip []bool, scoped bool) {
	ctx = context.WithValue(ctx, rollbackKey{}, rollbackOf{attempt: req.Attempt, scoped: scoped})
	// Use a context that survives the caller's cancellation: a client that
	// gave up must still not leave keys behind.
	q.fanOutBoolSkip(ctx, q.NodeTimeout(req.TTL), releaseOp(req.Key, req.Token, rollbackHold(req.Mode)), 0, skip)
}

// rollBack sends a failed attempt's roll-back to every node that did not
// refuse it (skip: the nodes that refused), waiting for the answers
// (releaseAll) or not (startReleaseAll). For an attempt that may join its
// token's hold (not NoReentry):
//   - a node heard joining the token's hold gets the plain release, which
//     takes one hold there: the one the attempt added, whatever else the
//     token did there since;
//   - a node heard granting afresh gets the roll-back scoped to the
//     attempt (RollbackScoped): a plain release takes the token's hold
//     whatever happened since, and the token's RENEW or KEEPALIVE renewal,
//     through this instance or another, may have counted that hold (a
//     majority with it) before the roll-back reached it; the scoped one
//     finds the attempt's mark taken off by the renewal and leaves the
//     hold (backends/redis TestScopedRollbackKeepsRenewedGrant);
//   - a node not heard gets the scoped one when the roll-back is not
//     waited for (the client, told no, may go on through another instance
//     meanwhile), and the plain one when it is: queued behind the attempt
//     on the node's writer, it undoes whatever the attempt did there, a
//     join too, and where the attempt's answer was lost the node sends it
//     as the roll-back of an acquire in doubt, scoped to the attempt
//     (see backends/redis lateGrantReleaseScript).
func (q *Quorum) rollBack(ctx context.Context, req Request, skip []bool, granted []grantResult, wait bool) {
	release := q.releaseAll
	if !wait {
		release = q.startReleaseAll
	}
	if req.NoReentry {
		release(ctx, req, skip, false)
		return
	}
	// plain and scoped are the nodes each kind of roll-back skips: the
	// refusals, and those the other kind serves.
	plain, scoped := make([]bool, len(skip)), make([]bool, len(skip))
	for i, refused := range skip {
		plain[i], scoped[i] = refused || !wait, refused || wait
	}
	for _, g := range granted {
		join := g.grant.Holds > 1
		plain[g.idx], scoped[g.idx] = !join, join
	}
	if slices.Contains(plain, false) {
		release(ctx, req, plain, false)
	}
	if slices.Contains(scoped, false) {
		release(ctx, req, scoped, true)
	}
}

// startReleaseAll is releaseAll without waiting for the answers: each
// release is handed to its node (an AsyncNode queues it behind the
// attempt) before it returns, and runs on, bounded by the node timeout.
// WaitRollbacks waits for them. scoped makes them the roll-back scoped
// to the attempt (see RollbackScoped and rollBack).
func (q *Quorum) startReleaseAll(ctx context.Context, req Request, skip []bool, scoped bool) {
	ctx = context.WithValue(ctx, rollbackKey{}, rollbackOf{attempt: req.Attempt, scoped: scoped})
	op := releaseOp(req.Key, req.Token, rollbackHold(req.Mode))
	start, call := op.start, op.call
	op.start = func(ctx context.Context, nd Node, done func(bool, error)) bool {
		q.rollbacks.add()
		if start(ctx, nd, func(ok bool, err error) {
			q.rollbacks.done()
			done(ok, err)
		}) {
			return true
		}
		return false // op.call runs, and counts it done
	}
	op.call = func(ctx context.Context, nd Node) (bool, error) {
		defer q.rollbacks.done()
		return call(ctx, nd)
	}
	q.fanOutBoolSkip(ctx, q.NodeTimeout(req.TTL), op, -1, skip)
}

// WaitRollbacks waits until every roll-back that a refused attempt sent
// without waiting for it (see Request.OwnToken) was answered, or ctx
// ends: before its nodes are closed, which would drop those still
// queued.
func (q *Quorum) WaitRollbacks(ctx context.Context) error {
	return q.rollbacks.wait(ctx)
}

// inFlight counts operations under way; its zero value is ready.
type inFlight struct {
	mu   sync.Mutex
	n    int
	zero chan struct{} // closed when n drops to 0, if someone waits
}

func (f *inFlight) add() {
	f.mu.Lock()
	f.n++
	f.mu.Unlock()
}

func (f *inFlight) done() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n--; f.n == 0 && f.zero != nil {
		close(f.zero)
		f.zero = nil
	}
}

func (f *inFlight) wait(ctx context.Context) error {
	f.mu.Lock()
	if f.n == 0 {
		f.mu.Unlock()
		return nil
	}
	if f.zero == nil {
		f.zero = make(chan struct{})
	}
	zero := f.zero
	f.mu.Unlock()
	select {
	case <-zero:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

type rollbackKey struct{}

// rollbackOf is the ctx value of a roll-back: the attempt it undoes, and
// whether it is scoped to it (see RollbackScoped).
type rollbackOf struct {
	attempt string
	scoped  bool
}

// Rollback tells whether a Release's ctx says it is a failed acquisition's
// roll-back (releaseAll), not a holder's UNLOCK: a node that lost the
// attempt's answer may roll back only what the attempt itself can have
// made there, and must leave a holder's UNLOCK as it is.
func Rollback(ctx context.Context) bool {
	_, ok := ctx.Value(rollbackKey{}).(rollbackOf)
	return ok
}

// RollbackAttempt is the Request.Attempt a roll-back's ctx undoes ("" for
// a NoReentry exclusive attempt, or no roll-back).
func RollbackAttempt(ctx context.Context) string {
	v, _ := ctx.Value(rollbackKey{}).(rollbackOf)
	return v.attempt
}

// RollbackScoped tells whether a roll-back's ctx says it is scoped to its
// attempt (RollbackAttempt, never ""): the attempt may join its token's
// hold (not NoReentry), and this node was heard granting afresh, or was
// not heard and the roll-back is not waited for (see rollBack). The token may hold the key here
// from before, or a renewal of the token may have counted the hold the
// attempt made, so the node must remove a hold only where that attempt
// made it and its mark still says so (for backends/redis,
// lateGrantReleaseScript or lateReadReleaseScript), and nothing where
// the attempt was refused or joined a hold, or a later request of the
// token changed the hold since: it may run after the token's next
// attempt. Every failed attempt of that kind sends it where the rule
// says, heard out or not (through a plain Node too).
func RollbackScoped(ctx context.Context) bool {
	v, _ := ctx.Value(rollbackKey{}).(rollbackOf)
	return v.scoped
}

// boolOp is a Release or Extend in both its forms: start starts it on a
// node that can answer through a callback and reports whether it did;
// call runs it on any node, on a goroutine of the quorum's.
type boolOp struct {
	call  func(context.Context, Node) (bool, error)
	start func(context.Context, Node, func(bool, error)) bool
	// byDeadline: the answers are waited for no longer than the
	// caller's deadline; a node not in by then counts as one that timed
	// out (fanOutBoolSkip).
	byDeadline bool
}

func releaseOp(key, token string, hold Hold) boolOp {
	return boolOp{
		call: func(ctx context.Context, nd Node) (bool, error) { return nd.Release(ctx, key, token, hold) },
		start: func(ctx context.Context, nd Node, done func(bool, error)) bool {
			an, ok := nd.(AsyncNode)
			if ok {
				an.StartRelease(ctx, key, token, hold, done)
			}
			return ok
		},
	}
}

// AsyncExtender is a Node whose Extend can answer through a callback
// (every AsyncNode is one): a node that renews without a goroutine of its
// own per call, as thousands of KEEPALIVE renewals a second need, though
// its other operations have no such form.
type AsyncExtender interface {
	StartExtend(ctx context.Context, key, token string, ttl time.Duration, done func(bool, error))
}

func extendOp(key, token string, ttl time.Duration) boolOp {
	return boolOp{
		call: func(ctx context.Context, nd Node) (bool, error) { return nd.Extend(ctx, key, token, ttl) },
		start: func(ctx context.Context, nd Node, done func(bool, error)) bool {
			ae, ok := nd.(AsyncExtender)
			if ok {
				ae.StartExtend(ctx, key, token, ttl, done)
			}
			return ok
		},
		byDeadline: true,
	}
}

// fanOutBool runs op on every node in parallel and waits for the answers,
// or only until enough answered true when enough > 0. Nodes not waited for
// still carry out the operation; their answers are dropped.
func (q *Quorum) fanOutBool(parent context.Context, timeout time.Duration, op boolOp, enough int) (oks int, failures []NodeError) {
	return q.fanOutBoolSkip(parent, timeout, op, enough, nil)
}

// fanOutBoolSkip is fanOutBool on the nodes whose skip entry is not set
// (all of them for a nil skip). With enough < 0 it waits for no answer.
func (q *Quorum) fanOutBoolSkip(parent context.Context, timeout time.Duration, op boolOp, enough int, skip []bool) (oks int, failures []NodeError) {
	// The nodes not waited for must still finish, even if the caller's
	// context ends as soon as we return: they get their own, which is
	// canceled once every node answered.
	ctx, cancel := q.nodeContext(context.WithoutCancel(parent), timeout)
	results := make(chan boolResult, len(q.nodes))
	sent := 0
	for i, nd := range q.nodes {
		if skip != nil && skip[i] {
			continue
		}
		sent++
		if op.start(ctx, nd, func(ok bool, err error) {
			results <- boolResult{idx: i, ok: ok, err: err}
		}) {
			continue
		}
		go func(i int, nd Node) {
			ok, err := op.call(ctx, nd)
			results <- boolResult{idx: i, ok: ok, err: err}
		}(i, nd)
	}
	// An AsyncNode answers an operation when its writer gets to it: one
	// queued behind a batch on a silent node, or in a batch with a
	// release whose deadline is later (a background release may wait
	// seconds while the node answers on), is answered past its own
	// deadline. For op.byDeadline the nodes not in by the caller's
	// deadline (parent's: the node timeout, often shorter, bounds only
	// the sending, as before) count as timed out.
	// A deadline found passed well after it was due, though, passed while
	// the process did not run (SIGSTOP, a VM pause, a long stall): the
	// nodes' answers are on their way when it runs again (backends/redis
	// reads what arrived past a deadline, and sends a renewal or release
	// that waited out the stop in its queue), and they get the longest
	// node timeout more, once, as Acquire's hearOut gives them. An answer
	// heard then is a fact: an extend ran only where the hold still was
	// (held all along there), and the validity still counts from before
	// the stop (TestUnlockAcrossProxyStop).
	var expired <-chan time.Time
	var answered []bool
	var due time.Time
	if d, ok := parent.Deadline(); ok && op.byDeadline {
		due = d
		t := time.NewTimer(time.Until(d))
		defer t.Stop()
		expired = t.C
		answered = make([]bool, len(q.nodes))
	}
	stretched := false
	got := 0
wait:
	for got < sent && enough >= 0 {
		var r boolResult
		select {
		case r = <-results:
		case <-expired:
			if !stretched && time.Since(due) > q.cfg.TimeoutMin {
				stretched = true
				t := time.NewTimer(q.cfg.TimeoutMax)
				defer t.Stop()
				expired = t.C
				continue
			}
			for i, nd := range q.nodes {
				if (skip == nil || !skip[i]) && !answered[i] {
					failures = append(failures, NodeError{Node: nd.Name(), Err: context.DeadlineExceeded})
				}
			}
			break wait
		}
		if answered != nil {
			answered[r.idx] = true
		}
		got++
		if r.err != nil {
			failures = append(failures, NodeError{Node: q.nodes[r.idx].Name(), Err: r.err})
		} else if r.ok {
			oks++
		}
		if enough > 0 && oks >= enough {
			break
		}
	}
	if got == sent || q.allAsync {
		cancel()
	} else {
		go func(left int) {
			for ; left > 0; left-- {
				<-results
			}
			cancel()
		}(sent - got)
	}
	return oks, failures
}

// Release deletes key on every node where token holds it. It reports true
// when a majority released it, which is when the caller really held it, and
// false when no majority could have. When failed nodes leave it undecided,
// it returns a *NoQuorumError. ttlHint,
// when known, sizes the per-node timeout; otherwise the largest is used.
func (q *Quorum) Release(ctx context.Context, key, token string, ttlHint time.Duration) (bool, error) {
	timeout := q.cfg.TimeoutMax
	if ttlHint > 0 {
		timeout = q.NodeTimeout(ttlHint)
	}
	return q.ReleaseWithin(ctx, key, token, timeout)
}

// ReleaseWithin is Release with each node given timeout to answer, for a
// release no client waits on, which may take longer than any node timeout
// a lease allows.
func (q *Quorum) ReleaseWithin(ctx context.Context, key, token string, timeout time.Duration) (bool, error) {
	// Answer once a majority released: a node that is down or slow must
	// not hold up every UNLOCK by the node timeout.
	oks, failures := q.fanOutBool(ctx, timeout, releaseOp(key, token, AnyHold), q.Majority())
	if oks >= q.Majority() {
		return true, nil
	}
	if oks+len(failures) >= q.Majority() {
		// The nodes that failed may have held it: whether the caller held
		// the lock cannot be told, so say so rather than guess.
		return false, q.noQuorum(len(q.nodes)-len(failures), failures)
	}
	return false, nil
}

// Extend resets the TTL of key on every node where token holds it. It
// returns the new validity when a majority extended it within that validity,
// and 0 otherwise. When too many nodes failed to tell, it returns a
// *NoQuorumError.
//
// The nodes get the node timeout, or until ctx's deadline when that comes
// first: the nodes not waited for still finish past ctx's end, but not
// past its deadline, which says when an answer is too late (a KEEPALIVE
// watchdog's renewal must fail by the end of the validity it last
// answered, so that the loss is told before the lease may end:
// TestExtendWithinCallersDeadline).
func (q *Quorum) Extend(ctx context.Context, key, token string, ttl time.Duration) (time.Duration, error) {
	validity, _, err := q.ExtendWithin(ctx, key, token, ttl, q.NodeTimeout(ttl))
	return validity, err
}

// ExtendWithin is Extend with each node given timeout to answer (still
// no later than ctx's deadline), for a renewal no client waits on: a
// KEEPALIVE watchdog's, which may take as long as the validity it last
// answered allows. A renewal is not an acquisition: the validity it
// answers counts from when it started, less the drift, however long the
// nodes took, so a longer wait only shortens it, and cutting it at the
// node timeout meant that on a host too busy to answer within it every
// renewal failed and the locks were lost at once
// (commands TestKeepaliveRenewalsSurviveOverload). took is how long the
// nodes took (the validity, counted from when it started, is validity +
// took): a caller that counts it from a time of its own taken before the
// call does not count that wait twice.
func (q *Quorum) ExtendWithin(ctx context.Context, key, token string, ttl, timeout time.Duration) (validity, took time.Duration, err error) {
	start := q.cfg.Clock.Now()
	if d, ok := ctx.Deadline(); ok {
		timeout = max(min(timeout, time.Until(d)), 0)
	}
	oks, failures := q.fanOutBool(ctx, timeout, extendOp(key, token, ttl), q.Majority())
	if oks < q.Majority() {
		if oks+len(failures) >= q.Majority() {
			// The nodes that failed may hold it, and a majority may still:
			// "no longer held" would be a guess (and would end a
			// KEEPALIVE lock that one node's timeout left undecided).
			return 0, 0, q.noQuorum(len(q.nodes)-len(failures), failures)
		}
		return 0, 0, nil
	}
	took = q.cfg.Clock.Now().Sub(start)
	validity = ttl - took - q.Drift(ttl)
	if expired(validity) {
		return 0, 0, nil
	}
	return validity, took, nil
}
