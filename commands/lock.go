package commands

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/relay"
	"github.com/lockproxy/lockproxy/resp"
)

// Errors of argument parsing, with Redis's texts where Redis has one.
var (
	errSyntax        = errors.New("ERR syntax error")
	errNotInteger    = errors.New("ERR value is not an integer or out of range")
	errEmptyKey      = errors.New("ERR empty key: lock keys must be at least one byte")
	errEmptyToken    = errors.New("ERR empty token")
	errKeyTooLong    = errors.New("ERR key too long")
	errTokenTooLong  = errors.New("ERR token too long")
	errTokenReserved = errors.New("ERR tokens starting with \\x00lockproxy: are reserved")
)

func errInvalidExpire(cmd string) error {
	return errors.New("ERR invalid expire time in '" + cmd + "' command")
}

// lockArgs is a parsed LOCK or RLOCK.
type lockArgs struct {
	key       []byte
	ttl       time.Duration
	ttlSet    bool
	wait      time.Duration
	token     []byte
	keepalive bool          // KEEPALIVE given, or implied by no PX/EX
	maxHold   time.Duration // MAXHOLD; 0 for none
}

// parseTTL reads the value of PX (ms) or EX (s).
func parseTTL(v []byte, unit time.Duration, cmd string) (time.Duration, error) {
	n, ok := resp.ParseInt(v)
	if !ok {
		return 0, errNotInteger
	}
	if n <= 0 || n > int64(1<<62)/int64(unit) {
		return 0, errInvalidExpire(cmd)
	}
	return time.Duration(n) * unit, nil
}

// parseLock parses `LOCK key [ms] [PX ms | EX s] [WAIT ms] [TOKEN t]
// [KEEPALIVE] [MAXHOLD ms]`. A bare integer right after the key is a TTL in
// ms. Without a TTL the lock gets the default lease and KEEPALIVE; MAXHOLD
// caps a keepalive lock's whole hold and may not be below its TTL.
func (l *Limits) parseLock(cmd string, args [][]byte) (lockArgs, error) {
	var a lockArgs
	a.key = args[1]
	if err := l.checkKey(a.key); err != nil {
		return a, err
	}
	rest := args[2:]
	if len(rest) > 0 {
		if _, ok := resp.ParseInt(rest[0]); ok {
			ttl, err := parseTTL(rest[0], time.Millisecond, cmd)
			if err != nil {
				return a, err
			}
			a.ttl, a.ttlSet = ttl, true
			rest = rest[1:]
		}
	}
	waitSet := false
	for i := 0; i < len(rest); i++ {
		opt := rest[i]
		switch {
		case resp.EqualFold(opt, "KEEPALIVE"):
			a.keepalive = true
			continue
		case i+1 >= len(rest):
			return a, errSyntax
		}
		v := rest[i+1]
		i++
		var err error
		switch {
		case resp.EqualFold(opt, "PX"), resp.EqualFold(opt, "EX"):
			if a.ttlSet {
				return a, errSyntax
			}
			unit := time.Millisecond
			if resp.EqualFold(opt, "EX") {
				unit = time.Second
			}
			a.ttl, err = parseTTL(v, unit, cmd)
			a.ttlSet = true
		case resp.EqualFold(opt, "WAIT"):
			if waitSet {
				return a, errSyntax
			}
			n, ok := resp.ParseInt(v)
			switch {
			case !ok:
				err = errNotInteger
			case n < 0:
				err = errors.New("ERR WAIT must not be negative")
			case time.Duration(n)*time.Millisecond > l.MaxWait || n > int64(l.MaxWait/time.Millisecond):
				err = errors.New("ERR WAIT " + strconv.FormatInt(n, 10) + " ms is above the maximum of " +
					strconv.FormatInt(l.MaxWait.Milliseconds(), 10) + " ms (locks.max_wait)")
			}
			a.wait, waitSet = time.Duration(n)*time.Millisecond, true
		case resp.EqualFold(opt, "TOKEN"):
			if a.token != nil {
				return a, errSyntax
			}
			err = l.checkToken(v)
			a.token = v
		case resp.EqualFold(opt, "MAXHOLD"):
			if a.maxHold != 0 {
				return a, errSyntax
			}
			a.maxHold, err = parseTTL(v, time.Millisecond, cmd)
			if err != nil && err != errNotInteger {
				err = errors.New("ERR invalid MAXHOLD in '" + cmd + "' command")
			}
		default:
			return a, errSyntax
		}
		if err != nil {
			return a, err
		}
	}
	if !a.ttlSet {
		a.ttl = l.DefaultTTL
		a.keepalive = true
	}
	if err := l.checkTTL(a.ttl); err != nil {
		return a, err
	}
	switch {
	case a.maxHold == 0:
	case !a.keepalive:
		return a, errors.New("ERR MAXHOLD applies to KEEPALIVE locks only")
	case a.maxHold < a.ttl:
		return a, errors.New("ERR MAXHOLD " + strconv.FormatInt(a.maxHold.Milliseconds(), 10) +
			" ms is below the lock's TTL of " + strconv.FormatInt(a.ttl.Milliseconds(), 10) + " ms")
	}
	return a, nil
}

