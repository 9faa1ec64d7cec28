package commands

// KEEPALIVE: the watchdog that renews a lock while its holder's connection
// is open and alive, and releases it when the connection closes.
//
// Each keepalive lock (a key and a token) has one goroutine (run), which
// sleeps on a timer, on its own context (canceled when the lock stops being
// kept, or by Handler.Close) and on a wake-up channel. Several connections
// may hold the same lock with the same token (a client's pool, reentrant
// holds): the lock is kept while any of them is alive, and each one's
// close releases its own holds. A connection's close is seen through its
// session context (context.AfterFunc), which only records the holds to
// release and wakes the goroutine: every release is done by the lock's own
// goroutine, with a bounded context. A token may hold a key both for
// writing and for reading (a downgrade): the watchdog counts each hold's
// kind, so that an UNLOCK, which releases write holds first, takes off the
// kind it released, and it releases and renews exactly the kinds it keeps
// (backends.HoldKeeper): the token's other kind may be held outside it,
// with a lease of its own that its holder was told of.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

const (
	// DefaultKeepaliveIdle is the idle window used when Limits.KeepaliveIdle
	// is zero: twice Redisson's 30 s watchdog lease, so a client that PINGs
	// as often as common pools check their connections (30 s) stays alive.
	DefaultKeepaliveIdle = 60 * time.Second
	// maxKeepalivePerConn bounds the keepalive locks (and the lost-lock
	// notices waiting to be read) of one connection, so one client cannot
	// make the server hold unbounded goroutines and memory.
	maxKeepalivePerConn = 10000
	// DefaultMaxKeepalive bounds the KEEPALIVE locks of the whole instance
	// when Limits.MaxKeepalive is zero (conf's default too).
	DefaultMaxKeepalive = 100000
	// releaseTimeout bounds the release of one keepalive lock when its
	// connection closes or the server shuts down: a dead majority must not
	// hold up shutdown, and the lease expires on its own anyway.
	releaseTimeout = 2 * time.Second
	// leavingKeep is how long a release of a watchdog's holds that landed
	// is remembered (keepalives.leaving): a grant whose reply comes later
	// than that after its hold count was taken is not expected.
	leavingKeep = 30 * time.Second
)

// lostReason says why a keepalive lock was lost; it is a metric label, so
// the set is closed.
type lostReason uint8

const (
	lostRenewFailed lostReason = iota // a renewal did not reach quorum or found the lock gone
	lostIdle                          // the connection showed no life within the idle window
	lostMaxHold                       // MAXHOLD ran out
	// lostUnlocked: an UNLOCK with the token on another connection
	// released a hold, and lockproxy could not tell it from this
	// connection's KEEPALIVE hold, which it then stopped keeping: the
	// lock store did not answer how many holds the token has left
	// (keepalives.endUnlock).
	lostUnlocked
	numLostReasons
)

func (r lostReason) label() string {
	switch r {
	case lostRenewFailed:
		return "renew_failed"
	case lostIdle:
		return "idle"
	case lostUnlocked:
		return "unlocked"
	default:
		return "maxhold"
	}
}

var errTooManyKeepalive = errors.New("ERR too many KEEPALIVE locks on this connection (limit " +
	strconv.Itoa(maxKeepalivePerConn) + "); UNLOCK some, or give PX/EX without KEEPALIVE")

// tooManyKeepaliveServer is the refusal past the instance's bound.
func tooManyKeepaliveServer(max int) error {
	return errors.New("ERR too many KEEPALIVE locks on this server (limit " + strconv.Itoa(max) +
		", locks.max_keepalive); UNLOCK some, or give PX/EX without KEEPALIVE")
}

var errShuttingDown = errors.New("ERR command canceled: connection closing or server shutting down")

// lockLostFrame is the RESP3 push ["lock-lost", key, token].
func lockLostFrame(key, token string) []byte {
	b := make([]byte, 0, 32+len(key)+len(token))
	b = append(b, ">3\r\n$9\r\nlock-lost\r\n"...)
	for _, s := range []string{key, token} {
		b = append(b, '$')
		b = strconv.AppendInt(b, int64(len(s)), 10)
		b = append(b, '\r', '\n')
		b = append(b, s...)
		b = append(b, '\r', '\n')
	}
	return b
}

// connKeepalive is one connection's share of the keepalive machinery. The
// connection's goroutine and the watchdogs of its locks both use it.
type connKeepalive struct {
	// lastActive is when the client last sent a command (Session.LastActive).
	lastActive func() time.Time
	// push queues a RESP3 frame on the connection (Session.PushHeld); it
	// never blocks and never drops a frame: it reports false only when the
	// connection is closed (or closed by it, past the frames it may keep
	// waiting), which tells the client as much.
	push func([]byte) bool
	// close closes the connection (Session.Close): past the notices it
	// may keep waiting, as push does past the frames (tellLost).
	close func()
	// proto is the connection's RESP version, kept here because the
	// watchdogs may not read the connection's writer.
	proto atomic.Int32
	// busy counts the commands running: a client blocked in LOCK … WAIT,
	// or in a relayed BLPOP or XREAD BLOCK, is alive though it sends
	// nothing. A counter rather than a flag, so that a command run within
	// another cannot end the outer one's mark.
	busy atomic.Int32
	// live counts this connection's running watchdogs.
	live atomic.Int32
	// epoch counts the connection's RESETs (keepalives.connReset): a
	// loss whose owners were taken before one is not told after it, to
	// a connection that may have passed to another user. Changed with
	// keepalives.mu and mu held, read with either.
	epoch atomic.Uint64

	mu sync.Mutex
	// lost: the notice of the keepalive lock of a key (first level) held
	// by a token (second) lost, until the connection's next UNLOCK or
	// RENEW of the key with that token, LOCK/RLOCK of it with TOKEN
	// token, or LOCK/RLOCK of it without TOKEN (which takes every notice
	// of the key). By key and token, so that an UNLOCK or RENEW is never
	// answered for another token's loss, and not run (its hold then left
	// held). nLost counts them all.
	lost  map[string]map[string]lostNotice
	nLost int
	// cmd is the lock of the UNLOCK or RENEW the connection runs, while
	// cmdOn (commands on a connection run one at a time): a loss of it
	// told meanwhile is answered by that command (endCmd), the
	// connection's next on the lock, not left for the one after it.
	// cmdUnlock: it is an UNLOCK, and the pushes of that loss wait in
	// cmdPushes until it ends: an UNLOCK that released the lock itself is
	// told nothing of it.
	cmd       heldKey
	cmdOn     bool
	cmdUnlock bool
	cmdPushes [][]byte
}

// lostNotice is why a keepalive lock was lost, and how many KEEPALIVE
// holds of it the connection had then.
type lostNotice struct {
	why   string
	holds int
}

func newConnKeepalive(lastActive func() time.Time, push func([]byte) bool, close func(), proto int) *connKeepalive {
	ka := &connKeepalive{lastActive: lastActive, push: push, close: close}
	ka.proto.Store(int32(proto))
	return ka
}

// alive reports whether the connection showed life within idle of now.
func (ka *connKeepalive) alive(now time.Time, idle time.Duration) bool {
	return ka.busy.Load() > 0 || now.Sub(ka.lastActive()) <= idle
}

// tellLost tells the connection that its keepalive lock on key held by
// token, of which it had holds KEEPALIVE holds, was lost: the notice for
// its next lock command on it, and, on RESP3, a push (held back while an
// UNLOCK of that lock runs: see cmdUnlock). Past maxKeepalivePerConn
// notices waiting, the connection is closed instead, whatever its RESP
// version, as a RESP3 one is past as many pushes waiting
// (resp.Session.PushHeld): a notice dropped would leave its client
// relying, unwarned, on a lock it lost, where a close tells it, as any
// close does, that what it held through the connection is gone. A client
// gets there only by losing that many locks and reading none of the
// notices (it holds at most as many KEEPALIVE locks at a time).
func (ka *connKeepalive) tellLost(key, token, why string, holds int) {
	ka.tellLostAt(ka.epoch.Load(), key, token, why, holds)
}

// tellLostAt is tellLost of a loss whose owners were taken in epoch: it
// tells nothing once the connection was RESET since (connReset), as the
// lock was no longer the connection's to lose.
func (ka *connKeepalive) tellLostAt(epoch uint64, key, token, why string, holds int) {
	var frame []byte
	if ka.proto.Load() == 3 {
		frame = lockLostFrame(key, token)
	}
	ka.mu.Lock()
	if ka.epoch.Load() != epoch {
		ka.mu.Unlock()
		return
	}
	kept := ka.noteLostLocked(key, token, why, holds)
	if kept && frame != nil && ka.cmdOn && ka.cmdUnlock && ka.cmd == (heldKey{key, token}) {
		ka.cmdPushes = append(ka.cmdPushes, frame)
		frame = nil
	}
	ka.mu.Unlock()
	switch {
	case !kept:
		ka.close()
	case frame != nil:
		ka.push(frame)
	}
}

// noteLostLocked records the notice; it reports false when it cannot, the
// connection having maxKeepalivePerConn notices waiting. ka.mu is held.
func (ka *connKeepalive) noteLostLocked(key, token, why string, holds int) bool {
	if ka.lost == nil {
		ka.lost = map[string]map[string]lostNotice{}
	}
	byToken := ka.lost[key]
	if _, ok := byToken[token]; ok {
		byToken[token] = lostNotice{why, holds}
		return true
	}
	if ka.nLost >= maxKeepalivePerConn {
		return false
	}
	if byToken == nil {
		byToken = map[string]lostNotice{}
		ka.lost[key] = byToken
	}
	byToken[token] = lostNotice{why, holds}
	ka.nLost++
	return true
}

// takeLostToken returns, once, why the keepalive lock on key held by
// token was lost.
func (ka *connKeepalive) takeLostToken(key, token []byte) (string, bool) {
	ka.mu.Lock()
	defer ka.mu.Unlock()
	n, ok := ka.takeLocked(string(key), string(token))
	return n.why, ok
}

