package zookeeper

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// Config configures a Backend.
type Config struct {
	Servers []string // host:port of the ensemble's servers
	// Root is the znode under which every key's lock nodes live; it is
	// created (with its parents) when missing.
	Root string
	// SessionTimeout is asked of the servers for the one session this
	// backend holds. A lock is guaranteed only while the session lives,
	// so the validity reported is capped by the session's horizon: 5/12
	// of the smaller of this and the timeout the server negotiated, or
	// 2/3 of it less half of ServerTick when that is set (see
	// sessionHorizon). A server whose maxSessionTimeout is below it
	// negotiates less, which is logged.
	SessionTimeout time.Duration
	// ServerTick is the servers' tickTime, when known; 0 assumes the most
	// it can be with ZooKeeper's default minSessionTimeout (two ticks):
	// half the session timeout.
	ServerTick time.Duration
	// Digest, "user:password", authenticates the session with the digest
	// scheme; every node is then created with an ACL giving that user
	// alone all rights. Empty: no authentication, world-open ACL.
	Digest string
	// DriftFactor and DriftMin make the drift allowance subtracted from
	// every validity, as for RedLock: ttl × DriftFactor + DriftMin.
	DriftFactor float64
	DriftMin    time.Duration
	// StartTimeout bounds New's wait for the first session; 0 means
	// SessionTimeout.
	StartTimeout time.Duration
	Logger       *zap.Logger
	// Registerer, when set, gets the backend's metrics.
	Registerer prometheus.Registerer
}

// Backend is a backends.Backend over one ZooKeeper session.
type Backend struct {
	cfg  Config
	conn *zk.Conn
	acl  []zk.ACL
	log  *zap.Logger
	// serverOf maps each address go-zookeeper may connect to (a server's
	// host resolved, as its host provider resolves it once at start) to
	// the server's index in cfg.Servers: conn.Server() names the address.
	serverOf map[string]int

	// connected is true while the session is established on a server.
	connected atomic.Bool
	// negotiatedMS is the session timeout, in ms, of the last session
	// handshake's answer (0 before the first).
	negotiatedMS atomic.Int64
	// wakeups counts watches fired for waiting Lock calls.
	wakeups atomic.Int64
	// rearms counts watches a waiter set again on the same node after a
	// change that did not unblock it (a renewal or reentry of the node
	// before it): not wakeups, and no children read.
	rearms      atomic.Int64
	expirations atomic.Int64  // sessions expired
	leasesEnded atomic.Int64  // nodes deleted at the end of their lease
	hadSession  chan struct{} // closed on the first session
	hadOnce     sync.Once

	mu      sync.Mutex
	onLost  func(key, token string) // see OnLost; nil for none
	owned   map[string]*ownedNode   // path → a granted node this instance created
	byToken map[heldKey]*ownedNode
	waiters map[string]int        // key → Lock calls waiting here
	waiting int                   // sum of waiters
	watches map[string]*pathWatch // path → this instance's unfired watch on it
	expired chan struct{}         // closed (and replaced) when the session expires
	closed  bool
	timers  sync.WaitGroup // lease timers armed or running
	// renewed: the leases RENEWs through this instance set on nodes
	// another instance made (see enforceRenewed), by path.
	renewed map[string]*renewedLease
	// resolving: the paths whose hold change made here lost its answer
	// and is being looked for (see resolve).
	resolving map[string]*resolution

	// Set by tests only, before use: run before a waiter sets its watch on
	// its blocker, before a reentry changes the held node, before a grant
	// rewrites its node to wake a LOCK with the same token, between a
	// reentry's or renewal's write and its written, before a hold of a
	// grant too late to be of use is taken back, before (read false)
	// and after (read true) a first grant reads its node, and once the
	// session is back before a lost answer is looked for (applied).
	testBeforeWatch    func(blocker string)
	testBeforeReenter  func()
	testBeforeWake     func()
	testBeforeWritten  func()
	testBeforeTakeBack func()
	testGrantRead      func(read bool)
	testBeforeApplied  func()
}