func (l *Limits) checkKey(k []byte) error {
	switch {
	case len(k) == 0:
		return errEmptyKey
	case l.MaxKeyBytes > 0 && len(k) > l.MaxKeyBytes:
		return errKeyTooLong
	}
	return nil
}

// reservedTokenPrefix starts the values backends keep in lock keys for
// their own use (the RedLock backend's read marker).
const reservedTokenPrefix = "\x00lockproxy:"

func (l *Limits) checkToken(t []byte) error {
	switch {
	case len(t) == 0:
		return errEmptyToken
	case bytes.HasPrefix(t, []byte(reservedTokenPrefix)):
		return errTokenReserved
	case l.MaxTokenBytes > 0 && len(t) > l.MaxTokenBytes:
		return errTokenTooLong
	}
	return nil
}

// checkKeyToken checks the key and token of UNLOCK and RENEW.
func (l *Limits) checkKeyToken(k, t []byte) error {
	if err := l.checkKey(k); err != nil {
		return err
	}
	return l.checkToken(t)
}

func (l *Limits) checkTTL(ttl time.Duration) error {
	if l.MaxTTL > 0 && ttl > l.MaxTTL {
		return errors.New("ERR TTL " + strconv.FormatInt(ttl.Milliseconds(), 10) + " ms is above the maximum of " +
			strconv.FormatInt(l.MaxTTL.Milliseconds(), 10) + " ms (locks.max_ttl)")
	}
	if ttl < l.MinTTL {
		return errors.New("ERR TTL " + strconv.FormatInt(ttl.Milliseconds(), 10) + " ms is below the minimum of " +
			strconv.FormatInt(l.MinTTL.Milliseconds(), 10) + " ms (locks.min_ttl)")
	}
	return nil
}

func (h *Handler) rlock(s *resp.Session, args [][]byte) {
	a, err := h.limits.parseLock("rlock", args)
	if err != nil {
		s.W.Error(err.Error())
		return
	}
	if h.lockLost(s, a.key, a.token) {
		return
	}
	h.acquire(s, "rlock", a, backends.Read)
}

func (h *Handler) lock(s *resp.Session, args [][]byte) {
	a, err := h.limits.parseLock("lock", args)
	if err != nil {
		s.W.Error(err.Error())
		return
	}
	if h.lockLost(s, a.key, a.token) {
		return
	}
	h.acquire(s, "lock", a, backends.Write)
}

// lockLost answers a LOCK/RLOCK of key with TOKEN token with LOCKLOST,
// once, when this connection's keepalive lock on key held by token was
// lost since its last lock command on it; the command itself is not run
// (UNLOCK and RENEW: beginLockCmd). A command with another token is about
// another hold, which must not be left held (or unrenewed) for a loss
// that is not its own. A LOCK or RLOCK without
// TOKEN (token nil) is answered for a loss of any token's lock on key,
// as "the first lock command on a key whose keepalive lock was lost".
func (h *Handler) lockLost(s *resp.Session, key, token []byte) bool {
	c, ok := s.Data.(*conn)
	if !ok || c.ka == nil {
		return false
	}
	var why string
	var lost bool
	if token == nil {
		why, lost = c.ka.takeLost(key)
	} else {
		why, lost = c.ka.takeLostToken(key, token)
	}
	if !lost {
		return false
	}
	writeLost(s, key, why)
	return true
}

// writeLost answers a lock command for key with the notice that its
// keepalive lock was lost, for why.
func writeLost(s *resp.Session, key []byte, why string) {
	s.W.Error("LOCKLOST lock on '" + relay.Clip(string(key)) + "' was lost: " + why)
}

