package commands

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"path"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/relay"
	"github.com/lockproxy/lockproxy/resp"
)

// Limits bound what one command may ask for.
type Limits struct {
	DefaultTTL    time.Duration
	MinTTL        time.Duration
	MaxTTL        time.Duration
	MaxWait       time.Duration
	MaxKeyBytes   int
	MaxTokenBytes int
	// KeepaliveIdle is how long a connection may send no command before
	// the watchdog stops renewing its KEEPALIVE locks (locks.keepalive_idle);
	// 0 means DefaultKeepaliveIdle.
	KeepaliveIdle time.Duration
	// MaxKeepalive bounds the KEEPALIVE locks of the whole instance
	// (locks.max_keepalive); 0 means DefaultMaxKeepalive.
	MaxKeepalive int
	// LockDelays (locks.lock_delay): the first whose pattern matches a key
	// keeps a KEEPALIVE lock on it held for Delay after its holder lost it
	// without releasing it.
	LockDelays []LockDelay
}

// LockDelay is one lock-delay rule.
type LockDelay struct {
	Pattern string // path.Match glob
	Delay   time.Duration
}

// lockDelay is the delay for key, 0 when no rule matches.
func (l *Limits) lockDelay(key string) time.Duration {
	for _, d := range l.LockDelays {
		if ok, _ := path.Match(d.Pattern, key); ok {
			return d.Delay
		}
	}
	return 0
}

// Info is what INFO reports about the process and its configuration.
type Info struct {
	Version    string // lockproxy's version
	Commit     string
	Backend    string // "redlock"
	Nodes      []string
	Port       int
	ConfigFile string
	Dev        bool
}

// Options configure a Handler.
type Options struct {
	Backend  backends.Backend
	Limits   Limits
	Info     Info
	Logger   *zap.Logger
	Registry prometheus.Registerer
	// Clients, when set, returns the open sessions (for INFO, CLIENT LIST).
	Clients func() []*resp.Session
	// LoopStats, when set, tells the connections on the event loop, and
	// how many times one was handed off it and came back (INFO).
	LoopStats func() (clients, handoffs, returns int64)
	// DriftFor, when set, tells the drift a lease of ttl is allowed (INFO).
	DriftFor func(ttl time.Duration) time.Duration
	// LockPatterns are the key globs served in transparent mode.
	LockPatterns []string
	// Password, when set, must be given with AUTH (or HELLO … AUTH)
	// before any other command (auth.password).
	Password string
	// Users are named users' passwords by name (auth.users); with any,
	// authentication is required too.
	Users map[string]string
	// Relay, when set, serves the commands lockproxy does not know by
	// relaying them to the upstream Redis (relay.go).
	Relay *relay.Relay
	// Permissions limit users by name ("default" for auth.password's);
	// a user without one may do everything.
	Permissions map[string]Permission
	// NodeKeyPrefix is redlock.key_prefix: a transparent-mode script that
	// names it is refused (see tEval).
	NodeKeyPrefix string
}

// Handler serves lockproxy's own commands on every connection.
type Handler struct {
	backend   backends.Backend
	limits    Limits
	info      Info
	log       *zap.Logger
	metrics   *metrics
	clients   func() []*resp.Session
	loopStats func() (clients, handoffs, returns int64)
	started   time.Time
	runID     string
	held      *heldLocks
	keepalive *keepalives
	closed    atomic.Bool
	// waits are the LOCK … WAITs in progress, for CLIENT UNBLOCK.
	waits lockWaits

	patterns []string          // transparent mode's lock patterns
	lockKey  func([]byte) bool // isLockKey, made once: a method value allocates
	fanout   backends.Fanout   // nil when the backend has no nodes to run commands on
	scripts  scriptCache       // for EVALSHA on lock keys

	up *relay.Relay
	rm *relayMetrics

	password      string
	users         map[string]string // auth.users: name → password
	authFail      authLimiter       // failed AUTH attempts, across connections
	perms         map[string]*perm  // auth.permissions, by user
	nodeKeyPrefix string
}