// ownedNode is a granted lock node this instance created, whose lease it
// enforces. Fields other than path and key are guarded by Backend.mu.
type ownedNode struct {
	path, key, token string
	czxid            int64
	data             lockData // as last written or read here
	version          int32    // of data
	mtime            int64    // of data, ms: a previous-format lease's start
	// end is when timer fires: the lease's end as this instance enforces
	// it, on its own clock, never before a validity it reported.
	end   time.Time
	timer *time.Timer
	gen   int // bumped on each re-arm, so a stale timer does nothing
	// abandoned: a node of a gave-up waiter whose delete failed (see
	// abandon); no hold, no key or token, only to be deleted.
	abandoned bool
	// changing counts the reentries and renewals this instance has in
	// flight on the node (see Backend.changing).
	changing int
}

// Errors.
var (
	errClosed    = errors.New("zookeeper: backend closed")
	errNodeGone  = errors.New("zookeeper: the waiting lock node vanished")
	errUnhandled = errors.New("zookeeper: a lock node kept changing under a hold change; gave up")
	// errHoldGone: the node a reentry was to add a hold to is gone.
	errHoldGone = errors.New("zookeeper: the held lock node is gone")
	// errTooLarge: see fits.
	errTooLarge = fmt.Errorf("zookeeper: too long for a ZooKeeper request: %w", backends.ErrTooLarge)
)

// maxRequestBytes bounds what a key and a token put in one request. A
// ZooKeeper server closes the connection of a client that sends a packet
// longer than its jute.maxbuffer (1 MiB less one byte by default), which
// fails every request in flight on the instance's one session, other
// clients' included, and suspends every lock until it reconnects. The room
// left covers the packet's headers, the ACL, the node's name and the data's
// header.
const maxRequestBytes = 1<<20 - 1 - 16<<10

// fits reports whether the requests for key, with a token of tokenLen
// bytes, fit in what a server accepts: a write lock's create names the
// key's directory twice (the node and its gate) and carries the token. A
// key that does not fit is never locked, so nothing holds it.
func (b *Backend) fits(key string, tokenLen int) bool {
	dir := len(b.cfg.Root) + len("/k") + base64.RawURLEncoding.EncodedLen(len(key))
	return 2*dir+tokenLen <= maxRequestBytes
}

// unavailable is the error of an operation the ensemble could not decide:
// no session, a lost connection, an expired session. It reads as a
// NOQUORUM to clients, as a RedLock backend without a majority does.
type unavailable struct {
	reason string
	err    error
}

func (e *unavailable) Error() string  { return "zookeeper: " + e.reason + ": " + e.err.Error() }
func (e *unavailable) Reason() string { return e.reason }

// noQuorum wraps why the ensemble could not decide as a NoQuorumError so
// that clients see -NOQUORUM, naming ZooKeeper and the reason.
func noQuorum(reason string, err error) error {
	return &quorum.NoQuorumError{OK: 0, Total: 1, Failures: []quorum.NodeError{
		{Node: "zookeeper", Err: &unavailable{reason: reason, err: err}},
	}}
}

// zkErr turns a go-zookeeper error into one of ours: connection-level
// failures become NOQUORUM, context errors stay as they are.
func zkErr(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, zk.ErrSessionExpired):
		return noQuorum("session expired", err)
	case errors.Is(err, zk.ErrConnectionClosed), errors.Is(err, zk.ErrNoServer), errors.Is(err, zk.ErrClosing),
		errors.Is(err, zk.ErrSessionMoved):
		return noQuorum("connection lost", err)
	case errors.Is(err, zk.ErrNoAuth), errors.Is(err, zk.ErrAuthFailed):
		return noQuorum("not authorized", err)
	case isNetErr(err):
		// go-zookeeper hands the request whose write to the connection
		// failed (timed out on a stalled server, a broken pipe, a reset)
		// the socket's error, and closes the connection.
		return noQuorum("connection lost", err)
	}
	return fmt.Errorf("zookeeper: %s: %w", op, err)
}

// isNetErr reports whether err is a socket's error.
func isNetErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne)
}