// beginLockCmd begins an UNLOCK (unlock) or RENEW of key with token on a
// connection with keepalive state (else there is nothing to tell it):
// when the lock's loss waits to be told, it answers -LOCKLOST and reports
// true, and the command does not run; else a loss told while it runs is
// answered by endLockCmd.
func beginLockCmd(s *resp.Session, key, token []byte, unlock bool) bool {
	c, ok := s.Data.(*conn)
	if !ok || c.ka == nil {
		return false
	}
	why, lost := c.ka.beginCmd(key, token, unlock)
	if lost {
		writeLost(s, key, why)
	}
	return lost
}

// endLockCmd ends what beginLockCmd began (released: an UNLOCK released a
// hold). When the lock was lost while the command ran, it answers
// -LOCKLOST for the command, whatever it did, and reports true: the
// command was the connection's next on the lock, and the notice must not
// wait for the one after it.
func endLockCmd(s *resp.Session, key []byte, released bool) bool {
	c, ok := s.Data.(*conn)
	if !ok || c.ka == nil {
		return false
	}
	why, lost := c.ka.endCmd(released)
	if lost {
		writeLost(s, key, why)
	}
	return lost
}

// connKeepalive returns the connection's keepalive state, made on first
// use, with its RESP version brought up to date.
func (h *Handler) connKeepalive(s *resp.Session) *connKeepalive {
	c := state(s)
	if c.ka == nil {
		c.ka = newConnKeepalive(s.LastActive, s.PushHeld, s.Close, s.W.Proto())
	} else {
		c.ka.proto.Store(int32(s.W.Proto()))
	}
	return c.ka
}