// takeLocked takes the notice of key with token, if any. ka.mu is held.
func (ka *connKeepalive) takeLocked(key, token string) (lostNotice, bool) {
	if ka.nLost == 0 {
		return lostNotice{}, false
	}
	byToken := ka.lost[key]
	n, ok := byToken[token]
	if ok {
		delete(byToken, token)
		ka.nLost--
		if len(byToken) == 0 {
			delete(ka.lost, key)
		}
	}
	return n, ok
}

// takeLost returns, once, why a keepalive lock on key was lost, whatever
// its token, and takes every notice of key: for a LOCK or RLOCK without
// TOKEN, "the first lock command on a key whose keepalive lock was lost".
func (ka *connKeepalive) takeLost(key []byte) (string, bool) {
	ka.mu.Lock()
	defer ka.mu.Unlock()
	if ka.nLost == 0 {
		return "", false
	}
	byToken, ok := ka.lost[string(key)]
	if !ok {
		return "", false
	}
	delete(ka.lost, string(key))
	ka.nLost -= len(byToken)
	for _, n := range byToken {
		return n.why, true
	}
	return "", false
}

// beginCmd begins an UNLOCK (unlock) or RENEW of key with token: it takes
// the notice of that lock's loss, if one waits, which the command answers
// without running; else the command runs, and a loss told meanwhile is
// answered by it (endCmd). One at a time: commands on a connection do not
// overlap.
func (ka *connKeepalive) beginCmd(key, token []byte, unlock bool) (string, bool) {
	ka.mu.Lock()
	defer ka.mu.Unlock()
	if n, ok := ka.takeLocked(string(key), string(token)); ok {
		return n.why, true
	}
	ka.cmd, ka.cmdOn, ka.cmdUnlock = heldKey{string(key), string(token)}, true, unlock
	return "", false
}

// endCmd ends what beginCmd began; released says an UNLOCK released a
// hold. It returns, once, why the lock was lost when a loss was told
// while the command ran: the command answers it, as the connection's
// next on the lock, rather than the one after it, which may take the key
// afresh. Not to an UNLOCK that released the connection's only KEEPALIVE
// hold of it, though: the hold was still there, and the client released
// it as it meant to; the loss is no news to it, and neither the notice
// nor the push held back for it is given.
func (ka *connKeepalive) endCmd(released bool) (string, bool) {
	ka.mu.Lock()
	hk := ka.cmd
	ka.cmd, ka.cmdOn, ka.cmdUnlock = heldKey{}, false, false
	pushes := ka.cmdPushes
	ka.cmdPushes = nil
	n, ok := ka.takeLocked(hk.key, hk.token)
	ka.mu.Unlock()
	if !ok || (released && n.holds <= 1) {
		return "", false
	}
	for _, p := range pushes {
		ka.push(p)
	}
	return n.why, true
}

// watchdog is one keepalive lock.
type watchdog struct {
	key, token string
	ttl        time.Duration
	// sent is when the backend's attempt that granted the lock was sent
	// (or earlier; not the start of a WAIT before it: grantSent): the
	// lease may have begun as soon as the backend got it (on PostgreSQL at
	// the INSERT, before a COMMIT that may be slow), so it is counted from
	// then, not from the reply.
	sent time.Time
	// validity is what the grant's reply told the holder, from the reply:
	// the first renewal comes within it, however short.
	validity time.Duration
	cancel   context.CancelFunc
	wake     chan struct{} // cap 1: a holder's connection closed (drop)

	// startMode, startHolds and startDone are the kind of the grant that
	// started w, the token's holds of that kind its reply told
	// (backends.Lease.Holds), and when that reply came.
	startMode  backends.Mode
	startHolds int64
	startDone  time.Time

	// Guarded by keepalives.mu.
	// maxHold is the MAXHOLD that set deadline, the earliest of the
	// KEEPALIVE grants' it counts (each from its own grant); 0: none.
	maxHold  time.Duration
	deadline time.Time
	// toldEnd is the latest end of a validity told to a KEEPALIVE grant
	// w counts (from its reply), or to a RENEW of its key and token
	// (toldRenewal): MAXHOLD releases no hold before it, and the
	// lock-delay leaves the lease no shorter.
	toldEnd time.Time
	// renewed is the end of the validity a RENEW of w's key and token
	// answered (from when it was sent), for w's goroutine to take
	// (takeRenewed): the lease may now end then, sooner than w's
	// renewals left it. Zero: none since it last took one.
	renewed time.Time
	// undecided is the earliest end of the lease a RENEW of w's key and
	// token that answered an error may have set (from when it was sent,
	// its TTL): it may have reached a majority though too few answered
	// (undecidedRenewal). Zero: none since w's goroutine last took one.
	undecided time.Time
	// askedEnd is the latest end of a lease w's renewals or the grants it
	// counts asked for (from when each was sent): the nodes' lease lasts
	// at least as long (renewals never shorten it).
	askedEnd time.Time
	// uncounted are the token's holds, by kind, that w does not count:
	// those the grant that started it found (its reply's hold count less
	// its own), taken without KEEPALIVE before w ran, on this connection
	// or another. An UNLOCK on a connection with no hold w counts, which
	// the lock store's count of the holds left (endUnlock) shows was not
	// one w counts, takes one of these; when the lock store cannot tell,
	// one of these before any KEEPALIVE hold.
	uncounted [2]int
	// pending counts, by kind, UNLOCKs on connections with no hold w
	// counts that released a hold while other UNLOCKs of the token were
	// in flight: the lock store's count of the holds left cannot tell
	// whose hold each released until the others land, so the last UNLOCK
	// in flight asks once and attributes them all (endUnlock).
	pending [2]int
	// grants counts the holds, by kind, joinLocked counted on w, and
	// begun the UNLOCKs beginUnlock counted: an answer of the lock
	// store's asked while a hold joined or an UNLOCK began may or may
	// not count it, and endUnlock asks again (askedLocked).
	grants  [2]uint64
	begun   uint64
	holders map[*connKeepalive]*holder // the connections that took it with KEEPALIVE
	loose   [2]int                     // holds granted without KEEPALIVE while it runs, by backends.Mode
	drop    [2]int                     // holds of closed connections, by backends.Mode, for run to release
	// releasing are the holds of closed connections run took from drop
	// and is releasing; released gets a value when it is done. An
	// UNLOCK that asks the lock store how many holds the token has left
	// waits for that first (endUnlock): the answer could not tell
	// whether those releases had landed. run takes no hold from drop
	// while an UNLOCK is in flight, so none begins while one asks.
	releasing [2]int
	released  chan struct{} // cap 1
	// unlocking counts the UNLOCKs of key with token in flight, by the
	// kind of hold each is taken to release (unlockOp.mode).
	unlocking [2]int
	// unlocks counts the UNLOCKs counted in unlocking that released a
	// hold: a renewal that found nothing tells by it whether one ended
	// since the renewal was sent.
	unlocks uint64
	// settled gets a value when the last UNLOCK in flight ends, for
	// ended, which waits for it before counting the holds to release.
	settled chan struct{} // cap 1
	// shared: a grant with the client's own TOKEN was counted, so the
	// token may also hold write holds this watchdog does not count (taken
	// before it started, or through another instance: a downgrade's),
	// which UNLOCK releases before any read hold.
	shared bool
	// ending: no KEEPALIVE holder is left and run is releasing every hold
	// it counts. It is out of the map already and takes no new hold: a
	// hold granted to a live connection now would be released with the
	// rest. Until it has counted them it is in keepalives.ending, so that
	// an UNLOCK of key with token still takes the hold it releases off
	// w's counts: the token's holds are alike on the nodes, and one
	// released by an UNLOCK and again by w would take another's.
	ending  bool
	stopped bool // ended by UNLOCK, a loss or a release; no longer in the map
}

// holder is one connection's KEEPALIVE holds of a watchdog's lock.
type holder struct {
	n    [2]int      // by backends.Mode
	stop func() bool // unregisters the close callback (context.AfterFunc)
}

func (h *holder) total() int { return h.n[backends.Write] + h.n[backends.Read] }

// inFlight is how many UNLOCKs of w's key and token are in flight. k.mu
// is held.
func (w *watchdog) inFlight() int { return w.unlocking[backends.Write] + w.unlocking[backends.Read] }

// holds is how many holds of each kind w keeps in all. k.mu is held.
func (w *watchdog) holds() [2]int {
	n := w.loose
	for m := range n {
		n[m] += w.drop[m]
		for _, h := range w.holders {
			n[m] += h.n[m]
		}
	}
	return n
}

// renewMode is the kind of hold w's renewals (and lock-delay) are for:
// write while a KEEPALIVE hold it keeps (or one of a connection that just
// closed) is a write hold, renewing with it a downgrade's read hold
// (backends.HoldKeeper.RenewHold never shortens the other kind); else
// read, leaving alone a write hold of the token's that is not kept with
// KEEPALIVE (a downgrade's, taken without it), whose lease a renewal with
// the read TTL would cut short. k.mu is held.
func (w *watchdog) renewMode() backends.Mode {
	if w.drop[backends.Write] > 0 {
		return backends.Write
	}
	for _, h := range w.holders {
		if h.n[backends.Write] > 0 {
			return backends.Write
		}
	}
	return backends.Read
}

// counted is how many holds of mode w counts, KEEPALIVE and loose (not
// those of closed connections). k.mu is held.
func (w *watchdog) counted(mode backends.Mode) int {
	n := w.loose[mode]
	for _, h := range w.holders {
		n += h.n[mode]
	}
	return n
}