// NewHandler returns a Handler; Close it to stop its background work.
func NewHandler(o Options) *Handler {
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	m := newMetrics(o.Registry)
	h := &Handler{
		backend:   o.Backend,
		limits:    o.Limits,
		info:      o.Info,
		log:       o.Logger,
		metrics:   m,
		clients:   o.Clients,
		loopStats: o.LoopStats,
		started:   time.Now(),
		runID:     randomHex(20),
		held:      newHeldLocks(m),

		patterns:      o.LockPatterns,
		up:            o.Relay,
		password:      o.Password,
		perms:         map[string]*perm{},
		nodeKeyPrefix: o.NodeKeyPrefix,
		users:         o.Users,
	}
	h.lockKey = h.isLockKey
	if h.up != nil {
		h.rm = newRelayMetrics(o.Registry)
	}
	h.fanout, _ = o.Backend.(backends.Fanout)
	for user, p := range o.Permissions {
		h.perms[user] = newPerm(p)
	}
	h.keepalive = newKeepalives(o.Backend, h.held, o.Logger, o.Limits.KeepaliveIdle, o.Limits.MaxKeepalive, o.Registry)
	h.keepalive.delayFor = h.limits.lockDelay
	if ln, ok := o.Backend.(backends.LossNotifier); ok {
		ln.OnLost(h.keepalive.lostByBackend)
	}
	return h
}

// Close stops background work: every KEEPALIVE watchdog ends, releasing
// its lock within a bounded time (2 s), before Close returns.
func (h *Handler) Close() {
	if h.closed.CompareAndSwap(false, true) {
		h.keepalive.close()
		h.held.close()
	}
}

// conn is the per-connection state kept in resp.Session.Data.
type conn struct {
	name    string
	libName string
	libVer  string
	lastCmd string
	authed  bool           // authenticated, when auth.password or auth.users require it
	user    string         // the user it authenticated as, while authed
	perm    *perm          // what that user may do; nil: everything
	ka      *connKeepalive // nil until the first KEEPALIVE lock
	rl      *relayConn     // nil until the first relayed command
	// tx: in MULTI with no upstream (see localTx); txDirty: a command
	// was refused in it, so EXEC aborts.
	tx, txDirty bool
	// lw: a WATCH of lock keys and the transaction after it (locktx.go);
	// nil when there is none.
	lw *lockWatch
}

func state(s *resp.Session) *conn {
	if c, ok := s.Data.(*conn); ok {
		return c
	}
	c := &conn{}
	s.Data = c
	return c
}

// ServeRESP implements resp.Handler.
func (h *Handler) ServeRESP(s *resp.Session, args [][]byte) {
	if len(args) == 0 {
		return
	}
	if c, ok := s.Data.(*conn); ok && c.ka != nil {
		// A connection running a command is alive for its KEEPALIVE
		// locks however long the command blocks: LOCK … WAIT, or a
		// relayed BLPOP or XREAD BLOCK, whichever path serves it.
		ka := c.ka
		ka.busy.Add(1)
		defer ka.busy.Add(-1)
	}
	h.serve(s, args)
}