func (h *Handler) acquire(s *resp.Session, cmd string, a lockArgs, mode backends.Mode) {
	if a.keepalive {
		if err := h.keepalive.full(state(s).ka); err != nil {
			s.W.Error(err.Error())
			return
		}
	}
	token := newToken()
	if a.token != nil {
		token = string(a.token)
	}
	// A token made here cannot hold the key already: the backend need not
	// look for a hold to join, and no other request uses it (OwnToken).
	req := backends.LockRequest{Key: string(a.key), Token: token, TTL: a.ttl, Wait: a.wait, Mode: mode, NoReentry: a.token == nil,
		OwnToken: a.token == nil, Keepalive: a.keepalive}
	ctx := s.Context()
	var wait *lockWait
	if a.wait > 0 {
		// Replies to the commands pipelined before this one must not wait
		// with it.
		if s.Flush() != nil {
			return
		}
		// A waiting client that goes away leaves the wait at once.
		stop := s.WatchClose()
		defer stop()
		var cancel context.CancelFunc
		// The backend's own deadline is a.wait; this bounds its last try.
		ctx, cancel = context.WithTimeout(ctx, a.wait+a.ttl)
		defer cancel()
		// CLIENT UNBLOCK ends the wait through cancel (clientUnblock).
		wait = h.waits.begin(s.ID(), cancel)
	}
	start := time.Now()
	lease, err := h.backend.Lock(ctx, req)
	done := time.Now()
	h.metrics.acquireDuration.Observe(done.Sub(start).Seconds())
	var unblocked byte
	if wait != nil {
		unblocked = h.waits.end(s.ID(), wait)
	}
	expired := false
	if err == nil {
		lease.Validity, expired = toldValidity(lease, done)
	}
	switch {
	case unblocked != 0:
		// CLIENT UNBLOCK ended the wait and was told so (:1): the
		// command answers as Redis's blocking commands do then, and
		// leaves nothing held. The backend rolled back a partial grant
		// of the canceled attempt (as for a client that left), but may
		// have answered a grant that landed first: it is given back.
		if err == nil {
			h.releaseOrphan(s, req.Key, token, mode)
		}
		h.metrics.notAcquired.Inc()
		if unblocked == unblockedError {
			s.W.Error(errUnblocked)
		} else {
			s.W.Null()
		}
	case err == nil && s.Context().Err() != nil:
		// The grant landed after the client went away (or the server
		// canceled what runs): nobody will learn of it, so it is given
		// back now rather than left held for its whole TTL. Backends may
		// answer a grant whose context was canceled mid-attempt. Its
		// client, if anyone hears, is answered an error: so it counts.
		h.metrics.acquireErr.Inc()
		h.releaseOrphan(s, req.Key, token, mode)
		s.W.Error(errShuttingDown.Error())
	case err == nil && expired:
		// The lease ran out between the backend's answer and here (the
		// process was paused): as a grant that would leave under 1 ms,
		// given back and answered as not acquired, never told a validity
		// that is gone (test/fault sigstop-lockproxy-past-ttl saw one
		// told ~1.96 s after a 2.5 s pause, and its fence below a later
		// holder's).
		h.releaseOrphan(s, req.Key, token, mode)
		h.metrics.notAcquired.Inc()
		s.W.Null()
	case err == nil && a.token != nil && h.lockLost(s, a.key, a.token):
		// This connection's KEEPALIVE lock of the key with the token
		// was lost while the attempt ran (a WAIT, a slow grant): this
		// LOCK is the command the notice answers (lockLost wrote
		// -LOCKLOST), and as a command so answered runs nothing, the
		// grant is given back. Granted, it would be kept alive while
		// the notice went to the UNLOCK after it, which would then not
		// run.
		h.metrics.acquireErr.Inc()
		h.releaseOrphan(s, req.Key, token, mode)
	case err == nil:
		// Counted before the watchdog may release it (releaseHolds
		// takes it off then).
		h.held.granted(req.Key, token, mode, a.ttl)
		var ka *connKeepalive
		if a.keepalive {
			ka = h.connKeepalive(s)
		}
		// shared: the client named the token, which may then hold
		// holds the watchdog does not count (keepalives.beginUnlock).
		shared := a.token != nil
		// The watchdog counts the lease from when the granting attempt
		// was sent (it may have begun then) and renews first within the
		// validity told. The reply's hold count tells the watchdog a
		// grant starts how many holds of the token it found, which it
		// does not count.
		timing := grantTiming{sent: grantSent(start, done, a.ttl, lease.Validity), validity: lease.Validity,
			begun: start, holds: lease.Holds}
		if !h.keepalive.grantedGrant(s.Context(), ka, req.Key, token, mode, shared, a.ttl, a.maxHold, timing) && a.keepalive &&
			!h.keepalive.startGrant(s.Context(), ka, req.Key, token, a.ttl, a.maxHold, mode, shared, timing) {
			// The server is shutting down; start released the lock
			// (and took it off h.held). Its client is answered an error.
			h.metrics.acquireErr.Inc()
			s.W.Error(errShuttingDown.Error())
			return
		}
		h.metrics.acquired.Inc()
		writeLease(s.W, lease)
	case errors.Is(err, backends.ErrNotAcquired) && s.Context().Err() != nil:
		// The wait ended because the command was canceled (the client
		// left, or the server's drain time ran out), not because WAIT
		// ran out: the reply says so, as for any canceled command,
		// rather than that the key stayed held.
		h.metrics.acquireErr.Inc()
		s.W.Error(errShuttingDown.Error())
	case errors.Is(err, backends.ErrNotAcquired):
		h.metrics.notAcquired.Inc()
		s.W.Null()
	case errors.Is(err, backends.ErrKeepaliveElsewhere):
		// The token holds the key through a lease another instance
		// keeps (a ZooKeeper node in that instance's session): renewals
		// through this one would promise nothing, and the watchdog
		// would give the lock up at once. No hold was added.
		h.metrics.notAcquired.Inc()
		s.W.Error("ERR KEEPALIVE refused: token already holds '" + relay.Clip(req.Key) +
			"' through another lockproxy instance, whose session keeps its lease; LOCK with KEEPALIVE through that instance, or give PX/EX without KEEPALIVE")
	case errors.Is(err, backends.ErrUpgrade):
		h.metrics.notAcquired.Inc()
		s.W.Error("ERR upgrade refused: this token holds a read lock on '" + relay.Clip(req.Key) +
			"'; UNLOCK it, then LOCK (two readers upgrading at once would wait for each other forever)")
	default:
		if isNoQuorum(err) {
			h.metrics.noQuorum.Inc()
		} else {
			h.metrics.acquireErr.Inc()
		}
		h.replyError(s, cmd, err)
	}
}

// toldValidity is the validity to tell of lease, answered by the backend
// at done: its Validity less the time since the backend measured it
// (lease.At), and whether nothing (under 1 ms) is left.
func toldValidity(lease backends.Lease, done time.Time) (time.Duration, bool) {
	if lease.At.IsZero() {
		return lease.Validity, false
	}
	left := lease.Validity - max(done.Sub(lease.At), 0)
	return left, left < time.Millisecond
}

// grantSent is the latest time the lease of a grant may have begun: when
// the backend's granting attempt was sent, or earlier. Not start, when
// Backend.Lock was called: after a WAIT that began long before the attempt
// that granted, and the watchdog would count a just-granted lease as spent
// and give the lock up at the first renewal that errs. The backends count
// the validity they tell from the granting attempt's send (TTL less that
// attempt's time and drift), so done, when the grant came back, less what
// the validity lacks of the TTL is no later than that send. Never before
// start (the attempt was sent after it), never after done (a validity
// above the TTL, as a reentry joining a longer lease may tell, adds
// nothing).
func grantSent(start, done time.Time, ttl, validity time.Duration) time.Time {
	return start.Add(max(done.Sub(start)-(ttl-min(validity, ttl)), 0))
}