// keepalives is the Handler's registry of watchdogs.
type keepalives struct {
	backend backends.Backend
	held    *heldLocks
	log     *zap.Logger
	idle    time.Duration
	// max bounds the running watchdogs (locks.max_keepalive); errFull
	// refuses one more.
	max     int
	errFull error
	release time.Duration // bound of one release (releaseTimeout)
	lost    [numLostReasons]prometheus.Counter
	active  prometheus.Gauge
	delayed prometheus.Counter
	// delayFor is the lock-delay for a key (locks.lock_delay), 0 for none.
	delayFor func(key string) time.Duration

	mu sync.Mutex
	m  map[heldKey]*watchdog
	// ending holds the watchdogs that are ending (watchdog.ending) and
	// have not yet counted the holds they release.
	ending map[heldKey][]*watchdog
	// leaving are, by key and token, the holds watchdogs release (settle,
	// a closed connection's: takeDrop) once they no longer count them:
	// a KEEPALIVE grant starting a watchdog meanwhile may find them in its
	// reply's hold count, and they are not holds the new one does not
	// count (startGrant). leavingSwept is when they were last swept.
	leaving      map[heldKey]*leavingHolds
	leavingSwept time.Time
	closed       bool
	// shutdown: the server is shutting down (Handler.ShuttingDown). A
	// lock whose connection closes now was not lost by its holder, so it
	// is released, not kept for its lock-delay.
	shutdown bool
	wg       sync.WaitGroup
}

// leavingHolds are the holds of one key and token watchdogs release, by
// backends.Mode: those on their way to the nodes, and those landed, the
// latest at last (forgotten leavingKeep after it).
type leavingHolds struct {
	inflight, landed [2]int
	last             time.Time
}

// leavingLocked records that w is about to release holds it no longer
// counts (keepalives.leaving). k.mu is held.
func (k *keepalives) leavingLocked(w *watchdog, holds [2]int) {
	if holds == ([2]int{}) {
		return
	}
	hk := heldKey{w.key, w.token}
	l := k.leaving[hk]
	if l == nil {
		l = &leavingHolds{}
		k.leaving[hk] = l
	}
	for m := range holds {
		l.inflight[m] += holds[m]
	}
}

// left records that w's release of holds (leavingLocked) ended: landed,
// or not sent (the lock-delay leaves them to their lease).
func (k *keepalives) left(w *watchdog, holds [2]int, landed bool) {
	if holds == ([2]int{}) {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	now := time.Now()
	if l := k.leaving[heldKey{w.key, w.token}]; l != nil {
		for m := range holds {
			l.inflight[m] -= holds[m]
			if landed {
				l.landed[m] += holds[m]
			}
		}
		if landed {
			l.last = now
		}
	}
	if now.Sub(k.leavingSwept) < leavingKeep {
		return
	}
	k.leavingSwept = now
	for hk, l := range k.leaving {
		if now.Sub(l.last) >= leavingKeep {
			l.landed = [2]int{}
			if l.inflight == ([2]int{}) {
				delete(k.leaving, hk)
			}
		}
	}
}

// releaseLeaving releases holds of w that leavingLocked recorded.
func (k *keepalives) releaseLeaving(w *watchdog, holds [2]int) {
	k.releaseHolds(w, holds)
	k.left(w, holds, true)
}

func newKeepalives(b backends.Backend, held *heldLocks, log *zap.Logger, idle time.Duration, max int, reg prometheus.Registerer) *keepalives {
	if idle <= 0 {
		idle = DefaultKeepaliveIdle
	}
	if max <= 0 {
		max = DefaultMaxKeepalive
	}
	lost := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockproxy_lock_lost_total",
		Help: "KEEPALIVE locks lost before their holder released them, by reason: renew_failed (a renewal did not reach quorum or found the lock gone), idle (the connection sent nothing within locks.keepalive_idle), maxhold (MAXHOLD ran out), unlocked (an UNLOCK with the token on another connection released a hold that could not be told from one it kept, the lock store unable to say which).",
	}, []string{"reason"})
	active := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "lockproxy_keepalive_locks",
		Help: "KEEPALIVE locks whose watchdog is running.",
	})
	delayed := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lockproxy_lock_delays_total",
		Help: "KEEPALIVE locks kept held for their lock-delay (locks.lock_delay) after the holder lost them without releasing them.",
	})
	reg.MustRegister(lost, active, delayed)
	k := &keepalives{backend: b, held: held, log: log, idle: idle, release: releaseTimeout,
		max: max, errFull: tooManyKeepaliveServer(max),
		active: active, delayed: delayed, m: map[heldKey]*watchdog{}, ending: map[heldKey][]*watchdog{},
		leaving:  map[heldKey]*leavingHolds{},
		delayFor: func(string) time.Duration { return 0 }}
	for r := lostReason(0); r < numLostReasons; r++ {
		k.lost[r] = lost.WithLabelValues(r.label())
	}
	return k
}

// full is the refusal of one more KEEPALIVE lock on ka's connection: past
// the connection's bound or the instance's (locks.max_keepalive); nil
// when there is room. Concurrent LOCKs may each find room and pass the
// bound by as many: it bounds memory, it is not a count clients rely on.
func (k *keepalives) full(ka *connKeepalive) error {
	if ka != nil && ka.live.Load() >= maxKeepalivePerConn {
		return errTooManyKeepalive
	}
	if k.count() >= k.max {
		return k.errFull
	}
	return nil
}

// granted is grantedHold of a write hold with the client's own token.
func (k *keepalives) granted(sessCtx context.Context, ka *connKeepalive, key, token string) bool {
	return k.grantedHold(sessCtx, ka, key, token, backends.Write, true)
}

// grantedHold counts a LOCK (mode Write) or RLOCK (Read) of key with
// token granted (reentrant or not) on a lock a watchdog keeps, so that
// UNLOCKs end the watchdog only with the last hold: for the connection
// that took it, with its session context sessCtx, when it asked for
// KEEPALIVE (ka not nil), else as a loose hold. shared says the token was
// the client's own (TOKEN). It reports whether a watchdog was there to
// count it (none is while the handler closes).
func (k *keepalives) grantedHold(sessCtx context.Context, ka *connKeepalive, key, token string, mode backends.Mode, shared bool) bool {
	return k.grantedGrant(sessCtx, ka, key, token, mode, shared, 0, 0, grantTiming{})
}

// grantedGrant is grantedHold of a grant of ttl, with the KEEPALIVE
// grant's maxHold (0 for none) and g its timing and hold count (zero
// when unknown). A MAXHOLD earlier than w's deadline becomes w's.
func (k *keepalives) grantedGrant(sessCtx context.Context, ka *connKeepalive, key, token string, mode backends.Mode, shared bool, ttl, maxHold time.Duration, g grantTiming) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	w := k.m[heldKey{key, token}]
	if w == nil || k.closed {
		// Closing, the handler has canceled every watchdog, which will
		// release every hold it counts: a hold granted now must not be
		// one of them (startGrant refuses a KEEPALIVE one).
		return false
	}
	k.joinLocked(w, sessCtx, ka, mode, shared, ttl, maxHold, g)
	return true
}

// joinLocked counts on w a grant of mode (see grantedGrant): ka's
// KEEPALIVE hold, or a loose one when ka is nil. k.mu is held.
func (k *keepalives) joinLocked(w *watchdog, sessCtx context.Context, ka *connKeepalive, mode backends.Mode, shared bool, ttl, maxHold time.Duration, g grantTiming) {
	w.shared = w.shared || shared
	now := time.Now()
	if !g.sent.IsZero() {
		w.askedEnd = later(w.askedEnd, g.sent.Add(ttl))
	}
	// A grant begun before the one that started w came back may have
	// reached the nodes first: that one's hold count then took this hold
	// for one w does not count. It did when this one's count is the
	// lower (each grant adds one).
	if g.holds > 0 && mode == w.startMode && g.begun.Before(w.startDone) && g.holds < w.startHolds && w.uncounted[mode] > 0 {
		w.uncounted[mode]--
	}
	w.grants[mode]++
	if ka == nil {
		w.loose[mode]++
		return
	}
	k.addHolderLocked(w, sessCtx, ka, mode)
	w.toldEnd = later(w.toldEnd, now.Add(g.validity))
	if maxHold > 0 {
		if d := now.Add(maxHold); w.deadline.IsZero() || d.Before(w.deadline) {
			// The earliest MAXHOLD ends the lock for every holder, who
			// are each told as MAXHOLD's end is told; w's goroutine
			// learns of it now, not at its next renewal.
			w.deadline, w.maxHold = d, maxHold
			select {
			case w.wake <- struct{}{}:
			default:
			}
		}
	}
}

