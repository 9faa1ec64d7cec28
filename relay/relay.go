package relay

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/conf"
)

// Config configures the relay.
type Config struct {
	Addr     string // host:port of the upstream Redis
	Username string // ACL user; "" with a Password means AUTH password
	Password string
	// PoolSize is the number of shared connections per protocol, and the
	// most idle connections kept for pinning.
	PoolSize    int
	DialTimeout time.Duration
	// ReadTimeout bounds the wait for a reply (blocking commands aside);
	// the connection is dropped when it passes. 0: no bound.
	ReadTimeout time.Duration
	// Deny lists commands ("flushall") and subcommands ("client|kill")
	// refused with an error instead of relayed.
	Deny []string
	// KeyPrefix is the lock key prefix: relayed commands may not touch keys
	// that start with it. "" disables the check.
	KeyPrefix string
	Logger    *zap.Logger
	// TLS, when set, is the TLS client configuration for the upstream;
	// its ServerName defaults to Addr's host.
	TLS *tls.Config
}

// Relay relays commands to one upstream Redis.
type Relay struct {
	cfg     Config
	log     *zap.Logger
	shared  [2]*pool // RESP2, RESP3
	specs   atomic.Pointer[specTable]
	deny    map[string]bool            // commands
	denySub map[string]map[string]bool // command → subcommands
	prefix  []byte

	mu     sync.Mutex
	idle   [2][]*upConn // clean connections kept for pinning
	closed bool
	pinned map[*upConn]struct{}
	// pipes are the clients' pipes by client id (NewPipe, Done), for the
	// commands that name another client by its id (Named).
	pipes map[int64]*Pipe

	// dials and dialFailures count connection attempts to the upstream
	// and those that failed (TCP, TLS or the handshake), for metrics.
	dials, dialFailures atomic.Int64
	// specsStale: a connection failed (the upstream may have come back
	// as another version, or with other modules), so the next dial reads
	// the upstream's COMMAND table again (upConn.fail).
	specsStale atomic.Bool
	// down is the upstream found unreachable by a failed dial (nil once a
	// dial succeeds): until it passes, a command whose slot has no live
	// connection fails at once with its error instead of dialing again.
	// It spans the slots and protocols, so that one command costs at most
	// one dial: needSpecs dials slot 0, then Collect would dial the
	// client's own slot, each for up to dial_timeout.
	down atomic.Pointer[downState]
}

// downState is an unreachable upstream: the dial's error, and when the
// next dial may be tried.
type downState struct {
	err   error
	until time.Time
}

// unreachable is the last dial's error while the upstream counts as
// unreachable at now, else nil.
func (r *Relay) unreachable(now time.Time) error {
	if d := r.down.Load(); d != nil && now.Before(d.until) {
		return d.err
	}
	return nil
}

// dialFailed records a failed dial until retryAt, unless the upstream
// answered and refused (AUTH, HELLO 3): the upstream is reachable then,
// and other connections (another protocol) may well work. Nor does a
// dial that its client gave up on say anything of the upstream.
func (r *Relay) dialFailed(err error, retryAt time.Time) {
	var refused *refusedError
	if !errors.As(err, &refused) && !errors.Is(err, context.Canceled) {
		r.down.Store(&downState{err: err, until: retryAt})
	}
}

// refusedError is an error reply to a connection's handshake (AUTH,
// HELLO, SELECT, COMMAND).
type refusedError struct {
	addr, cmd, msg string
}

func (e *refusedError) Error() string { return fmt.Sprintf("%s %s: %s", e.addr, e.cmd, e.msg) }

// DialStats tells how many connections to the upstream were attempted and
// how many of those failed, since the start.
func (r *Relay) DialStats() (attempts, failures int64) {
	return r.dials.Load(), r.dialFailures.Load()
}

// New returns a Relay; it dials lazily, on the first command.
func New(cfg Config) *Relay {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.PoolSize <= 0 {
		cfg.PoolSize = 4
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = time.Second
	}
	r := &Relay{cfg: cfg, log: cfg.Logger, deny: map[string]bool{}, denySub: map[string]map[string]bool{},
		pinned: map[*upConn]struct{}{}, pipes: map[int64]*Pipe{}, prefix: []byte(cfg.KeyPrefix)}
	for _, d := range cfg.Deny {
		if name, sub, ok := strings.Cut(lower(d), "|"); ok {
			if r.denySub[name] == nil {
				r.denySub[name] = map[string]bool{}
			}
			r.denySub[name][sub] = true
		} else {
			r.deny[name] = true
		}
	}
	for i := range r.shared {
		r.shared[i] = &pool{r: r, proto: i + 2, slots: make([]slot, cfg.PoolSize)}
	}
	return r
}