// releaseOrphan releases the hold of mode a grant added for a client that
// is gone, within the keepalive release bound and whatever the session's
// context: it is canceled already. It releases that kind only: the read
// grant of a downgrade must not end the token's write hold, which UNLOCK's
// release takes first and which its holder was told it has.
func (h *Handler) releaseOrphan(s *resp.Session, key, token string, mode backends.Mode) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.Context()), h.keepalive.release)
	defer cancel()
	if _, err := backends.UnlockHold(ctx, h.backend, key, token, mode); err != nil {
		h.log.Warn("releasing a grant whose client went away failed; the lease will expire on its own",
			zap.Error(fmt.Errorf("unlock of a %v hold after the client left: %w", mode, err)))
	}
}

func writeLease(w *resp.Writer, l backends.Lease) {
	w.Map(3)
	w.BulkString("token")
	w.BulkString(l.Token)
	w.BulkString("validity_ms")
	w.Int(l.Validity.Milliseconds())
	w.BulkString("fence")
	w.Uint(l.Fence)
}

func (h *Handler) unlock(s *resp.Session, args [][]byte) {
	if err := h.limits.checkKeyToken(args[1], args[2]); err != nil {
		s.W.Error(err.Error())
		return
	}
	if beginLockCmd(s, args[1], args[2], true) {
		return
	}
	key, token := string(args[1]), string(args[2])
	op := h.keepalive.beginUnlock(key, token)
	// Which kind of hold the UNLOCK releases (write first) decides
	// which watchdog hold it ends: a downgrade's KEEPALIVE read hold
	// must not stop with its write hold.
	h.keepalive.whichHold(s.Context(), op)
	ok, err := h.backend.Unlock(s.Context(), key, token)
	released := ok && err == nil
	h.keepalive.endUnlock(op, released, state(s).ka)
	if err == nil && !ok {
		h.keepalive.unlockFoundNothing(key, token, state(s).ka)
	}
	if released {
		h.held.released(key, token)
	}
	switch {
	case endLockCmd(s, args[1], released):
		// The lock was lost while the UNLOCK ran, which is answered
		// that, as the next UNLOCK would be (unless it released the
		// connection's only hold: then there is no loss to tell).
	case err != nil:
		h.replyError(s, "unlock", err)
	case ok:
		s.W.Int(1)
	default:
		s.W.Int(0)
	}
}

// renew: RENEW key token PX ms | EX s
func (h *Handler) renew(s *resp.Session, args [][]byte) {
	if err := h.limits.checkKeyToken(args[1], args[2]); err != nil {
		s.W.Error(err.Error())
		return
	}
	unit := time.Millisecond
	switch {
	case resp.EqualFold(args[3], "PX"):
	case resp.EqualFold(args[3], "EX"):
		unit = time.Second
	default:
		s.W.Error(errSyntax.Error())
		return
	}
	ttl, err := parseTTL(args[4], unit, "renew")
	if err == nil {
		err = h.limits.checkTTL(ttl)
	}
	if err != nil {
		s.W.Error(err.Error())
		return
	}
	if beginLockCmd(s, args[1], args[2], false) {
		return
	}
	key, token := string(args[1]), string(args[2])
	sent := time.Now()
	validity, err := h.backend.Renew(s.Context(), key, token, ttl)
	switch {
	case err != nil:
		// Undecided: the lease may be ttl on a majority all the same.
		h.keepalive.undecidedRenewal(key, token, sent, ttl)
	case validity > 0:
		h.held.renewed(key, token, ttl)
		h.keepalive.toldRenewal(key, token, sent, validity)
	default:
		// Not held, or renewed on a majority too late to leave 1 ms:
		// the lease may be ttl there, too short to count on, while the
		// lock's KEEPALIVE holder may be another connection. Its
		// watchdog renews (or finds the lock gone and tells) at once.
		h.keepalive.undecidedRenewal(key, token, sent, ttl)
	}
	switch {
	case endLockCmd(s, args[1], false):
		// The lock was lost while the RENEW ran, which is answered
		// that, as the next RENEW would be; what lease it set on the
		// nodes runs out on its own (the watchdogs above were told of
		// it all the same: it may have shortened the lease).
	case err != nil:
		h.replyError(s, "renew", err)
	default:
		s.W.Int(validity.Milliseconds())
	}
}