// toldRenewal records that a RENEW of key with token, sent at sent, told
// its client validity, from now: the watchdogs that keep key with token
// leave the lease no shorter (watchdog.toldEnd). RENEW sets the lease, and
// may have shortened it below what the running watchdog's renewals keep:
// its goroutine is woken to renew within half the validity the RENEW
// answered (watchdog.renewed), as it does after its own renewals, rather
// than at its next renewal, which may come after that lease has run out.
func (k *keepalives) toldRenewal(key, token string, sent time.Time, validity time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	hk := heldKey{key, token}
	end := time.Now().Add(validity)
	if w := k.m[hk]; w != nil {
		w.toldEnd = later(w.toldEnd, end)
		// Of RENEWs not yet taken, the earliest end: which of them
		// landed last cannot be told.
		if e := sent.Add(validity); w.renewed.IsZero() || e.Before(w.renewed) {
			w.renewed = e
		}
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	for _, w := range k.ending[hk] {
		w.toldEnd = later(w.toldEnd, end)
	}
}

// undecidedRenewal records that a RENEW of key with token, sent at sent
// with ttl, answered an error (NOQUORUM, a timeout): it told its client
// nothing, but it may have set the lease to ttl on a majority all the same
// (the nodes that applied it answered late), shorter than what the
// watchdog's renewals keep. The holder was told the lock is kept ("a
// KEEPALIVE lock is then retried, not dropped"), so its goroutine is woken
// to renew within half of that lease, as after a RENEW that answered,
// rather than at its next renewal, which may come after that lease ran
// out. The validity last answered is left as it was: this one is a
// possibility, not an answer.
func (k *keepalives) undecidedRenewal(key, token string, sent time.Time, ttl time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	w := k.m[heldKey{key, token}]
	if w == nil {
		return
	}
	if e := sent.Add(ttl); w.undecided.IsZero() || e.Before(w.undecided) {
		w.undecided = e
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// earlier is the earlier of t and u.
func earlier(t, u time.Time) time.Time {
	if u.Before(t) {
		return u
	}
	return t
}

// later is the later of t and u.
func later(t, u time.Time) time.Time {
	if u.After(t) {
		return u
	}
	return t
}

// addHolderLocked counts one KEEPALIVE hold of mode of ka's connection on
// w, and on its first watches the connection's close. k.mu is held.
func (k *keepalives) addHolderLocked(w *watchdog, sessCtx context.Context, ka *connKeepalive, mode backends.Mode) {
	if h := w.holders[ka]; h != nil {
		h.n[mode]++
		return
	}
	ka.live.Add(1)
	h := &holder{}
	h.n[mode] = 1
	w.holders[ka] = h
	h.stop = context.AfterFunc(sessCtx, func() { k.holderGone(w, ka) })
}

// holderGone handles the close of a holder's connection: its holds are
// for w's goroutine to release, or, with no holder left, every hold.
func (k *keepalives) holderGone(w *watchdog, ka *connKeepalive) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.holderGoneLocked(w, ka)
}

// holderGoneLocked is holderGone with k.mu held.
func (k *keepalives) holderGoneLocked(w *watchdog, ka *connKeepalive) {
	h := w.holders[ka]
	if w.stopped || h == nil {
		return
	}
	delete(w.holders, ka)
	ka.live.Add(-1)
	for m := range w.drop {
		w.drop[m] += h.n[m]
	}
	if len(w.holders) == 0 {
		// run ends, releasing every hold counted now (ended). Until it
		// gets there the watchdog must take no new hold, which it would
		// release with the rest though its connection is alive: it
		// leaves the registry now, and a grant meanwhile starts a
		// watchdog of its own.
		k.endingLocked(w)
		w.cancel()
		return
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// connReset ends the KEEPALIVE holds of ka's connection as its close
// does (holderGone), for RESET, which makes the connection as if new: a
// pool lends a reset connection to another user, who must not be handed
// the last one's locks, kept alive for as long as the connection lives,
// nor answered -LOCKLOST for a loss that was not its own. Each hold is
// released by its watchdog's goroutine, within the release bound, or
// stays renewed for the other connections holding it with the token, as
// on close; plain holds keep their lease. It also drops the notices
// waiting, and any of a loss whose owners a watchdog took before the
// RESET but tells after it (epoch). It runs on the connection's
// goroutine, so no command of the connection runs meanwhile: a KEEPALIVE
// grant pipelined before RESET is counted already, one after it is the
// new user's.
func (k *keepalives) connReset(ka *connKeepalive) {
	k.mu.Lock()
	defer k.mu.Unlock()
	ka.mu.Lock()
	ka.epoch.Add(1)
	ka.lost, ka.nLost = nil, 0
	ka.mu.Unlock()
	if ka.live.Load() == 0 {
		// Most resets (a pool's, on every return) find no KEEPALIVE
		// lock: no need to look through every watchdog.
		return
	}
	// Every watchdog the connection's close would reach: those in the
	// registry, and those ending with their holders still counted
	// (MAXHOLD ran out, or Handler.close canceled them). Stopped ones
	// unregistered its close callback already.
	gone := func(w *watchdog) {
		if h := w.holders[ka]; h != nil {
			// The close callback must not run for the holds that
			// the connection takes after RESET; run already
			// (the connection is closing too), it finds none.
			h.stop()
			k.holderGoneLocked(w, ka)
		}
	}
	for _, w := range k.m {
		gone(w)
	}
	for _, ws := range k.ending {
		for _, w := range ws {
			gone(w)
		}
	}
}

// start is startHold of a write hold with the client's own token.
func (k *keepalives) start(sessCtx context.Context, ka *connKeepalive, key, token string, ttl, maxHold time.Duration) bool {
	return k.startHold(sessCtx, ka, key, token, ttl, maxHold, backends.Write, true)
}

// startHold is startGrant of a grant sent now and told its whole TTL.
func (k *keepalives) startHold(sessCtx context.Context, ka *connKeepalive, key, token string, ttl, maxHold time.Duration, mode backends.Mode, shared bool) bool {
	return k.startGrant(sessCtx, ka, key, token, ttl, maxHold, mode, shared, grantTiming{sent: time.Now(), validity: ttl})
}

// grantTiming is when a grant's granting attempt was sent to the backend
// (no later: grantSent) and the validity its reply told; begun is when
// Backend.Lock was called and holds the token's holds of the grant's kind
// its reply told (backends.Lease.Holds; 0: unknown).
type grantTiming struct {
	sent     time.Time
	validity time.Duration
	begun    time.Time
	holds    int64
}

// startGrant begins keeping key (held by token with ttl, in mode) alive
// for as long as sessCtx, the holder's session context, lasts (or another
// connection's that takes it too). shared says the token was the client's
// own (TOKEN); g is the grant's timing: its lease is counted from g.sent,
// and the first renewal comes within g.validity. Call it after grantedHold
// reported false. It returns false when the handler is closed; the lock is
// then released before startGrant returns.
func (k *keepalives) startGrant(sessCtx context.Context, ka *connKeepalive, key, token string, ttl, maxHold time.Duration, mode backends.Mode, shared bool, g grantTiming) bool {
	ctx, cancel := context.WithCancel(context.Background())
	now := time.Now()
	w := &watchdog{key: key, token: token, ttl: ttl, maxHold: maxHold, cancel: cancel,
		wake: make(chan struct{}, 1), settled: make(chan struct{}, 1), released: make(chan struct{}, 1),
		holders: map[*connKeepalive]*holder{}, shared: shared,
		sent: g.sent, validity: g.validity,
		startMode: mode, startHolds: g.holds, startDone: now,
		toldEnd: now.Add(g.validity), askedEnd: g.sent.Add(ttl)}
	if maxHold > 0 {
		w.deadline = now.Add(maxHold)
	}
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		cancel()
		var one [2]int
		one[mode] = 1
		k.releaseHolds(w, one)
		return false
	}
	if old := k.m[heldKey{key, token}]; old != nil {
		// Granted concurrently through another connection: one watchdog.
		k.joinLocked(old, sessCtx, ka, mode, shared, ttl, maxHold, g)
		k.mu.Unlock()
		cancel()
		return true
	}
	if g.holds > 1 {
		// The token held the key already, without a watchdog: holds w
		// does not count, which an UNLOCK on a connection without one
		// of w's releases. Less those of watchdogs still ending, which
		// they release (or an UNLOCK takes off their counts).
		n := int(g.holds - 1)
		for _, e := range k.ending[heldKey{key, token}] {
			n -= e.holds()[mode]
		}
		// Less those that watchdogs which counted them already are
		// releasing, or released since the grant began: its reply
		// may count them, gone or going, which no UNLOCK can release.
		if l := k.leaving[heldKey{key, token}]; l != nil {
			n -= l.inflight[mode]
			if !l.last.Before(g.begun) {
				n -= l.landed[mode]
			}
		}
		w.uncounted[mode] = max(n, 0)
	}
	k.m[heldKey{key, token}] = w
	k.addHolderLocked(w, sessCtx, ka, mode)
	k.wg.Add(1)
	k.active.Inc()
	k.mu.Unlock()
	go k.run(ctx, w)
	return true
}

// unlockOp is one UNLOCK of a key with a token watchdogs keep.
type unlockOp struct {
	key, token string
	// ws are the watchdogs that count holds of key with token: the one in
	// the registry, if any, and those ending (keepalives.ending). Each
	// counts the UNLOCK in its unlocking until endUnlock.
	ws []*watchdog
	// mode is the kind of hold the UNLOCK releases: the backend releases
	// a write hold while the token has one, else a read hold.
	mode backends.Mode
	// ask: the counts cannot tell mode (they count read holds only, and
	// the token may hold a write hold they do not count); whichHold asks
	// the backend.
	ask bool
}

// beginUnlock marks an UNLOCK of key with token in flight, so that a
// renewal that finds the lock gone meanwhile is not taken for a loss and
// an ending watchdog does not count the hold it releases, and tells
// which kind of hold it releases as far as the watchdogs' counts can. It
// returns nil when no watchdog keeps key with token.
func (k *keepalives) beginUnlock(key, token string) *unlockOp {
	k.mu.Lock()
	defer k.mu.Unlock()
	hk := heldKey{key, token}
	op := &unlockOp{key: key, token: token, mode: backends.Write}
	if w := k.m[hk]; w != nil {
		op.ws = append(op.ws, w)
	}
	op.ws = append(op.ws, k.ending[hk]...)
	if len(op.ws) == 0 {
		return nil
	}
	var n [2]int
	shared := false
	for _, w := range op.ws {
		c := w.holds() // an ending watchdog's holds are all on the nodes until it counts them
		if !w.ending {
			// A closed connection's holds may be released before the
			// UNLOCK gets there.
			c = [2]int{w.counted(backends.Write), w.counted(backends.Read)}
		}
		n[backends.Write] += c[backends.Write]
		n[backends.Read] += c[backends.Read]
		shared = shared || w.shared
	}
	if n[backends.Write] == 0 && n[backends.Read] > 0 {
		// Only read holds are counted. A token lockproxy made for an
		// RLOCK can hold no write hold the watchdogs missed; the
		// client's own may (LOCK … TOKEN t, then RLOCK … TOKEN t
		// KEEPALIVE: a downgrade), and UNLOCK would release that first.
		op.mode, op.ask = backends.Read, shared
	}
	for _, w := range op.ws {
		w.unlocking[op.mode]++
		w.begun++
	}
	return op
}

// whichHold settles op.mode, when the watchdogs' counts could not, by
// asking the backend whether the token holds the write lock. Call it
// before the UNLOCK runs. When the backend cannot tell, the UNLOCK is
// taken to release a write hold the watchdogs do not count, and they go
// on: were it the read hold after all, the next renewal finds the lock
// gone and says so, where stopping could let a read hold still held
// expire unannounced.
func (k *keepalives) whichHold(ctx context.Context, op *unlockOp) {
	if op == nil || !op.ask {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, k.release)
	defer cancel()
	mode := backends.Read
	info, ok, err := k.backend.Info(ctx, op.key)
	switch {
	case err != nil:
		k.log.Debug("keepalive: could not tell whether UNLOCK releases a write or a read hold; the watchdog goes on",
			zap.Error(fmt.Errorf("lock info of the key an UNLOCK releases: %w", err)))
		mode = backends.Write
	case ok && info.Mode == backends.Write && len(info.Holders) > 0 && info.Holders[0].Token == op.token:
		mode = backends.Write
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, w := range op.ws {
		w.unlocking[op.mode]--
		w.unlocking[mode]++
	}
	op.mode = mode
}

// endUnlock ends what beginUnlock began; released says one hold was
// released, through the connection with keepalive state ka (nil when it
// has none). The hold taken off is of the kind the UNLOCK released
// (op.mode), and from one count only, as a token's holds of one kind are
// alike on the nodes: ka's own KEEPALIVE hold if it has one; else one an
// ending watchdog counts (takeEndingLocked), which it then does not
// release; else a loose one; else, when another connection holds one of
// w's KEEPALIVE holds of that kind, the lock store is asked how many holds
// of that kind the token has left (holdsLeft), after the release and
// while the UNLOCK still counts as in flight (a renewal that finds nothing
// meanwhile is not taken for a loss): fewer than the watchdog counts, and
// the hold released was one it counts, a KEEPALIVE hold the token's own
// UNLOCK ended (a client's pool releasing through another connection the
// lock it took on one): it is taken off without a word, and the watchdog
// stops with its last; as many or more, and it was one the watchdog does
// not count (taken before it started, or through another instance), so
// every KEEPALIVE hold lives on, renewed while its connection is. Only
// when the lock store cannot answer is the watchdog's guess used: one it
// knows it does not count (watchdog.uncounted: the token held the key when
// it started), else another connection's, which is then told its lock is
// lost (forsakeLocked) rather than left relying, unwarned, on holds no
// watchdog keeps. Ending ones come before a live connection's: a wrong
// guess then costs a lease left to run out, not a hold released or left
// unrenewed under a holder that relies on it. Or none, when no watchdog
// counts one of that kind (the UNLOCK released a hold taken without it).
// A watchdog stops with its last KEEPALIVE hold: loose holds left then
// keep the lease they have.
func (k *keepalives) endUnlock(op *unlockOp, released bool, ka *connKeepalive) {
	if op == nil {
		return
	}
	mode := op.mode
	k.mu.Lock()
	var left holdsAnswer
	for try := 0; k.askLocked(op, ka, released); try++ {
		if !k.waitReleasedLocked(op) {
			// A closed connection's hold is still being released:
			// the answer could not tell whether it had landed.
			break
		}
		asked := op.askedLocked()
		k.mu.Unlock()
		left = k.holdsLeft(op)
		k.mu.Lock()
		if op.askedLocked() == asked {
			break
		}
		// A hold of the token joined, or an UNLOCK of it began, while
		// the lock store answered, before or after the answer: it
		// cannot tell whose hold op released. Asked again, as long as
		// op is still the one to ask, a few times at most.
		left = holdsAnswer{}
		if try == 2 {
			break
		}
	}
	defer k.mu.Unlock()
	var live *watchdog
	for _, w := range op.ws {
		w.unlocking[mode]--
		if released {
			w.unlocks++
		}
		if w.inFlight() == 0 {
			select {
			case w.settled <- struct{}{}:
			default:
			}
			if w.drop != ([2]int{}) {
				// run left them for the UNLOCKs to end (takeDrop).
				select {
				case w.wake <- struct{}{}:
				default:
				}
			}
		}
		if !w.stopped && !w.ending {
			live = w
		}
	}
	if !released {
		if live != nil {
			k.settlePendingLocked(live, mode, left)
		}
		return
	}
	if live != nil {
		if h := live.holders[ka]; h != nil && h.n[mode] > 0 {
			k.takeHolderLocked(live, ka, h, mode)
			k.settlePendingLocked(live, mode, left)
			return
		}
	}
	// An ending watchdog has not counted its holds yet (settle waits for
	// the UNLOCKs in flight), so the one taken off is not released twice;
	// it is not stopped here, as it releases what it counts.
	for _, w := range op.ws {
		if w.ending && !w.stopped && takeEndingLocked(w, ka, mode) {
			return
		}
	}
	if live == nil {
		return
	}
	if live.loose[mode] > 0 {
		live.loose[mode]--
		k.settlePendingLocked(live, mode, left)
		return
	}
	if _, oh := otherHolderLocked(live, nil, mode); oh != nil && live.inFlight() > 0 {
		// Other UNLOCKs of the token are in flight: the holds left
		// cannot tell whose hold this one released until they land.
		live.pending[mode]++
		return
	}
	live.pending[mode]++
	k.settlePendingLocked(live, mode, left)
}

// unlockFoundNothing handles an UNLOCK of key with token, on the
// connection with keepalive state ka, that answered the token holds no
// hold of the key (none on a majority): ka's KEEPALIVE holds of that
// lock, if the watchdog still keeps them, are gone, and it stops keeping
// them, without a notice: the UNLOCK's :0 told the client it did not hold
// the lock, as an UNLOCK in flight answers its caller when a renewal finds
// nothing meanwhile (loseWith). Kept, they would be renewed until a
// renewal found them gone and told the loss to the connection's next lock
// command on the key, after the client let the lock go: a LOCK … TOKEN
// taking it afresh would be answered -LOCKLOST and not run. The watchdog
// goes on for other connections' holds, whose next renewal tells them.
func (k *keepalives) unlockFoundNothing(key, token string, ka *connKeepalive) {
	if ka == nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	w := k.m[heldKey{key, token}]
	if w == nil {
		return
	}
	h := w.holders[ka]
	if h == nil {
		return
	}
	for _, m := range []backends.Mode{backends.Write, backends.Read} {
		for h.n[m] > 0 {
			dropHolderLocked(w, ka, h, m)
		}
	}
	k.noHolderLocked(w)
}

// askedLocked is how many holds of op's kind were counted on op's
// watchdogs, and UNLOCKs begun on them (watchdog.grants, begun). k.mu is
// held.
func (op *unlockOp) askedLocked() [2]uint64 {
	var n [2]uint64
	for _, w := range op.ws {
		n[0] += w.grants[op.mode]
		n[1] += w.begun
	}
	return n
}

// settlePendingLocked attributes w's pending UNLOCKs of mode (see
// watchdog.pending) once none is in flight any more, by left, the lock
// store's count of the token's holds of mode asked for after the last of
// them landed: while fewer are left than w counts, each took one of w's
// KEEPALIVE holds (the token's pool releasing through one connection
// what it locked through another), quietly; the rest released holds w
// does not count. When the lock store could not tell, one w does not
// count is taken first, then a KEEPALIVE hold whose holder is told.
// k.mu is held.
func (k *keepalives) settlePendingLocked(w *watchdog, mode backends.Mode, left holdsAnswer) {
	if w.inFlight() > 0 {
		return
	}
	for ; w.pending[mode] > 0; w.pending[mode]-- {
		if w.stopped {
			w.pending[mode] = 0
			return
		}
		other, oh := otherHolderLocked(w, nil, mode)
		switch {
		case oh == nil:
			// No KEEPALIVE hold of that kind to lose: the one released
			// was one w does not count.
			w.uncounted[mode] = max(w.uncounted[mode]-1, 0)
		case left.known && left.n < int64(w.counted(mode)+w.drop[mode]):
			// Fewer holds left than w counts, with no UNLOCK in
			// flight: the token holds no hold w does not count, and
			// the one released was one of w's KEEPALIVE holds. Those
			// of closed connections w has yet to release are on the
			// nodes too (run releases none while an UNLOCK is in
			// flight, and the question waited for those it was
			// releasing): left out, the hold released would be taken
			// for one w does not count, and w would go on counting a
			// hold its own release of them then ends.
			w.uncounted[mode] = 0
			k.takeHolderLocked(w, other, oh, mode)
		case left.known:
			// As many holds left as w counts: the one released was one
			// w does not count.
			w.uncounted[mode] = max(w.uncounted[mode]-1, 0)
		case w.uncounted[mode] > 0:
			w.uncounted[mode]--
		default:
			k.forsakeLocked(w, other, oh, mode)
		}
	}
}

// otherHolderLocked returns a connection other than ka with a KEEPALIVE
// hold of mode of w, and its holds; nil when none has one. k.mu is held.
func otherHolderLocked(w *watchdog, ka *connKeepalive, mode backends.Mode) (*connKeepalive, *holder) {
	for other, oh := range w.holders {
		if other != ka && oh.n[mode] > 0 {
			return other, oh
		}
	}
	return nil, nil
}

// askLocked reports whether endUnlock is to ask the lock store how many
// holds the token has left after op ended through ka's connection (released
// whether it released a hold): when op is the last UNLOCK of the token in
// flight on the live watchdog of op's key, and either UNLOCKs before it are
// pending (watchdog.pending) or op released a hold and the watchdog counts
// no hold of ka's nor a loose one of that kind, but another connection's
// KEEPALIVE hold. While other UNLOCKs are in flight the answer could not
// tell whose hold each released, and the last one asks. An ending watchdog
// may yet take it; asking then is only time spent. k.mu is held.
func (k *keepalives) askLocked(op *unlockOp, ka *connKeepalive, released bool) bool {
	for _, w := range op.ws {
		if w.stopped || w.ending {
			continue
		}
		if w.inFlight() > 1 {
			return false
		}
		if w.pending[op.mode] > 0 {
			return true
		}
		if !released {
			return false
		}
		if h := w.holders[ka]; (h != nil && h.n[op.mode] > 0) || w.loose[op.mode] > 0 {
			return false
		}
		_, oh := otherHolderLocked(w, ka, op.mode)
		return oh != nil
	}
	return false
}

// holdsAnswer is the lock store's answer to how many holds of a kind a
// token has left; known is false when it could not tell.
type holdsAnswer struct {
	n     int64
	known bool
}

// holdsLeft asks the lock store, within the release bound, how many holds
// of op's kind op's token has of its key, as whichHold asks which kind it
// holds.
func (k *keepalives) holdsLeft(op *unlockOp) holdsAnswer {
	ctx, cancel := context.WithTimeout(context.Background(), k.release)
	defer cancel()
	info, ok, err := k.backend.Info(ctx, op.key)
	if err != nil {
		k.log.Debug("keepalive: could not tell whose hold an UNLOCK on another connection released",
			zap.Error(fmt.Errorf("lock info of the key an UNLOCK released: %w", err)))
		return holdsAnswer{}
	}
	n, known := tokenHolds(info, ok, op.token, op.mode)
	return holdsAnswer{n: n, known: known}
}

// tokenHolds is how many holds of mode token has in info (ok false: the
// key is free); known is false when info cannot tell: a token holding
// the write lock may hold read holds too (a downgrade), which the lock
// store's info does not show.
func tokenHolds(info backends.LockInfo, ok bool, token string, mode backends.Mode) (n int64, known bool) {
	if !ok {
		return 0, true
	}
	if info.Mode == backends.Write {
		// One write holder, and nobody else holds the key.
		if len(info.Holders) == 0 || info.Holders[0].Token != token {
			return 0, true
		}
		if mode == backends.Write {
			return max(info.Holders[0].Holds, 1), true
		}
		return 0, false
	}
	if mode == backends.Write {
		return 0, true
	}
	for _, h := range info.Holders {
		if h.Token == token {
			return max(h.Holds, 1), true
		}
	}
	return 0, true
}

// forsakeLocked takes one hold of mode off ka's KEEPALIVE holds h of w,
// for an UNLOCK on another connection that released a hold w could not
// tell from ka's, the lock store unable to say how many the token has
// left. When that was ka's last, w no longer keeps ka's lock, which may
// still be on the nodes (the hold released may have been one w does not
// count) or gone (it was ka's): ka is told it is lost, as a loss is told,
// rather than left relying on a lock nobody renews. w stops with its last
// KEEPALIVE holder. k.mu is held; neither the push nor the close past the
// notices a connection may keep waiting (tellLost) blocks.
func (k *keepalives) forsakeLocked(w *watchdog, ka *connKeepalive, h *holder, mode backends.Mode) {
	last := h.total() == 1
	k.takeHolderLocked(w, ka, h, mode)
	if last {
		k.tell(w, []owner{{ka, 1, ka.epoch.Load()}}, lostUnlocked, nil,
			"an UNLOCK with its token on another connection released a hold that lockproxy could not tell from this connection's KEEPALIVE hold (the lock store did not answer how many the token has left), which is no longer kept alive")
	}
}

// takeEndingLocked takes one hold of mode off the counts of w, which is
// ending: a loose one, else a closed connection's, else (w was ending
// when Handler.close canceled it, its holders still counted) ka's own
// KEEPALIVE hold, else another connection's. It reports whether w counted
// one. k.mu is held.
func takeEndingLocked(w *watchdog, ka *connKeepalive, mode backends.Mode) bool {
	switch {
	case w.loose[mode] > 0:
		w.loose[mode]--
		return true
	case w.drop[mode] > 0:
		w.drop[mode]--
		return true
	}
	if h := w.holders[ka]; h != nil && h.n[mode] > 0 {
		dropHolderLocked(w, ka, h, mode)
		return true
	}
	for other, oh := range w.holders {
		if oh.n[mode] > 0 {
			dropHolderLocked(w, other, oh, mode)
			return true
		}
	}
	return false
}

// takeHolderLocked takes one hold of mode off ka's KEEPALIVE holds of w,
// stopping w with its last KEEPALIVE hold. k.mu is held.
func (k *keepalives) takeHolderLocked(w *watchdog, ka *connKeepalive, h *holder, mode backends.Mode) {
	dropHolderLocked(w, ka, h, mode)
	k.noHolderLocked(w)
}

// noHolderLocked stops w when it has no KEEPALIVE holder left. k.mu is
// held.
func (k *keepalives) noHolderLocked(w *watchdog) {
	if len(w.holders) == 0 {
		// Holds of connections that closed while a renewal ran wait in
		// drop for w's goroutine, which stopping ends without a release:
		// they are released here, or they would stay held by nobody
		// until their lease ran out.
		drop := w.drop
		w.drop = [2]int{}
		k.stopLocked(w)
		if drop != ([2]int{}) {
			k.leavingLocked(w, drop)
			k.wg.Add(1)
			go func() {
				defer k.wg.Done()
				k.releaseLeaving(w, drop)
			}()
		}
	}
}

// dropHolderLocked takes one hold of mode off ka's KEEPALIVE holds h of
// w, and ka off w with its last. k.mu is held.
func dropHolderLocked(w *watchdog, ka *connKeepalive, h *holder, mode backends.Mode) {
	if h.n[mode]--; h.total() == 0 {
		h.stop()
		delete(w.holders, ka)
		ka.live.Add(-1)
	}
}

// stopLocked takes w out of the registry and wakes its goroutine, which
// then ends without a release. k.mu is held.
func (k *keepalives) stopLocked(w *watchdog) bool {
	if w.stopped {
		return false
	}
	w.stopped = true
	k.detachLocked(w)
	k.settledLocked(w)
	for ka, h := range w.holders {
		h.stop()
		ka.live.Add(-1)
	}
	w.cancel()
	return true
}

// endingLocked marks w ending: out of the registry, so that it takes no
// new hold, but in k.ending, so that UNLOCKs still count on it. k.mu is
// held.
func (k *keepalives) endingLocked(w *watchdog) {
	if w.ending || w.stopped {
		return
	}
	w.ending = true
	k.detachLocked(w)
	hk := heldKey{w.key, w.token}
	k.ending[hk] = append(k.ending[hk], w)
}

// settledLocked takes w out of k.ending: it counted its holds, and an
// UNLOCK begun now is not its to count. k.mu is held.
func (k *keepalives) settledLocked(w *watchdog) {
	hk := heldKey{w.key, w.token}
	ws := k.ending[hk]
	for i, e := range ws {
		if e == w {
			ws = append(ws[:i:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(k.ending, hk)
	} else {
		k.ending[hk] = ws
	}
}

// detachLocked takes w out of the registry, unless a watchdog started
// since w began ending holds its place. k.mu is held.
func (k *keepalives) detachLocked(w *watchdog) {
	if hk := (heldKey{w.key, w.token}); k.m[hk] == w {
		delete(k.m, hk)
	}
}

// alive reports whether any connection holding w showed life within the
// idle window.
func (k *keepalives) alive(w *watchdog, now time.Time) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	for ka := range w.holders {
		if ka.alive(now, k.idle) {
			return true
		}
	}
	return false
}

// takeDrop returns the holds of closed connections, by kind, that w's
// goroutine is to release now, counted in w.releasing until it is done
// (releasedDrop). None while an UNLOCK of w's key and token is in
// flight: it may yet ask the lock store how many holds the token has
// left, whose answer could not tell whether a release begun meanwhile had
// landed; the last of them wakes w to release them (endUnlock).
func (k *keepalives) takeDrop(w *watchdog) [2]int {
	k.mu.Lock()
	defer k.mu.Unlock()
	if w.stopped || w.inFlight() > 0 {
		return [2]int{}
	}
	n := w.drop
	w.drop = [2]int{}
	for m := range n {
		w.releasing[m] += n[m]
	}
	k.leavingLocked(w, n)
	return n
}

// releaseDrop releases the holds of w's closed connections (takeDrop).
func (k *keepalives) releaseDrop(w *watchdog) {
	n := k.takeDrop(w)
	if n == ([2]int{}) {
		return
	}
	k.releaseLeaving(w, n)
	k.mu.Lock()
	defer k.mu.Unlock()
	for m := range n {
		w.releasing[m] -= n[m]
	}
	select {
	case w.released <- struct{}{}:
	default:
	}
}

// waitReleasedLocked waits, within the release bound, until no live
// watchdog of op's is releasing a closed connection's holds (takeDrop):
// the lock store's count of the holds left is then taken after those
// releases landed, and none begins before op ends. It reports false when
// the bound ran out first. k.mu is held, and released while it waits.
func (k *keepalives) waitReleasedLocked(op *unlockOp) bool {
	var bound *time.Timer
	defer func() {
		if bound != nil {
			bound.Stop()
		}
	}()
	for _, w := range op.ws {
		for !w.stopped && !w.ending && w.releasing != ([2]int{}) {
			if bound == nil {
				bound = time.NewTimer(k.release)
			}
			k.mu.Unlock()
			select {
			case <-w.released:
				k.mu.Lock()
			case <-bound.C:
				k.mu.Lock()
				return false
			}
		}
	}
	return true
}

// shuttingDown records that the server is shutting down: the connections
// it closes release their locks, none is kept for its lock-delay
// ("On shutdown lockproxy releases every keepalive lock").
func (k *keepalives) shuttingDown() {
	k.mu.Lock()
	k.shutdown = true
	k.mu.Unlock()
}

// close stops every watchdog and waits for them, each releasing its lock
// within the release bound.
func (k *keepalives) close() {
	k.mu.Lock()
	k.closed = true
	for _, w := range k.m {
		w.cancel()
	}
	k.mu.Unlock()
	k.wg.Wait()
}

// count is the number of running watchdogs.
func (k *keepalives) count() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.m)
}

// run is w's goroutine: it renews every ttl/3 while a holder is alive,
// releases the holds of holders whose connection closed, and ends when ctx
// is done (release, unless UNLOCK stopped it), when the lock is lost, or
// when MAXHOLD runs out.
func (k *keepalives) run(ctx context.Context, w *watchdog) {
	defer func() {
		k.active.Dec()
		k.wg.Done()
	}()
	period := w.ttl / 3
	// A renewal that errs (a node timeout, no quorum this time) is tried
	// again while the lease it would extend has time left: one slow moment
	// on a busy host should not cost the lock. lastOK is when the last
	// successful renewal (or the grant's granting attempt) was sent; its
	// lease runs ttl from then, less a tenth kept as margin for drift and
	// the grant's own time. Not from when the watchdog starts, after the
	// grant's reply: a slow grant's lease began long before that.
	lastOK := w.sent
	// validEnd is when the validity the lock store last answered ends:
	// the grant's, then each successful renewal's, counted from when it
	// was sent. It may be far below ttl (ZooKeeper caps it by the
	// session's horizon), and the lease may end with it: a failed renewal
	// is tried again only while another try ends before it, and no try
	// runs past it, so that a loss is told within the last validity
	// answered, before a rival elsewhere can be granted the lock.
	validEnd := w.sent.Add(w.validity)
	retry := max(period/6, 10*time.Millisecond)
	// The first renewal comes within the validity the grant told, however
	// short (a slow grant's): the holder relies on the lock until told it
	// is lost, and the lease may end when that validity does. Halfway
	// leaves the renewal the other half to get through.
	t := time.NewTimer(renewAfter(period, w.validity))
	defer t.Stop()
	due := time.Now().Add(renewAfter(period, w.validity)) // when t fires
	reset := func(d time.Duration) {
		due = time.Now().Add(d)
		t.Reset(d)
	}
	final := false // MAXHOLD: no more renewals; the lease ends at the deadline
	for {
		select {
		case <-ctx.Done():
			k.ended(w)
			return
		case <-w.wake:
			k.releaseDrop(w)
			// A grant that joined may have brought the deadline
			// nearer (its MAXHOLD).
			if deadline, _ := k.deadlineOf(w); !deadline.IsZero() && deadline.Before(due) {
				reset(max(time.Until(deadline), 0))
			}
			// A RENEW of the key and token may have shortened the
			// lease: its validity is the last answered, and the next
			// renewal comes within half of it. A RENEW that answered an
			// error may have shortened it as well, to the lease it
			// asked for: the next renewal comes within half of what it
			// may have left, and no try runs past it. Also in MAXHOLD's
			// last stretch, where w renews no more for a lease of its
			// own: the holder relies on the lock until told it is
			// lost, and the timer decides again whether to renew for
			// what is left of the hold or to tell the loss at the end
			// of the validity last answered.
			end, undecided := k.takeRenewed(w)
			switch {
			case undecided.IsZero():
			case !end.IsZero():
				// Which of them landed last cannot be told.
				end = earlier(end, undecided)
			case undecided.Before(validEnd):
				// One that asked for more may have lengthened the
				// lease, or not been applied: it ends no sooner.
				end = undecided
			}
			if !end.IsZero() {
				validEnd = end
				final = false
				if d := max(time.Until(end)/2, 0); time.Now().Add(d).Before(due) {
					reset(d)
				}
			}
			continue
		case <-t.C:
		}
		if ctx.Err() != nil {
			// The timer and the end came together: the end wins, or
			// the holds of a closed connection would be taken for lost.
			k.ended(w)
			return
		}
		now := time.Now()
		deadline, maxHold := k.deadlineOf(w)
		if !deadline.IsZero() && (final || !now.Before(deadline)) {
			k.maxHoldReached(w, "MAXHOLD of "+strconv.FormatInt(maxHold.Milliseconds(), 10)+" ms reached")
			return
		}
		if !k.alive(w, now) {
			k.lose(w, lostIdle, "the connection sent no command for "+k.idle.String()+" (locks.keepalive_idle)")
			return
		}
		ttl := w.ttl
		if !deadline.IsZero() {
			left := deadline.Sub(now)
			if left <= period && (left <= retry || time.Until(validEnd) >= left/2) {
				// The renewals never asked for a lease past the
				// deadline (each for at most what was left of it), and
				// never shorten one: the lease w asked for ends by the
				// deadline. A rival may be granted the key as soon as
				// it does, so the loss is told, as a failed renewal's
				// is, by the end of the validity last answered, which
				// ends before that lease: not at the deadline itself,
				// where a rival could be granted first. While that
				// validity ends well before the deadline (ZooKeeper's,
				// capped by the session's horizon), w renews on, for
				// what is left, rather than end the hold that early.
				final = true
				reset(max(min(left, time.Until(validEnd)), 0))
				continue
			}
			ttl = min(ttl, left)
		}
		sent, from, validity, err := k.renew(ctx, w, ttl, validEnd)
		// Whether the lease, and the validity last answered, have time
		// left for another try.
		canRetry := time.Now().Add(retry + period).Before(earlier(lastOK.Add(w.ttl-w.ttl/10), validEnd))
		switch {
		case ctx.Err() != nil:
			k.ended(w)
			return
		case err != nil && canRetry:
			reset(retry)
			continue
		case err != nil:
			why := "a renewal failed"
			if errors.Is(err, quorum.ErrNoQuorum) {
				why = "a renewal did not reach a quorum of nodes"
			} else if errors.Is(err, context.DeadlineExceeded) {
				why = "a renewal timed out"
			}
			k.loseWith(w, lostRenewFailed, why, err, false)
			return
		case validity <= 0 && canRetry && k.unlockInFlight(w):
			// An UNLOCK in flight may have released what the renewal
			// looked for: whether a hold w still keeps is gone is known
			// once it has ended (and taken its hold off, or stopped w).
			reset(retry)
			continue
		case validity <= 0:
			k.lose(w, lostRenewFailed, "a renewal found it no longer held")
			return
		}
		lastOK = sent
		// The validity counts from when the nodes measured it (from),
		// not from when the renewal was sent: counted from then, a
		// renewal that waited long in the nodes' queues on a busy host
		// lost that wait twice, and the next one, due within half of
		// what was left, had that much less time to get through.
		validEnd = later(validEnd, from.Add(validity))
		k.renewedTo(w, sent.Add(ttl))
		k.held.raised(w.key, w.token, ttl)
		reset(spread(renewAfter(period, time.Until(from.Add(validity)))))
	}
}

// takeRenewed returns, once, the end of the validity a RENEW of w's key
// and token answered since the last call (watchdog.renewed), and the
// earliest end of a lease a RENEW that answered an error may have set
// (watchdog.undecided); zero for none.
func (k *keepalives) takeRenewed(w *watchdog) (end, undecided time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	end, undecided = w.renewed, w.undecided
	w.renewed, w.undecided = time.Time{}, time.Time{}
	return end, undecided
}

// deadlineOf returns w's MAXHOLD deadline (zero for none) and the MAXHOLD
// that set it.
func (k *keepalives) deadlineOf(w *watchdog) (time.Time, time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return w.deadline, w.maxHold
}

// renewedTo records that a renewal of w asked for a lease until end.
func (k *keepalives) renewedTo(w *watchdog, end time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	w.askedEnd = later(w.askedEnd, end)
}

// maxHoldReached ends w at its MAXHOLD deadline: lost, for every holder,
// as MAXHOLD's end is told. The lease w's renewals asked for ends by the
// deadline (each asked for no more than was left of it), and renewals
// never shorten a lease: the lock is free then unless another hold of the
// token has lease left, which its holder was told of. Only when a grant
// that joined brought the deadline nearer than a lease asked for before
// (askedEnd), and no lock-delay applies, does w release the KEEPALIVE
// holds it counts (not the loose ones, whose holders were told a lease of
// their own), once the validity told to each has ended (toldEnd), as
// the connection's close releases them.
func (k *keepalives) maxHoldReached(w *watchdog, why string) {
	k.mu.Lock()
	now := time.Now()
	release := !w.stopped && k.delayFor(w.key) <= 0 && !now.Before(w.toldEnd) &&
		w.askedEnd.After(now.Add(w.ttl/10+10*time.Millisecond))
	if !release {
		k.mu.Unlock()
		k.lose(w, lostMaxHold, why)
		return
	}
	// Out of the registry first, so that no grant joins w once its
	// holders are told: a hold granted now gets a watchdog of its own.
	k.endingLocked(w)
	owners := w.owners()
	k.mu.Unlock()
	k.tell(w, owners, lostMaxHold, nil, why)
	holds, _, _, ok := k.settle(w)
	if ok {
		k.releaseLeaving(w, holds)
	}
}

// renew renews the holds w keeps, of the kind it renews
// (watchdog.renewMode), with ttl, each try before validEnd (the end of
// the validity last answered); sent is when the renewal answered was
// sent, and its validity counts from from. Renewals are per kind, and UNLOCK releases a
// write hold before a read hold: a renewal of a write hold that an UNLOCK
// released meanwhile finds none though w may still keep a read hold. So a
// renewal that finds nothing is tried again at once when what w keeps
// may have changed since it was sent: with the kind w now renews, when an
// UNLOCK ended since or that kind changed; with the read hold w keeps,
// when it found no write hold while an UNLOCK is in flight (which takes
// the write hold off w's counts only when it ends). Only a renewal of the
// kind w still keeps that finds nothing, with no UNLOCK since, is left to
// run to take for a loss. Each try again needs an UNLOCK or a change of
// kind since the last, or is the one read try, so the tries are bounded.
func (k *keepalives) renew(ctx context.Context, w *watchdog, ttl time.Duration, validEnd time.Time) (sent, from time.Time, validity time.Duration, err error) {
	k.mu.Lock()
	want, seen := w.renewMode(), w.unlocks
	k.mu.Unlock()
	mode := want
	for {
		sent = time.Now()
		// No try runs past the validity last answered (validEnd): an
		// answer after it comes too late to spare the holder a loss
		// told after the lease may have ended. Until then it may take
		// all of it: a renewal is not an acquisition, and what it
		// answers counts from when the nodes were asked, so a slow
		// answer is a safe one. Cut at the node timeout (or at a
		// period), on a host too busy to answer within it most
		// renewals failed with most of their validity left, and most
		// KEEPALIVE locks were lost at once
		// (TestKeepaliveRenewalsSurviveOverload).
		rctx, cancel := context.WithDeadline(ctx, validEnd)
		validity, from, err = backends.RenewHoldFrom(rctx, k.backend, w.key, w.token, mode, ttl)
		cancel()
		if err != nil || validity > 0 || ctx.Err() != nil {
			return sent, from, validity, err
		}
		k.mu.Lock()
		now, unlocks := w.renewMode(), w.unlocks
		readLeft := mode == backends.Write && w.inFlight() > 0 && w.holds()[backends.Read] > 0
		k.mu.Unlock()
		switch {
		case now != want || unlocks != seen:
			want, seen, mode = now, unlocks, now
		case readLeft:
			mode = backends.Read
		default:
			return sent, from, validity, err
		}
	}
}

// unlockInFlight reports whether an UNLOCK of w's key and token is in
// flight.
func (k *keepalives) unlockInFlight(w *watchdog) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return w.inFlight() > 0
}

// renewAfter is how long after a grant's or a renewal's reply, which told
// validity, a watchdog renewing every period renews next: period, or half
// the validity when that is sooner (a slow reply's); never negative.
func renewAfter(period, validity time.Duration) time.Duration {
	return max(min(period, validity/2), 0)
}

// spread is d less up to an eighth of it, at random: renewals due within
// d may come sooner, never later. Watchdogs granted or renewed together
// (a burst of grants, or every renewal answered in one batch after a
// stall) would otherwise stay together, and their renewals reach the
// nodes' writers in bursts that wait in the queues behind each other.
func spread(d time.Duration) time.Duration {
	if d < 8 {
		return d
	}
	return d - rand.N(d/8)
}

// ended handles w's context being done: UNLOCK stopped it (nothing to do),
// or the connection closed (release, or the lock-delay) or the server is
// shutting down (release: its holder did not lose it). It releases the
// KEEPALIVE holds counted once no UNLOCK is in flight (settle); none is
// added once w is ending (holderGone). The loose holds (granted without
// KEEPALIVE, on connections that may still be open) are not released:
// each holder was told a validity of its own and relies on it until then,
// and no UNLOCK of theirs came. They keep what lease the nodes have, which
// is at least the one each was told, as w's renewals only raise a lease
// (backends.HoldKeeper.RenewHold), and runs out on its own.
func (k *keepalives) ended(w *watchdog) {
	holds, mode, shutdown, ok := k.settle(w)
	if !ok {
		return
	}
	if !shutdown && k.delayLock(w, mode) {
		k.left(w, holds, false)
		return
	}
	k.releaseLeaving(w, holds)
}

// settle stops w, which is ending, and returns the holds it is to
// release (its KEEPALIVE holds only: the loose ones keep their lease), the
// kind it renewed, and whether the server is shutting down; ok is false when w
// was stopped already. An UNLOCK in flight releases
// one of the token's holds, alike on the nodes, and endUnlock takes it
// off w's counts; counted before that, it would be released twice, and
// the second release would take a hold granted since to a live
// connection. So settle waits, within the release bound, until none is
// in flight; past the bound it leaves one hold unreleased for each still
// in flight, whose lease then runs out on its own.
func (k *keepalives) settle(w *watchdog) (holds [2]int, mode backends.Mode, shutdown, ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if w.stopped {
		return holds, mode, false, false
	}
	// Handler.close canceled it in the registry: it takes no new hold
	// from now, but UNLOCKs still count on it.
	k.endingLocked(w)
	if w.inFlight() > 0 {
		bound := time.NewTimer(k.release)
		defer bound.Stop()
	wait:
		for w.inFlight() > 0 && !w.stopped {
			k.mu.Unlock()
			select {
			case <-w.settled:
				k.mu.Lock()
			case <-bound.C:
				k.mu.Lock()
				break wait
			}
		}
		if w.stopped {
			return holds, mode, false, false
		}
	}
	holds, mode = w.holds(), w.renewMode()
	for m := range holds {
		holds[m] -= w.loose[m]
	}
	for m := range holds {
		// An UNLOCK pending (watchdog.pending) when w began ending
		// released a hold that may have been one w counts: the last
		// one in flight ended on an ending w, which cannot tell (a
		// hold of the token granted since is on the nodes too), so it
		// is not released again; its lease runs out on its own.
		holds[m] -= min(w.pending[m], holds[m])
	}
	for _, m := range []backends.Mode{backends.Write, backends.Read} {
		// An UNLOCK taken to release one kind may release the other
		// (whichHold could not tell): take any left off the other.
		left := w.unlocking[m]
		for _, n := range []backends.Mode{m, 1 - m} {
			d := min(left, holds[n])
			holds[n] -= d
			left -= d
		}
	}
	shutdown = k.shutdown || k.closed
	k.stopLocked(w)
	k.leavingLocked(w, holds) // for the caller to release (releaseLeaving) or leave (left)
	return holds, mode, shutdown, true
}

// delayLock applies the key's lock-delay to w's lock, which its holder
// lost without releasing, and leaves the lease to run out, so nobody gets
// the key meanwhile (a holder that was only paused may still be acting on
// it). The lease is raised to the delay, never shortened (RenewHold), so
// the key may stay until the lease w's last renewal asked for ends, up to
// a TTL past the delay. Setting it exactly would be shorter but is not
// safe: a grant of the same token on another connection (a reentry, or a
// RENEW) can land on the nodes as w ends, after any check w could make
// here, and its holder is told of a lease that an exact set would cut
// (commands TestLockDelayKeepsRacingReentrantGrant). mode is the kind of
// hold w renewed (watchdog.renewMode). It reports whether a delay
// applies; if setting it fails the lease runs out on its own.
func (k *keepalives) delayLock(w *watchdog, mode backends.Mode) bool {
	delay := k.delayFor(w.key)
	if delay <= 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), k.release)
	defer cancel()
	validity, err := backends.RenewHold(ctx, k.backend, w.key, w.token, mode, delay)
	switch {
	case err != nil:
		k.log.Warn("keepalive: setting the lock-delay failed; the lease will expire on its own",
			zap.Duration("delay", delay), zap.Error(err))
	case validity > 0:
		k.delayed.Inc()
		k.held.raised(w.key, w.token, delay)
	}
	return true
}

// releaseHolds releases up to holds[m] holds of each kind m of w's lock,
// each of its own kind: the token's holds of a kind w does not count (a
// downgrade's write hold taken without KEEPALIVE) are not w's to end. All
// run within the release bound. It runs on w's goroutine (or, for a lock
// granted while the handler closes, on the connection's), never in
// Handler.Closed.
func (k *keepalives) releaseHolds(w *watchdog, holds [2]int) {
	if holds == ([2]int{}) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), k.release)
	defer cancel()
	for _, mode := range []backends.Mode{backends.Write, backends.Read} {
		for i := 0; i < holds[mode]; i++ {
			ok, err := backends.UnlockHold(ctx, k.backend, w.key, w.token, mode)
			if err != nil {
				k.log.Warn("keepalive: release failed; the lease will expire on its own",
					zap.Duration("ttl", w.ttl), zap.Error(fmt.Errorf("release of a %v hold: %w", mode, err)))
				return
			}
			if !ok {
				break
			}
			k.held.releasedHold(w.key, w.token, mode)
		}
	}
}