// Addr is the upstream's address.
func (r *Relay) Addr() string { return r.cfg.Addr }

// Close drops every upstream connection; calls still waiting get an error.
func (r *Relay) Close() {
	r.mu.Lock()
	r.closed = true
	var all []*upConn
	for i := range r.idle {
		all = append(all, r.idle[i]...)
		r.idle[i] = nil
	}
	for c := range r.pinned {
		all = append(all, c)
	}
	r.mu.Unlock()
	for _, p := range r.shared {
		all = append(all, p.drain()...)
	}
	for _, c := range all {
		c.close()
	}
}

func (r *Relay) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// Backoff bounds between reconnection attempts to a failed upstream; while
// one runs, commands fail at once with the last dial error.
const (
	minBackoff = 50 * time.Millisecond
	maxBackoff = 2 * time.Second
)

type pool struct {
	r     *Relay
	proto int
	slots []slot
}

type slot struct {
	mu       sync.Mutex
	c        *upConn
	lastErr  error
	backoff  time.Duration
	retryAt  time.Time
	dialling bool
}

func (p *pool) drain() []*upConn {
	var out []*upConn
	for i := range p.slots {
		s := &p.slots[i]
		s.mu.Lock()
		if s.c != nil {
			out = append(out, s.c)
			s.c = nil
		}
		s.mu.Unlock()
	}
	return out
}

// live returns slot i's connection when it is up, without dialing.
func (p *pool) live(i int) *upConn {
	s := &p.slots[i%len(p.slots)]
	if !s.mu.TryLock() {
		// A dial holds the slot (get): the caller, the event loop, must
		// not wait for it; CollectAsync's goroutine does.
		return nil
	}
	defer s.mu.Unlock()
	if s.c != nil && s.c.failed() == nil {
		return s.c
	}
	return nil
}

// get returns slot i's connection, dialing it when there is none or it
// failed, unless a backoff after a failed dial is running.
func (p *pool) get(ctx context.Context, i int) (*upConn, error) {
	s := &p.slots[i%len(p.slots)]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.c != nil && s.c.failed() == nil {
		return s.c, nil
	}
	if p.r.isClosed() {
		return nil, errClosed
	}
	now := time.Now()
	if s.lastErr != nil && now.Before(s.retryAt) {
		return nil, s.lastErr
	}
	if err := p.r.unreachable(now); err != nil {
		// Another slot's dial just failed: this one would too, after
		// as long.
		return nil, err
	}
	// The slot is shared: a client that goes away while its connection is
	// dialed must not fail the dial, and with it every other client of
	// the slot for the backoff. The dial has its own timeout.
	c, err := p.r.dial(context.WithoutCancel(ctx), p.proto, 0, nil, nil, false)
	if err != nil {
		s.backoff = min(max(2*s.backoff, minBackoff), maxBackoff)
		// From when the dial failed, not when it began: a dial that ran
		// out its dial_timeout would otherwise leave no backoff at all,
		// and the next command would wait as long again.
		s.retryAt = time.Now().Add(s.backoff)
		s.lastErr = err
		p.r.dialFailed(err, s.retryAt)
		return nil, err
	}
	s.c, s.lastErr, s.backoff = c, nil, 0
	p.r.down.Store(nil)
	return c, nil
}

// dial opens an upstream connection in protocol proto, authenticated and
// with database db selected, and starts its reader. askID asks the
// upstream for the connection's id (upConn.id): only connections dialed
// for pinning need one, as only they are ever named by another client.
func (r *Relay) dial(ctx context.Context, proto, db int, push func([]byte), lost func(), askID bool) (*upConn, error) {
	r.dials.Add(1)
	c, err := r.dialOnce(ctx, proto, db, push, lost, askID)
	if err != nil {
		r.dialFailures.Add(1)
	}
	return c, err
}