// serve is ServeRESP's work.
func (h *Handler) serve(s *resp.Session, args [][]byte) {
	if h.authRequired() && !state(s).authed && !noAuthNeeded(args[0]) {
		h.metrics.commands.WithLabelValues("unknown", "error").Inc()
		s.W.Error("NOAUTH Authentication required.")
		return
	}
	// The name is lowered and looked up once, and both are handed on: on
	// the relay's hot path every command passes here.
	var nbuf [32]byte
	name := resp.Lower(nbuf[:], args[0])
	c := table[string(name)]
	cs := state(s)
	if rl := cs.rl; rl != nil && rl.tracks {
		// CLIENT CACHING applies to the next command that is no CLIENT
		// command (trackedLockRead): Redis keeps its flag across CLIENT
		// commands, MULTI and the commands queued after it, and drops it
		// after any other (EXEC's and DISCARD's included).
		rl.cachingNow = rl.cachingNext
		if n := string(name); n != "client" && n != "multi" && (!rl.multi || n == "exec" || n == "discard") {
			rl.cachingNext = 0
		}
		// Redis spends a CLIENT CACHING on the next command that is no
		// CLIENT command, outside MULTI (disarmCaching).
		rl.counted = string(name) != "client" && string(name) != "multi" && !rl.multi
		if rl.counted && rl.armed {
			rl.spent++
		}
		if string(name) == "client" && len(args) > 2 && resp.EqualFold(args[1], "CACHING") {
			switch {
			case resp.EqualFold(args[2], "YES"):
				rl.cachingNext = 'y'
			case resp.EqualFold(args[2], "NO"):
				rl.cachingNext = 'n'
			}
		}
	}
	if h.up == nil && cs.lw == nil && h.localTx(s, cs, string(name), args) {
		return
	}
	if cs.perm != nil {
		if rl := cs.rl; rl != nil && rl.pipe.Tunneling() {
			// On a subscribed connection the replies to the commands
			// tunnelled before come as they arrive: the refusal waits
			// for them (tunnelSync), or it would overtake them.
			if msg, ok := h.permitted(cs.perm, userName(cs), string(name), c, args, true); !ok {
				if !h.tunnelSync(s, rl) {
					return // the client's connection is closing
				}
				if rl.pipe.Tunneling() {
					s.W.Error(msg)
					return
				}
				// The tunnel ended meanwhile: judged as on any other
				// connection below.
			}
		}
		if h.checkPermission(s, cs, string(name), c, args) {
			return
		}
	}
	if len(h.patterns) > 0 && h.lockTx(s, cs, string(name), args) {
		return
	}
	if h.up != nil && h.relayRoute(s, args, name, c) {
		return
	}
	if c == nil {
		// Transparent mode first: a command on a lock key is served by
		// the lock nodes, never by the upstream. Replies of relayed
		// commands before it go out first.
		if h.up != nil && h.onLockKeys(args) {
			h.relayFlush(s)
		}
		if h.transparent(s, args) {
			return
		}
		if h.up != nil {
			h.relayNamed(s, args, name)
			return
		}
		h.metrics.commands.WithLabelValues("unknown", "error").Inc()
		s.W.Error(unknownCommand(args))
		return
	}
	if c.Subs != nil && len(args) >= 2 {
		var buf [32]byte
		if sc := c.Subs[string(resp.Lower(buf[:], args[1]))]; sc != nil {
			if !arityOK(sc.Arity, len(args)) {
				h.metrics.commands.WithLabelValues(sc.Metric, "error").Inc()
				s.W.Error("ERR wrong number of arguments for '" + fullName(c, sc) + "' command")
				return
			}
			state(s).lastCmd = sc.Metric
			before, resets := s.W.Len(), s.W.Resets()
			sc.run(h, s, args)
			h.count(sc, s, before, resets)
			return
		}
		if h.up != nil {
			h.relayNamed(s, args, name)
			return
		}
		if len(args) == 2 && resp.EqualFold(args[1], "HELP") {
			// With an upstream, relayed above: it lists what the
			// upstream serves, which is what such a connection reaches.
			h.metrics.commands.WithLabelValues(c.Metric, "ok").Inc()
			help(s, c)
			return
		}
		if c.Name == "client" && resp.EqualFold(args[1], "UNBLOCK") {
			// With an upstream, relayed (clientUnblock): it may name a
			// client blocked there.
			h.clientUnblockLocal(s, args)
			return
		}
		h.metrics.commands.WithLabelValues(c.Metric, "error").Inc()
		s.W.Error("ERR unknown subcommand '" + string(cString(args[1], 128)) + "'. Try " + strings.ToUpper(c.Name) + " HELP.")
		return
	}
	if !arityOK(c.Arity, len(args)) || c.run == nil {
		h.metrics.commands.WithLabelValues(c.Metric, "error").Inc()
		wrongArity(s, c.Name)
		return
	}
	state(s).lastCmd = c.Metric
	before, resets := s.W.Len(), s.W.Resets()
	c.run(h, s, args)
	h.count(c, s, before, resets)
}