// owner is a KEEPALIVE holder of a watchdog's lock, how many holds of
// it it has, and its connection's epoch when they were counted (a RESET
// since ended them: connReset).
type owner struct {
	ka    *connKeepalive
	holds int
	epoch uint64
}

// owners are w's KEEPALIVE holders. k.mu is held.
func (w *watchdog) owners() []owner {
	owners := make([]owner, 0, len(w.holders))
	for ka, h := range w.holders {
		owners = append(owners, owner{ka, h.total(), ka.epoch.Load()})
	}
	return owners
}

// tell tells owners that w's lock was lost, for reason r: the notice for
// each one's next lock command on the key with w's token, a RESP3 push,
// and the metric, counted once every owner has been told. The log line
// says why, and with cause (a failed renewal's error: on RedLock each
// node's, such as "0/3 nodes: 127.0.0.1:6379 timeout, …") what went wrong
// where: the holders are told only that a renewal failed, and without the
// nodes' errors an operator could not tell a slow node from an
// overloaded instance.
func (k *keepalives) tell(w *watchdog, owners []owner, r lostReason, cause error, why string) {
	for _, o := range owners {
		o.ka.tellLostAt(o.epoch, w.key, w.token, why, o.holds)
	}
	k.lost[r].Inc()
	fields := []zap.Field{zap.String("reason", r.label()), zap.String("why", why), zap.Duration("ttl", w.ttl)}
	if cause != nil {
		fields = append(fields, zap.Error(cause))
	}
	k.log.Info("keepalive lock lost", fields...)
}