func (r *Relay) dialOnce(ctx context.Context, proto, db int, push func([]byte), lost func(), askID bool) (*upConn, error) {
	reloaded := false
	dialStart := time.Now()
	// TCP and TLS together within dial_timeout: a TLS handshake given a
	// dial_timeout of its own after a slow connect would double it.
	dialDeadline := dialStart.Add(r.cfg.DialTimeout)
	d := net.Dialer{Deadline: dialDeadline}
	nc, err := d.DialContext(ctx, "tcp", r.cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", r.cfg.Addr, err)
	}
	connectTime := time.Since(dialStart) // about one round trip
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	if r.cfg.TLS != nil {
		if nc, err = tlsClient(ctx, nc, r.cfg.TLS, r.cfg.Addr, dialDeadline); err != nil {
			return nil, fmt.Errorf("tls with %s: %w", r.cfg.Addr, err)
		}
	}
	c := newUpConn(nc, proto, db, r.cfg.ReadTimeout)
	c.reserved = r.prefix
	c.seedRTT(connectTime)
	c.stale = &r.specsStale
	c.setHooks(push, lost)
	var hs [][][]byte
	switch {
	case proto == 3 && r.cfg.Password != "":
		user := r.cfg.Username
		if user == "" {
			user = "default"
		}
		hs = append(hs, [][]byte{[]byte("HELLO"), []byte("3"), []byte("AUTH"), []byte(user), []byte(r.cfg.Password)})
	case proto == 3:
		hs = append(hs, [][]byte{[]byte("HELLO"), []byte("3")})
	case r.cfg.Password != "" || r.cfg.Username != "":
		hs = append(hs, r.auth())
	}
	if db != 0 {
		hs = append(hs, [][]byte{[]byte("SELECT"), []byte(strconv.Itoa(db))})
	}
	// One dial reads the table again after a failure, not every dial
	// meanwhile (a COMMAND reply is about 90 KB); a dial that does not get
	// it hands the mark back.
	loadSpecs := r.specs.Load() == nil || r.specsStale.CompareAndSwap(true, false)
	reloading := loadSpecs && r.specs.Load() != nil
	defer func() {
		if reloading && !reloaded {
			r.specsStale.Store(true)
		}
	}()
	if loadSpecs {
		hs = append(hs, [][]byte{[]byte("COMMAND")})
	}
	idAt := -1
	if askID {
		// In the same write as the rest of the handshake; an upstream
		// that refuses it (an ACL, a Redis before 5) leaves the id
		// unknown, and the commands that name the connection are
		// refused (ErrNoUpstreamID) rather than the dial failed.
		idAt = len(hs)
		hs = append(hs, [][]byte{[]byte("CLIENT"), []byte("ID")})
	}
	if len(hs) > 0 {
		var req []byte
		for _, a := range hs {
			req = appendCommand(req, a)
		}
		deadline := time.Now().Add(max(r.cfg.DialTimeout, 5*time.Second))
		_ = nc.SetDeadline(deadline)
		if _, err := nc.Write(req); err != nil {
			nc.Close()
			return nil, fmt.Errorf("handshake with %s: %w", r.cfg.Addr, err)
		}
		for i := range hs {
			f, err := c.next()
			if err != nil {
				nc.Close()
				return nil, fmt.Errorf("handshake with %s: %w", r.cfg.Addr, err)
			}
			if i == idAt {
				c.id, _ = integer(f)
				continue
			}
			if f[0] == '-' {
				nc.Close()
				msg, _ := str(f)
				return nil, &refusedError{addr: r.cfg.Addr, cmd: lower(string(hs[i][0])), msg: string(msg)}
			}
			if loadSpecs && string(hs[i][0]) == "COMMAND" {
				if ks := parseSpecs(f); ks != nil {
					r.setSpecs(ks)
					reloaded = true
				}
			}
		}
		_ = nc.SetDeadline(time.Time{})
	}
	go c.readLoop()
	return c, nil
}

// auth is the RESP2 AUTH of the configured credentials, nil without any.
func (r *Relay) auth() [][]byte {
	switch {
	case r.cfg.Username != "":
		return [][]byte{[]byte("AUTH"), []byte(r.cfg.Username), []byte(r.cfg.Password)}
	case r.cfg.Password != "":
		return [][]byte{[]byte("AUTH"), []byte(r.cfg.Password)}
	}
	return nil
}