// count records the command's outcome by looking at the reply's first
// byte; before and resets are s.W's Len and Resets when it began.
func (h *Handler) count(c *Command, s *resp.Session, before int, resets uint64) {
	i := 0
	if replyFailed(s.W, before, resets) {
		i = 1
	}
	h.metrics.counters[c][i].Inc()
}

// replyFailed reports whether the reply of the command that just ran is
// an error; before and resets are w's Len and Resets when it began. Its
// reply is the last frame in the buffer, not always the one at before:
// replies of relayed commands pipelined before it may have been appended
// ahead of it (relayOne); and a reset means before says nothing of the
// buffer any more: the command flushed the replies before it (LOCK …
// WAIT), after which its reply starts lower, or replies were inserted
// ahead of it or taken back out (the relay's splice, upstreamReply). So
// the frames are walked, from before when the buffer was not reset (a
// frame boundary, and then the walk is over the command's reply alone,
// mostly one short frame), else from the start: the buffer holds whole
// frames only. A buffer the walk cannot read is judged by the byte at
// where the walk began.
func replyFailed(w *resp.Writer, before int, resets uint64) bool {
	b := w.Bytes()
	from := before
	if w.Resets() != resets {
		from = 0
	}
	if from >= len(b) {
		return false
	}
	last := from
	for at := from; at < len(b); {
		n, err := relay.FrameEnd(b[at:])
		if err != nil || n == 0 {
			return b[from] == '-'
		}
		last = at
		at += n
	}
	return b[last] == '-'
}

// ShuttingDown implements resp.ShutdownHandler: the server is shutting
// down, so the KEEPALIVE locks of the connections it closes are released,
// not kept for their lock-delay: their holders did not lose them.
func (h *Handler) ShuttingDown() {
	h.keepalive.shuttingDown()
}

// Closed implements resp.Handler. It runs after the session's context was
// canceled; it does no network I/O beyond closing the client's pinned
// upstream connection, if any. That cancellation is the only signal the
// connection's KEEPALIVE watchdogs need: each releases its own lock.
func (h *Handler) Closed(s *resp.Session) {
	if h.up != nil {
		h.relayClosed(s)
	}
}

// unknownCommand is redis-server 7's reply to an unknown command, byte for
// byte (processCommand): the name as "%.128s", and the arguments as
// "'%.*s' " each while the list is under 128 bytes, each cut to what is
// left of the 128. Writer.Error turns line breaks into spaces, as
// rejectCommandFormat does.
func unknownCommand(args [][]byte) string {
	var b strings.Builder
	b.WriteString("ERR unknown command '")
	b.Write(cString(args[0], 128))
	b.WriteString("', with args beginning with: ")
	n := 0 // the argument list's length so far
	for _, a := range args[1:] {
		if n >= 128 {
			break
		}
		part := cString(a, 128-n)
		b.WriteByte('\'')
		b.Write(part)
		b.WriteString("' ")
		n += len(part) + 3
	}
	return b.String()
}

// cString is what C's "%.*s" prints of a with precision max: up to its
// first NUL byte, and at most max bytes.
func cString(a []byte, max int) []byte {
	if i := bytes.IndexByte(a, 0); i >= 0 {
		a = a[:i]
	}
	if len(a) > max {
		a = a[:max]
	}
	return a
}