// lostByBackend ends the watchdog of key held by token, if one runs, as
// lost: the backend learned the lock is gone (backends.LossNotifier).
func (k *keepalives) lostByBackend(key, token string) {
	k.mu.Lock()
	w := k.m[heldKey{key, token}]
	k.mu.Unlock()
	if w != nil {
		k.loseWith(w, lostRenewFailed, "the lock store reported it lost (ZooKeeper session expired)", nil, true)
	}
}

// lose ends w as lost: the metric, the notice for each holder's next lock
// command on the key, and a RESP3 push.
func (k *keepalives) lose(w *watchdog, r lostReason, why string) {
	k.loseWith(w, r, why, nil, false)
}

// loseWith is lose; cause is the last renewal's error, if any, for the
// log; byBackend says the lock store itself reported the loss.
func (k *keepalives) loseWith(w *watchdog, r lostReason, why string, cause error, byBackend bool) {
	k.mu.Lock()
	if w.stopped {
		k.mu.Unlock()
		return
	}
	// An UNLOCK in flight answers its caller for the hold it releases: a
	// renewal that found nothing because of it is no loss to tell. Only
	// when the UNLOCKs in flight account for every hold kept, though: the
	// other holders' holds were lost, and each must hear of it. A loss the
	// lock store reported is never quiet.
	quiet := false
	if r == lostRenewFailed && !byBackend {
		held := w.holds()
		quiet = w.inFlight() > 0 && w.inFlight() >= held[backends.Write]+held[backends.Read]
	}
	owners := w.owners()
	mode := w.renewMode()
	k.stopLocked(w)
	k.mu.Unlock()
	if quiet {
		return
	}
	k.tell(w, owners, r, cause, why)
	if r != lostRenewFailed {
		// Lost without a release: the holder may still act on it.
		k.delayLock(w, mode)
	}
}