// setHooks sets what a pinned connection does with out-of-band frames and
// when it fails; nil, nil for an idle one.
func (c *upConn) setHooks(push func([]byte), lost func()) {
	if push == nil {
		c.push.Store(nil)
	} else {
		c.push.Store(&push)
	}
	if lost == nil {
		c.lost.Store(nil)
	} else {
		c.lost.Store(&lost)
	}
}

// takePinned returns a connection of the client's own: an idle clean one,
// or a new one.
func (r *Relay) takePinned(ctx context.Context, proto, db int, push func([]byte), lost func()) (*upConn, error) {
	if err := ctx.Err(); err != nil {
		// The client is gone, or its pinned connection was lost (the
		// lost hook closes it): an idle connection, clean, would carry
		// the rest of its commands without the state they were sent in.
		return nil, fmt.Errorf("relay: client closing: %w", err)
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, errClosed
	}
	if db == 0 {
		l := r.idle[proto-2]
		for len(l) > 0 {
			c := l[len(l)-1]
			l = l[:len(l)-1]
			if c.failed() == nil {
				r.idle[proto-2] = l
				c.setHooks(push, lost)
				r.pinned[c] = struct{}{}
				r.mu.Unlock()
				return c, nil
			}
		}
		r.idle[proto-2] = l
	}
	r.mu.Unlock()
	if err := r.unreachable(time.Now()); err != nil {
		return nil, err
	}
	c, err := r.dial(ctx, proto, db, push, lost, true)
	if err != nil {
		r.dialFailed(err, time.Now().Add(minBackoff))
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		c.close()
		return nil, errClosed
	}
	r.pinned[c] = struct{}{}
	return c, nil
}

// release takes back a pinned connection: kept for the next client when its
// state is clean, else closed.
func (r *Relay) release(c *upConn, clean bool) {
	r.mu.Lock()
	delete(r.pinned, c)
	// A connection another client named by its id (Named) never goes to
	// another client: what the naming command left on it (a tracking
	// redirection's invalidations) or may still do to it (an UNBLOCK on
	// its way) was meant for this client.
	keep := clean && !r.closed && c.db == 0 && !c.tunneled.Load() && c.failed() == nil && !c.named.Load() &&
		len(r.idle[c.proto-2]) < r.cfg.PoolSize
	if keep {
		c.setHooks(nil, nil)
		r.idle[c.proto-2] = append(r.idle[c.proto-2], c)
	}
	r.mu.Unlock()
	if !keep {
		c.close()
	}
}

// Pipe is one client connection's way to the upstream: requests added
// during a batch go out together on Collect, on the client's shared
// connection or on its pinned one. A Pipe belongs to one goroutine.
type Pipe struct {
	r     *Relay
	id    int
	push  func([]byte)
	lost  func()
	out   []byte
	n     int
	cl    *call
	pin   *upConn
	proto int // of the pinned connection
	gone  bool
	// pins counts the connections the client was given (Pin): PinID
	// tells one from the next, the same upConn handed out again included.
	pins uint64
	// client is the client's id, its key in Relay.pipes. shown is its
	// pinned connection and blocked tells that a blocking command waits
	// on it (Collect, untimed): both as other clients see them through
	// Named, under r.mu, set apart from pin, which only the client's
	// goroutine reads.
	client  int64
	shown   *upConn
	blocked bool
}

// NewPipe returns a Pipe for a client; id spreads clients over the shared
// connections; push writes out-of-band frames (pub/sub messages, RESP3
// pushes) to the client; lost runs, on another goroutine, when a pinned
// connection fails and the client's state on it with it. Other clients'
// commands can name the client by id (Named) until Done.
func (r *Relay) NewPipe(id int64, push func([]byte), lost func()) *Pipe {
	p := &Pipe{r: r, id: int(id % int64(r.cfg.PoolSize)), push: push, lost: lost, cl: newCall(), client: id}
	r.mu.Lock()
	r.pipes[id] = p
	r.mu.Unlock()
	return p
}

// Done is Close for a client that is gone: no other client can name it
// any more (Named).
func (p *Pipe) Done() {
	p.Close()
	p.r.mu.Lock()
	if p.r.pipes[p.client] == p {
		delete(p.r.pipes, p.client)
	}
	p.r.mu.Unlock()
}