// replyError turns a backend error into the one error reply clients see.
// It is the only place that does: internal error text never reaches a
// client except the node names and reasons of a NOQUORUM.
func (h *Handler) replyError(s *resp.Session, cmd string, err error) {
	var nq *quorum.NoQuorumError
	switch {
	case errors.As(err, &nq):
		s.W.Error("NOQUORUM " + nq.Error())
	case errors.Is(err, quorum.ErrNoQuorum):
		s.W.Error("NOQUORUM not enough nodes answered")
	case errors.Is(err, backends.ErrTooLarge):
		s.W.Error("ERR key or token too long for the lock store")
	case errors.Is(err, context.Canceled):
		s.W.Error("ERR command canceled: connection closing or server shutting down")
	case errors.Is(err, context.DeadlineExceeded):
		s.W.Error("ERR timed out waiting for the lock nodes")
	default:
		h.log.Error("command failed", zap.String("cmd", cmd), zap.Error(err))
		s.W.Error("ERR internal error in '" + cmd + "'; see the server log")
	}
}

// newToken is 128 random bits, printable.
func newToken() string { return randomHex(16) }

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic("commands: crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b)
}

// localTx serves MULTI … EXEC on a connection when there is no upstream
// to relay transactions to, as Redis answers a transaction whose commands
// could not be queued: MULTI is +OK, every command in it is refused
// (which dooms the transaction), and EXEC answers EXECABORT, so nothing
// in it runs. Unknown to lockproxy, MULTI was refused alone and the
// commands after it ran one by one: a transaction's SET NX PX on a lock
// key took the key while its client was told the transaction failed
// (TestTransactionWithoutUpstreamRunsNothing). QUIT and RESET end the
// transaction and are served as always; EXEC and DISCARD outside one are
// refused as Redis refuses them. It reports whether it answered.
func (h *Handler) localTx(s *resp.Session, cs *conn, name string, args [][]byte) bool {
	if !cs.tx {
		switch name {
		case "multi", "exec", "discard":
		default:
			return false
		}
		switch {
		case name == "exec" && len(args) != 1:
			// Redis refuses it as an aborted transaction, with or
			// without a MULTI (execCommandAbort).
			s.W.Error(execAbort(args))
		case len(args) != 1:
			s.W.Error("ERR wrong number of arguments for '" + name + "' command")
		case name == "multi":
			cs.tx, cs.txDirty = true, false
			s.W.Simple("OK")
		default:
			// Redis's own text, which clients that pipeline EXEC after a
			// MULTI that failed know.
			s.W.Error("ERR " + strings.ToUpper(name) + " without MULTI")
		}
		return true
	}
	switch name {
	case "quit", "reset":
		cs.tx, cs.txDirty = false, false
		return false
	case "exec", "discard":
		if len(args) != 1 && name == "discard" {
			// Refused, and the transaction stays open, flagged.
			cs.txDirty = true
			s.W.Error("ERR wrong number of arguments for 'discard' command")
			return true
		}
		switch {
		case name == "discard":
			s.W.Simple("OK")
		case cs.txDirty || len(args) != 1:
			// Redis 7 discards the transaction for an EXEC it refuses
			// (execAbort names why), as for one flagged before.
			s.W.Error(execAbort(args))
		default:
			s.W.Array(0) // an empty transaction, as Redis runs it
		}
		cs.tx, cs.txDirty = false, false
	case "multi", "watch":
		if name == "multi" && len(args) != 1 || name == "watch" && len(args) < 2 {
			// Redis checks the arity first, and flags the transaction.
			cs.txDirty = true
			wrongArity(s, name)
			return true
		}
		// Redis answers it and leaves the transaction as it was.
		s.W.Error(insideMulti[name])
	default:
		cs.txDirty = true
		h.metrics.commands.WithLabelValues("transaction", "error").Inc()
		s.W.Error("ERR '" + relay.Clip(name) + "' is not queued: transactions run on the upstream Redis, and lockproxy has none (upstream); EXEC will abort the transaction")
	}
	return true
}