// New connects to the ensemble, waits for the first session (up to
// StartTimeout) and makes sure Root and the gates' parent exist.
func New(cfg Config) (*Backend, error) {
	if len(cfg.Servers) == 0 {
		return nil, errors.New("zookeeper: no servers")
	}
	if cfg.Root == "" || cfg.Root[0] != '/' || (len(cfg.Root) > 1 && strings.HasSuffix(cfg.Root, "/")) {
		return nil, fmt.Errorf("zookeeper: root %q must be an absolute znode path", cfg.Root)
	}
	if cfg.Root == "/" {
		cfg.Root = ""
	}
	if cfg.SessionTimeout <= 0 {
		return nil, errors.New("zookeeper: session timeout must be positive")
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	b := &Backend{
		cfg:        cfg,
		log:        cfg.Logger,
		acl:        zk.WorldACL(zk.PermAll),
		hadSession: make(chan struct{}),
		owned:      map[string]*ownedNode{},
		byToken:    map[heldKey]*ownedNode{},
		waiters:    map[string]int{},
		watches:    map[string]*pathWatch{},
		renewed:    map[string]*renewedLease{},
		resolving:  map[string]*resolution{},
		expired:    make(chan struct{}),
	}
	if cfg.Digest != "" {
		user, pass, ok := strings.Cut(cfg.Digest, ":")
		if !ok || user == "" {
			return nil, errors.New("zookeeper: digest must be user:password")
		}
		b.acl = zk.DigestACL(zk.PermAll, user, pass)
	}
	conn, _, err := zk.Connect(cfg.Servers, cfg.SessionTimeout,
		zk.WithLogger(zkLogger{b.log}), zk.WithLogInfo(false), zk.WithEventCallback(b.onEvent),
		zk.WithDialer(handshakeBounded(cfg.SessionTimeout*2/3, b.negotiated)))
	if err != nil {
		return nil, fmt.Errorf("zookeeper: connect: %w", err)
	}
	b.conn = conn
	// After Connect, which fails at once on a host that does not resolve.
	b.serverOf = resolveServers(cfg.Servers)
	if cfg.Registerer != nil {
		b.register(cfg.Registerer)
	}
	wait := cfg.StartTimeout
	if wait <= 0 {
		wait = cfg.SessionTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := b.start(ctx, wait); err != nil {
		conn.Close()
		return nil, err
	}
	return b, nil
}

func (b *Backend) start(ctx context.Context, wait time.Duration) error {
	select {
	case <-b.hadSession:
	case <-ctx.Done():
		return fmt.Errorf("zookeeper: no session with %s within %v", strings.Join(b.cfg.Servers, ","), wait)
	}
	if b.cfg.Digest != "" {
		// go-zookeeper sends the credentials again on every reconnect.
		if _, err := call(ctx, func() (struct{}, error) {
			return struct{}{}, b.conn.AddAuth("digest", []byte(b.cfg.Digest))
		}); err != nil {
			return fmt.Errorf("zookeeper: digest auth: %w", err)
		}
	}
	path := ""
	for _, part := range strings.Split(strings.TrimPrefix(b.cfg.Root, "/"), "/") {
		if part == "" {
			continue
		}
		path += "/" + part
		_, err := call(ctx, func() (string, error) { return b.conn.Create(path, nil, 0, b.acl) })
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return fmt.Errorf("zookeeper: create root %s: %w", path, err)
		}
	}
	gates := gatesDir(b.cfg.Root)
	_, err := call(ctx, func() (string, error) { return b.conn.Create(gates, nil, 0, b.acl) })
	if err != nil && !errors.Is(err, zk.ErrNodeExists) {
		return fmt.Errorf("zookeeper: create %s: %w", gates, err)
	}
	return nil
}

// onEvent follows the session's state. go-zookeeper calls it on its own
// goroutine, which must not block.
func (b *Backend) onEvent(ev zk.Event) {
	if ev.Type != zk.EventSession {
		return
	}
	switch ev.State {
	case zk.StateHasSession:
		b.connected.Store(true)
		b.hadOnce.Do(func() { close(b.hadSession) })
	case zk.StateExpired:
		b.connected.Store(false)
		b.sessionExpired()
	default:
		// Disconnected or connecting: held locks are suspended. Renewals
		// fail (the watchdog retries while the lease lasts); the session,
		// and so every lock, lives on if a server takes it back in time.
		b.connected.Store(false)
	}
}

// negotiated records the session timeout of a session handshake's answer,
// and warns when it is below the one asked for: the validity of every lock
// is then shorter than the configuration says.
func (b *Backend) negotiated(ms int32) {
	if ms <= 0 {
		return // a refused (expired) session's answer
	}
	prev := b.negotiatedMS.Swap(int64(ms))
	got := time.Duration(ms) * time.Millisecond
	if prev != int64(ms) && got < b.cfg.SessionTimeout {
		b.log.Warn("zookeeper: the server negotiated a session timeout below the one asked for (its maxSessionTimeout is lower); validity is capped by it",
			zap.Duration("asked", b.cfg.SessionTimeout), zap.Duration("negotiated", got))
	}
}

// OnLost implements backends.LossNotifier: f hears of every lock lost
// with an expired session, as soon as the session's expiry is known.
func (b *Backend) OnLost(f func(key, token string)) {
	b.mu.Lock()
	b.onLost = f
	b.mu.Unlock()
}

// sessionExpired forgets every lock of the expired session (ZooKeeper has
// deleted their nodes), tells OnLost's function, and wakes every waiter
// with an error.
func (b *Backend) sessionExpired() {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(b.owned)
	if f := b.onLost; f != nil && n > 0 {
		lost := make([][2]string, 0, n)
		for _, o := range b.owned {
			if !o.abandoned {
				lost = append(lost, [2]string{o.key, o.token})
			}
		}
		// Not on go-zookeeper's event goroutine, which must not block.
		go func() {
			for _, l := range lost {
				f(l[0], l[1])
			}
		}()
	}
	for _, o := range b.owned {
		b.forgetLocked(o)
	}
	// go-zookeeper fails the old session's watches: none is to be shared
	// by a waiter of the new one.
	clear(b.watches)
	close(b.expired)
	b.expired = make(chan struct{})
	b.expirations.Add(1)
	b.log.Warn("zookeeper session expired: every lock held through it is lost", zap.Int("locks", n))
}

// usable fails fast when no operation can succeed now.
func (b *Backend) usable() error {
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	switch {
	case closed:
		return errClosed
	case !b.connected.Load():
		return noQuorum("disconnected", errors.New("no session with a server"))
	}
	return nil
}

// Ready reports whether the session is established and the root answers.
func (b *Backend) Ready(ctx context.Context) error {
	if err := b.usable(); err != nil {
		return err
	}
	root := b.cfg.Root
	if root == "" {
		root = "/"
	}
	ok, err := call(ctx, func() (bool, error) { ok, _, err := b.conn.Exists(root); return ok, err })
	switch {
	case err != nil:
		return zkErr("exists", err)
	case !ok:
		return fmt.Errorf("zookeeper: root %s does not exist", root)
	}
	return nil
}

// isClosed tells whether Close was called.
func (b *Backend) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// Close stops enforcing leases and closes the session, which deletes every
// lock node it created: drain clients first.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	for _, o := range b.owned {
		b.disarmLocked(o)
	}
	for _, r := range b.renewed {
		b.stopRenewedLocked(r)
	}
	b.mu.Unlock()
	b.timers.Wait()
	b.conn.Close()
	return nil
}