// What a client named by its id must have for Named to name its upstream
// connection.
const (
	// NameBlocked: a blocking command waiting on its pinned connection
	// (CLIENT UNBLOCK).
	NameBlocked = iota
	// NameRedirect: a pinned connection, which it keeps from now on, as
	// the target of another client's tracking redirection (CLIENT
	// TRACKING … REDIRECT): on Redis the redirection lasts as long as the
	// target client, so through lockproxy its connection does.
	NameRedirect
	// NameExists: a pinned connection, not marked (CLIENT TRACKING off …
	// REDIRECT, which only checks that the client exists and sets no
	// redirection).
	NameExists
)

// Errors of Named.
var (
	// ErrNoSuchConn: no client has that id, or it has no pinned upstream
	// connection (for NameBlocked: no blocking command waiting on one).
	ErrNoSuchConn = errors.New("relay: no client with that id has an upstream connection of its own")
	// ErrNoUpstreamID: the upstream refused CLIENT ID when the client's
	// connection was dialed, so its id there is not known.
	ErrNoUpstreamID = errors.New("relay: the upstream did not tell that connection's id (CLIENT ID refused)")
)

// Named returns the upstream's id of the connection the client of id
// client (lockproxy's id, CLIENT ID's) has pinned, for a command that
// names that client by id, with what (NameBlocked, NameRedirect). A
// client's id means nothing upstream, and an upstream connection's id
// may be that of a connection pinned to another client, or shared.
// The connection is marked as named: it never goes back to the idle
// list for another client to take (release), so the naming command
// reaches this client's connection or one that is closed, whenever it
// arrives.
func (r *Relay) Named(client int64, what int) (int64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.pipes[client]
	if p == nil || p.shown == nil || what == NameBlocked && !p.blocked {
		return 0, ErrNoSuchConn
	}
	c := p.shown
	if c.id == 0 {
		return 0, ErrNoUpstreamID
	}
	if what == NameExists {
		return c.id, nil
	}
	c.named.Store(true)
	if what == NameRedirect {
		c.redirs.Add(1)
	}
	return c.id, nil
}

// Unredirect takes back a Named(client, NameRedirect) that answered up:
// the command it was for (CLIENT TRACKING on … REDIRECT) was refused
// upstream, after the mark was set (Redis checks the other options after
// the id), so it set no redirection and the client need not keep that
// connection for it. When the client's pinned connection is no longer
// the one of id up, nothing is done: the one named is gone (closed, as
// named connections are), and its mark with it.
// The connection stays named: the id was handed out, and a connection
// that was named is closed rather than pooled for another client
// (release).
// A client that checked RedirectTarget between the two keeps the
// connection until its next check (maybeUnpin, after its next state
// change).
func (r *Relay) Unredirect(client, up int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.pipes[client]
	if p == nil || p.shown == nil || p.shown.id != up || up == 0 {
		return
	}
	// Named and Unredirect change the count under r.mu only (the
	// client's goroutine just reads it): no check-then-add race.
	if p.shown.redirs.Load() > 0 {
		p.shown.redirs.Add(-1)
	}
}

// RedirectTarget tells whether the pinned connection is the target of a
// tracking redirection (Named): the client keeps it until it leaves, its
// RESET included (Reset).
func (p *Pipe) RedirectTarget() bool { return p.pin != nil && p.pin.redirs.Load() > 0 }

// show publishes the pinned connection to Named.
func (p *Pipe) show(c *upConn, blocked bool) {
	p.r.mu.Lock()
	p.shown, p.blocked = c, blocked
	p.r.mu.Unlock()
}

// Add queues one command for the next Collect.
func (p *Pipe) Add(args [][]byte) {
	p.out = appendCommand(p.out, args)
	p.n++
}

// Discard drops the commands added since the last Collect, unsent.
func (p *Pipe) Discard() { p.out, p.n = p.out[:0], 0 }

// Pending is the number of commands added since the last Collect.
func (p *Pipe) Pending() int { return p.n }

// Pinned tells whether the client has a connection of its own.
func (p *Pipe) Pinned() bool { return p.pin != nil }

// Collect sends the queued commands and returns their replies, one frame
// each, in order; a command that could not be relayed gets an
// "-ERR upstream unavailable" reply in its place. The bytes are valid until
// the next call. timed is false for blocking commands: no read timeout.
// When ctx ends first, the replies are abandoned (a pinned connection is
// closed, since its state is unknown) and ctx's error is returned.
func (p *Pipe) Collect(ctx context.Context, proto int, timed bool) ([]byte, error) {
	n := p.n
	if n == 0 {
		return nil, nil
	}
	if err := ctx.Err(); err != nil {
		// Nothing is sent for a client that is gone, or whose pinned
		// connection was lost (the lost hook closes it): the commands
		// were meant for the state that went with it.
		p.Discard()
		return nil, err
	}
	req := p.out
	p.out, p.n = p.out[:0], 0
	cl := p.cl
	cl.buf, cl.n, cl.deliver = cl.reuse(), n, nil
	c := p.pin
	var err error
	if c == nil {
		c, err = p.r.shared[proto-2].get(ctx, p.id)
	} else if !timed {
		// A blocking command: the client counts as blocked on its
		// connection (Named) until the reply, or Unpin.
		p.show(c, true)
		defer func() {
			if p.pin == c {
				p.show(c, false)
			}
		}()
	}
	if err == nil {
		err = c.send(req, cl, timed)
	}
	if err != nil {
		for ; cl.n > 0; cl.n-- {
			cl.buf = appendError(cl.buf, unavailable(err))
		}
		p.checkPin()
		return cl.buf, nil
	}
	select {
	case <-cl.done:
		p.checkPin()
		return cl.buf, nil
	case <-ctx.Done():
		p.cl = newCall() // the reader may still fill the old one
		if p.pin != nil {
			p.Unpin(false)
		}
		return nil, ctx.Err()
	}
}

// CollectAsync sends the queued commands like Collect but does not wait for
// their replies: deliver gets them all at once, in order, on the upstream
// connection's reader goroutine (or on this one when they cannot be sent),
// so it must not block. The client goroutine is then free to read its
// next requests, and no goroutine hand-off is needed per reply. Only for
// commands on a shared connection (it reports false, sending nothing, when
// the client is pinned), and only one at a time: the caller waits until
// deliver ran before it calls Collect or CollectAsync again.
//
// later, when not nil, is the event loop's (resp.Session.Later): the
// commands are queued without waiting for the upstream's socket, written
// once the loop has served every ready client, and a connection that must
// be dialed first is dialed on a goroutine of its own.
func (p *Pipe) CollectAsync(ctx context.Context, proto int, deliver func([]byte), later func(func())) bool {
	if p.pin != nil {
		return false
	}
	n := p.n
	if n == 0 {
		return true
	}
	req := p.out
	p.out, p.n = p.out[:0], 0
	cl := p.cl
	cl.buf, cl.n, cl.deliver = cl.reuse(), n, deliver
	pool := p.r.shared[proto-2]
	var err error
	if later != nil {
		// The loop writes once per round per upstream connection: its
		// clients share one, so that the round's requests go in one write.
		// A client that moves to a goroutine later goes on in its own
		// slot once these replies are in, so its commands stay in order.
		const loopSlot = 0
		c := pool.live(loopSlot)
		if c == nil {
			// The request is p.out's memory, reused by the next batch,
			// which waits for deliver.
			go func() {
				c, err := pool.get(ctx, loopSlot)
				if err == nil {
					err = c.send(req, cl, true)
				}
				if err != nil {
					failCall(cl, err)
				}
			}()
			return true
		}
		err = c.queue(req, cl, later)
	} else {
		var c *upConn
		c, err = pool.get(ctx, p.id)
		if err == nil {
			err = c.send(req, cl, true)
		}
	}
	if err != nil {
		failCall(cl, err)
	}
	return true
}

// maxKeptReplies is the most reply memory a client keeps between batches:
// one large reply (a 512 MB value) must not stay allocated for the life of
// the connection.
const maxKeptReplies = 1 << 20

// reuse returns cl's reply buffer emptied for the next batch (the last
// batch's replies are no longer in use), or none when it grew past
// maxKeptReplies.
func (cl *call) reuse() []byte {
	if cap(cl.buf) > maxKeptReplies {
		return nil
	}
	return cl.buf[:0]
}

// failCall answers every command of cl, which was not queued (no reader
// will), with the upstream's failure.
func failCall(cl *call, err error) {
	for ; cl.n > 0; cl.n-- {
		cl.buf = appendError(cl.buf, unavailable(err))
	}
	cl.deliver(cl.buf)
}