// handshakeBounded is a go-zookeeper dialer whose connections bound the
// wait for the server's answer to the session handshake by limit (one
// receive timeout: as long as go-zookeeper waits for any other answer).
// go-zookeeper waits ten receive timeouts for it (20 s for a 3 s session,
// 67 s for 10 s): a stopped (SIGSTOPped, hung) server, whose kernel still
// accepts connections, then held the instance disconnected that long per
// attempt, however soon the other servers served again, and cost the
// session besides.
//
// The connections also hand the session timeout of the handshake's answer
// to timeout (go-zookeeper keeps it to itself).
func handshakeBounded(limit time.Duration, timeout func(ms int32)) zk.Dialer {
	return func(network, addr string, dialTimeout time.Duration) (net.Conn, error) {
		c, err := net.DialTimeout(network, addr, dialTimeout)
		if err != nil {
			return nil, err
		}
		return &boundedConn{Conn: c, limit: limit, timeout: timeout}, nil
	}
}

// boundedConn caps the deadlines set on it at limit from when they are set
// until the first byte is read from the server (the handshake's answer);
// after that they are go-zookeeper's. It reads the session timeout from
// the handshake's answer, the first bytes the server sends: a length, the
// protocol version and the timeout in ms, big-endian int32s.
type boundedConn struct {
	net.Conn
	limit   time.Duration
	heard   atomic.Bool
	timeout func(ms int32)
	head    [12]byte // the answer's first bytes; only Read touches it
	got     int      // of head
}