// checkPin lets go of a pinned connection that failed: its state (a
// transaction, subscriptions) is gone with it.
func (p *Pipe) checkPin() {
	if p.pin != nil && p.pin.failed() != nil {
		p.Unpin(false)
		p.gone = true
	}
}

// Lost reports, once, that the pinned connection failed since the last
// call, and with it the state the client had upstream.
func (p *Pipe) Lost() bool {
	l := p.gone
	p.gone = false
	return l
}

// Pin gives the client a connection of its own in protocol proto with
// database db selected. Collect first: queued commands go to the
// connection they were meant for.
func (p *Pipe) Pin(ctx context.Context, proto, db int) error {
	if p.pin != nil {
		return nil
	}
	c, err := p.r.takePinned(ctx, proto, db, p.push, p.lost)
	if err != nil {
		return err
	}
	p.pin, p.proto = c, proto
	p.pins++
	p.show(c, false)
	return nil
}

// PinID names the client's current pinned connection, 0 when it has
// none: it changes whenever the client is given one, so that a write made
// on one pinned connection is not taken for one made on the next.
func (p *Pipe) PinID() uint64 {
	if p.pin == nil {
		return 0
	}
	return p.pins
}

// Unpin gives the pinned connection back; clean says its state is as new
// (no transaction, watch, subscription or database other than 0). A clean
// Unpin keeps a connection that is a tracking redirection's target
// (Named, RedirectTarget): the caller's RedirectTarget check and this are
// not one step, and another client's REDIRECT may have named it between.
func (p *Pipe) Unpin(clean bool) {
	if p.pin == nil {
		return
	}
	c := p.pin
	// Hidden before it is released, under the lock Named takes: Named
	// then finds either this client holding it, and marks it so that
	// release closes it (or, for a redirection, so that it is kept
	// here), or nothing.
	p.r.mu.Lock()
	if clean && c.redirs.Load() > 0 {
		p.r.mu.Unlock()
		return
	}
	p.shown, p.blocked = nil, false
	p.r.mu.Unlock()
	p.pin = nil
	p.r.release(c, clean)
}

// PinnedProto is the protocol of the pinned connection, 0 when there is
// none.
func (p *Pipe) PinnedProto() int {
	if p.pin == nil {
		return 0
	}
	return p.pin.proto
}

// SetPinnedProto records a HELLO that switched the pinned connection to
// proto.
func (p *Pipe) SetPinnedProto(proto int) {
	if p.pin != nil {
		p.pin.proto, p.proto = proto, proto
	}
}

// SetPinnedDB records a SELECT that succeeded on the pinned connection.
func (p *Pipe) SetPinnedDB(db int) {
	if p.pin != nil {
		p.pin.db = db
	}
}

// Tunnel sends one command on the pinned connection in tunnel mode: every
// frame the connection receives from now on goes to the client's push
// function, in order, until EndTunnel finds the mode over.
func (p *Pipe) Tunnel(args [][]byte) error {
	if p.pin == nil {
		return errors.New("relay: tunnel needs a pinned connection")
	}
	if len(args) > 0 && strings.EqualFold(string(args[0]), "monitor") {
		p.pin.monitor.Store(true)
		p.pin.monitorAsked.Store(true)
	}
	p.pin.tunnel.Store(true)
	p.pin.tunneled.Store(true)
	return p.pin.send(appendCommand(nil, args), nil, false)
}

// Tunneling tells whether the pinned connection is in tunnel mode.
func (p *Pipe) Tunneling() bool { return p.pin != nil && p.pin.tunnel.Load() }

// EndTunnel asks, after an UNSUBSCRIBE, whether any subscription is left:
// a PING carrying a random marker follows the commands sent, and its reply
// comes after theirs. It reports whether the connection left tunnel mode
// (never under MONITOR, where the marker only tells that the replies
// before it came).
func (p *Pipe) EndTunnel(ctx context.Context) (bool, error) {
	c := p.pin
	if c == nil || !c.tunnel.Load() {
		return true, nil
	}
	marker := newMarker()
	c.mu.Lock()
	c.marker = marker
	if c.monitor.Load() {
		if len(c.fedMarkers) == maxFedMarkers {
			c.fedMarkers = c.fedMarkers[1:]
		}
		c.fedMarkers = append(c.fedMarkers, marker)
	}
	c.mu.Unlock()
	select {
	case <-c.markerDone: // a stale answer from a connection that failed
	default:
	}
	if err := c.send(appendCommand(nil, [][]byte{[]byte("PING"), marker}), nil, false); err != nil {
		return false, err
	}
	t := time.NewTimer(max(p.r.cfg.ReadTimeout, 5*time.Second))
	defer t.Stop()
	select {
	case ended := <-c.markerDone:
		if err := c.failed(); err != nil {
			return false, err
		}
		return ended, nil
	case <-t.C:
		p.Unpin(false)
		return false, errors.New("relay: no answer to the marker PING")
	case <-ctx.Done():
		p.Unpin(false)
		return false, ctx.Err()
	}
}

// maxFedMarkers bounds upConn.fedMarkers: the feed line of a marker
// PING comes next to its reply, so only the last few can still be due.
const maxFedMarkers = 16

// newMarker is the random argument of a marker PING, which no other
// frame carries.
func newMarker() []byte {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return []byte("lockproxy-marker-" + hex.EncodeToString(b[:]))
}

// Close gives up the client's pinned connection, closing it.
func (p *Pipe) Close() { p.Unpin(false) }

// Reset is Close for a client's RESET, except for a connection a tracking
// redirection names (RedirectTarget): on Redis RESET keeps the client's
// id, and the redirections to it with it, so the connection is kept and
// its state reset upstream instead. RESET there also ends its
// subscriptions, MONITOR, transaction, watches, database, its own
// tracking, and switches it to RESP2 signed out, as the client is after
// RESET: it is signed in again with the configured credentials. A marker
// PING after those tells when they are done; frames before RESET's reply
// (messages published before it) still go to the client, as on Redis.
// Anything else (no answer, the sign-in refused, ctx ending) closes the
// connection, as Close does.
// Call it with no reply outstanding on the connection (the commands
// before RESET collected, a tunnel synced): every frame now goes through
// tunnelFrame.
func (p *Pipe) Reset(ctx context.Context) {
	c := p.pin
	if c == nil {
		return
	}
	if c.redirs.Load() == 0 || !p.resetKept(ctx, c) {
		p.Unpin(false)
	}
}

// resetKept runs RESET upstream on c, kept (Reset), and reports whether
// it is done, the connection as new in RESP2.
func (p *Pipe) resetKept(ctx context.Context, c *upConn) bool {
	marker := newMarker()
	req := appendCommand(nil, [][]byte{[]byte("RESET")})
	left := 1 // the marker PING's reply
	if a := p.r.auth(); a != nil {
		req = appendCommand(req, a)
		left++
	}
	req = appendCommand(req, [][]byte{[]byte("PING"), marker})
	c.mu.Lock()
	c.marker, c.resetting, c.resetLeft = marker, resetSent, left
	c.mu.Unlock()
	select {
	case <-c.markerDone: // a stale answer
	default:
	}
	c.tunnel.Store(true)
	c.tunneled.Store(true)
	if err := c.send(req, nil, false); err != nil {
		return false
	}
	t := time.NewTimer(max(p.r.cfg.ReadTimeout, 5*time.Second))
	defer t.Stop()
	select {
	case done := <-c.markerDone:
		if !done || c.failed() != nil {
			return false
		}
	case <-t.C:
		return false
	case <-ctx.Done():
		return false
	}
	c.proto, c.db, p.proto = 2, 0, 2
	return true
}

func lower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 32
		}
	}
	return string(b)
}

// tlsClient runs the TLS handshake on nc, as a client of addr, by
// deadline; nc is closed when it fails.
func tlsClient(ctx context.Context, nc net.Conn, base *tls.Config, addr string, deadline time.Time) (net.Conn, error) {
	// ServerName, unless set, is addr's host, for the verifier of a
	// reloadable CA file too (conf.WithServerName).
	host, _, _ := net.SplitHostPort(addr)
	tc := tls.Client(nc, conf.WithServerName(base, host))
	hctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	// An upstream that never answers the hello (a plain-text port) reads
	// "tls handshake: no reply (is TLS enabled on this port?)" in the
	// "upstream unavailable" reply, not a bare deadline.
	if err := conf.Handshake(hctx, tc); err != nil {
		_ = nc.Close()
		return nil, err
	}
	return tc, nil
}