func (c *boundedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.heard.Store(true)
		if c.got < len(c.head) {
			c.got += copy(c.head[c.got:], p[:n])
			if c.got == len(c.head) && c.timeout != nil {
				c.timeout(int32(binary.BigEndian.Uint32(c.head[8:])))
			}
		}
	}
	return n, err
}

func (c *boundedConn) SetReadDeadline(t time.Time) error  { return c.Conn.SetReadDeadline(c.bound(t)) }
func (c *boundedConn) SetWriteDeadline(t time.Time) error { return c.Conn.SetWriteDeadline(c.bound(t)) }

func (c *boundedConn) bound(t time.Time) time.Time {
	if t.IsZero() || c.heard.Load() {
		return t
	}
	if limit := time.Now().Add(c.limit); t.After(limit) {
		return limit
	}
	return t
}

// result is one go-zookeeper call's outcome.
type result[T any] struct {
	v   T
	err error
}

// call runs f, a blocking go-zookeeper call, and returns its result or
// ctx's error, whichever comes first. go-zookeeper's calls take no context;
// each ends once its connection answers or closes (within the session's
// receive timeout), so the goroutine always ends.
func call[T any](ctx context.Context, f func() (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	ch := make(chan result[T], 1)
	go func() {
		v, err := f()
		ch <- result[T]{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

func newNonce() string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("zookeeper: crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}

// zkLogger sends go-zookeeper's log lines to zap at debug level: they are
// about reconnects, which the session events already report.
type zkLogger struct{ log *zap.Logger }

func (l zkLogger) Printf(format string, args ...any) {
	l.log.Debug("go-zookeeper: " + fmt.Sprintf(format, args...))
}

// Waiting is the number of LOCK calls waiting here (INFO's
// blocked_clients).
func (b *Backend) Waiting() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waiting
}

// NodeStates describes each configured server for INFO: the one the
// session is on ("ok", or "disconnected" while suspended) and the others
// ("standby": go-zookeeper moves to one when its server fails).
func (b *Backend) NodeStates() []string {
	cur := b.conn.Server()
	on, resolved := b.serverOf[cur]
	up := b.connected.Load()
	out := make([]string, len(b.cfg.Servers))
	for i, s := range b.cfg.Servers {
		st := "standby"
		if s == cur || resolved && on == i {
			st = "disconnected"
			if up {
				st = "ok"
			}
		}
		out[i] = "addr=" + s + ",state=" + st
	}
	return out
}

// resolveServers maps the addresses of servers, as go-zookeeper's default
// host provider resolves them (each host's addresses, with its port), to
// the server's index; a host that does not resolve has none.
func resolveServers(servers []string) map[string]int {
	// Bounded as go-zookeeper bounds its own look-ups.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	out := map[string]int{}
	for i, s := range zk.FormatServers(servers) {
		host, port, err := net.SplitHostPort(s)
		if err != nil {
			continue
		}
		addrs, err := net.DefaultResolver.LookupHost(ctx, host)
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if _, dup := out[net.JoinHostPort(a, port)]; !dup {
				out[net.JoinHostPort(a, port)] = i
			}
		}
	}
	return out
}

// Wakeups is the number of watches that have fired for waiting Lock calls
// through this backend: one per release that a waiter here was queued
// behind, never one per waiter per release.
func (b *Backend) Wakeups() int64 { return b.wakeups.Load() }

var (
	_ backends.Backend    = (*Backend)(nil)
	_ backends.HoldKeeper = (*Backend)(nil)
)
