package commands

import (
	"bytes"
	"container/list"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/relay"
	"github.com/lockproxy/lockproxy/resp"
)

// Transparent mode: plain Redis commands on keys that match the configured
// lock patterns are served by the lock backend, so that code written for
// one Redis (SET NX PX plus a compare-and-delete script, and the libraries
// built on that) gets quorum locks without a change.
//
//   - SET key value NX PX|EX ttl is a LOCK with the value as token: quorum,
//     validity, roll-back of partial grants and the fence come from the
//     backend. Other SET forms are run like a script that may acquire
//     (setScript, below).
//   - GET, EXISTS, DEL, UNLINK, PEXPIRE, EXPIRE, PTTL, TTL and read-only
//     scripts run on every node that may vote; the reply is the one shared
//     by a majority of all nodes (PTTL/TTL: see agreeTTL). When no reply is
//     shared by a majority the client gets an error saying so.
//   - EVAL/EVALSHA whose KEYS are all lock keys run on every node with the
//     reads of those keys before and after the script in one MULTI. A
//     script that leaves a key holding a value it did not hold before is
//     an acquisition: it stands only when a majority holds the written
//     value, their replies agree, and the lease left on that majority,
//     less the time taken and the drift, is positive. Otherwise the
//     written values are compare-and-deleted on every node that wrote them
//     and the client gets the reply of the nodes that did not write (their
//     "not acquired"), or an error when there is none to give. A script
//     whose agreed reply is an error (it failed after writing, or stored a
//     non-string value at one of its lock keys) is no acquisition either:
//     its written values are rolled back the same way, and the client gets
//     the error. What a script deleted cannot be put back.
//   - Renewals: every command or script that may write a lock key is
//     followed on each node by a line-up of the hold's other keys (see
//     backends/redis syncHoldsScript): a PEXPIRE, EXPIRE, SET XX PX or
//     compare-and-PEXPIRE script that extends a held key renews the whole
//     hold as RENEW would, the holder's reentrant holds and fence included.

// errTransparentFanout is the reply when the backend has no nodes to run
// plain Redis commands on.
const errTransparentFanout = "ERR transparent mode: this lock backend serves only SET key value NX PX|EX ttl on lock keys; use LOCK, UNLOCK and RENEW for the rest"

// maxScripts and maxScriptBytes bound the scripts remembered for EVALSHA,
// in number and in total size of their bodies. When a new body would
// exceed either, the least recently used are forgotten: a body just loaded
// or run is always remembered (even one larger than maxScriptBytes, alone),
// so that a client's NOSCRIPT → SCRIPT LOAD → EVALSHA fallback (redis-py's
// Script) finds it. An EVALSHA of a forgotten body gets NOSCRIPT, which
// every client answers with EVAL or SCRIPT LOAD.
const (
	maxScripts     = 4096
	maxScriptBytes = 32 << 20
)

// scriptCache maps SHA1 (lower-case hex) to script bodies seen in EVAL and
// SCRIPT LOAD on this instance, least recently used first out. EVALSHA is
// served by sending EVAL with the body, so it needs the body here.
type scriptCache struct {
	mu     sync.Mutex
	bodies map[string]*list.Element // of *scriptEntry, in lru
	lru    list.List                // most recently used at the front
	size   int                      // total bytes of the bodies
}

type scriptEntry struct{ sha, body string }

func (c *scriptCache) add(body string) string {
	sum := sha1.Sum([]byte(body))
	sha := hex.EncodeToString(sum[:])
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bodies == nil {
		c.bodies = map[string]*list.Element{}
	}
	if e, ok := c.bodies[sha]; ok {
		c.lru.MoveToFront(e)
		return sha
	}
	c.bodies[sha] = c.lru.PushFront(&scriptEntry{sha: sha, body: body})
	c.size += len(body)
	for c.lru.Len() > 1 && (c.lru.Len() > maxScripts || c.size > maxScriptBytes) {
		old := c.lru.Remove(c.lru.Back()).(*scriptEntry)
		delete(c.bodies, old.sha)
		c.size -= len(old.body)
	}
	return sha
}

// get returns the body of sha, which counts as a use of it.
func (c *scriptCache) get(sha string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.bodies[strings.ToLower(sha)]
	if !ok {
		return "", false
	}
	c.lru.MoveToFront(e)
	return e.Value.(*scriptEntry).body, true
}

// forget drops sha's body, if remembered.
func (c *scriptCache) forget(sha string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.bodies[sha]; ok {
		c.size -= len(c.lru.Remove(e).(*scriptEntry).body)
		delete(c.bodies, sha)
	}
}

// compileFailed reports whether v, the nodes' agreed reply to a script,
// is Redis's refusal of a body that does not compile.
func compileFailed(v any) bool {
	e, ok := v.(backends.ReplyError)
	return ok && strings.HasPrefix(string(e), "ERR Error compiling script")
}

func (c *scriptCache) flush() {
	c.mu.Lock()
	c.bodies = nil
	c.lru.Init()
	c.size = 0
	c.mu.Unlock()
}

// isLockKey reports whether key matches one of the lock patterns.
func (h *Handler) isLockKey(key []byte) bool {
	for _, p := range h.patterns {
		if globMatch(p, key) {
			return true
		}
	}
	return false
}

// keyClass tells whether all, none or some of keys are lock keys.
type keyClass int

const (
	noLockKeys keyClass = iota
	allLockKeys
	mixedKeys
)

func (h *Handler) classify(keys [][]byte) keyClass {
	n := 0
	for _, k := range keys {
		if h.isLockKey(k) {
			n++
		}
	}
	switch {
	case n == 0:
		return noLockKeys
	case n == len(keys):
		return allLockKeys
	}
	return mixedKeys
}

// unsupportedOnLockKeys are commands whose first argument is a key and that
// transparent mode does not serve: on a lock key they are refused rather
// than sent to an upstream Redis, where they would act on another key of
// the same name.
var unsupportedOnLockKeys = map[string]bool{
	"setnx": true, "setex": true, "psetex": true, "getset": true, "getdel": true, "getex": true,
	"persist": true, "expireat": true, "pexpireat": true, "expiretime": true, "pexpiretime": true,
	"append": true, "incr": true, "incrby": true, "decr": true, "decrby": true, "incrbyfloat": true,
	"setrange": true, "getrange": true, "strlen": true, "type": true, "object": true, "dump": true,
	"restore": true, "rename": true, "renamenx": true, "copy": true, "move": true, "touch": true,
}

// transparentCommands lists what transparent mode serves, for errors: the
// forms of the README's table, so that a client refused one learns every
// SET it may send instead.
const transparentCommands = "SET key value NX PX|EX ttl, SET key value [XX] PX|EX ttl [GET], SET key value XX KEEPTTL [GET], " +
	"GET, EXISTS, DEL, UNLINK, PEXPIRE, EXPIRE, PTTL, TTL, EVAL, EVALSHA, EVAL_RO, EVALSHA_RO, SCRIPT LOAD|EXISTS|FLUSH, " +
	"WATCH, MULTI, EXEC of lock keys only"

// transparent serves args when it is a command on lock keys and reports
// whether it did; ServeRESP sends everything else on (to the upstream, or
// "unknown command").
func (h *Handler) transparent(s *resp.Session, args [][]byte) bool {
	if len(h.patterns) == 0 || len(args) < 2 {
		return false
	}
	var buf [16]byte
	name := string(resp.Lower(buf[:], args[0]))
	if db := selectedDB(s); db != 0 && name != "script" && h.onLockKeys(args) {
		// Lock keys have no database: on the lock nodes there is one of
		// each name. Served here, a SET NX PX in database 1 would find
		// database 0's holder, and a DEL release it; refused instead, as
		// sharing them silently is not what Redis does.
		label := name
		if unsupportedOnLockKeys[name] {
			label = "unsupported"
		}
		h.tCount(s, label, func() {
			s.W.Error("ERR transparent mode: lock keys (lock_patterns) live in database 0 of the lock nodes, and this connection selected database " +
				strconv.Itoa(db) + "; SELECT 0 to use them (LOCK and the other lock commands ignore SELECT)")
		})
		return true
	}
	if trackedLockRead(s, name) && h.onLockKeys(args) {
		// A client-side cache keeps a tracked read's reply until the
		// server says the key changed: the upstream says so for its keys,
		// the lock nodes for none, so a cached lock key would keep its
		// old holder's token.
		h.tCount(s, name, func() {
			s.W.Error("ERR transparent mode: lock keys (lock_patterns) are served by the lock nodes, which send no CLIENT TRACKING invalidations, " +
				"so a cached reply would never be invalidated; read lock keys on a connection without CLIENT TRACKING")
		})
		return true
	}
	switch name {
	case "set":
		if !h.isLockKey(args[1]) {
			return false
		}
		h.tCount(s, name, func() { h.tSet(s, args) })
	case "get", "pttl", "ttl":
		// GET answers the holder's token, which LOCKINFO hides: a user
		// whose auth.permissions do not allow everything was refused it
		// before this (permitted, lockValueCheck), as SET … GET.
		if !h.isLockKey(args[1]) {
			return false
		}
		h.tCount(s, name, func() {
			if len(args) != 2 {
				wrongArity(s, name)
				return
			}
			if err := h.limits.checkKey(args[1]); err != nil {
				s.W.Error(err.Error())
				return
			}
			h.tRun(s, args, []int{1}, name != "get", true, nil)
		})
	case "exists", "del", "unlink":
		switch h.classify(args[1:]) {
		case noLockKeys:
			return false
		case mixedKeys:
			h.tCount(s, name, func() { s.W.Error(mixedError(name)) })
			return true
		}
		keys := make([]int, len(args)-1)
		for i := range keys {
			keys[i] = i + 1
		}
		if len(keys) > 1 {
			// Each key is held or not by its own majority: a lock granted
			// on 2 of 3 nodes and another on a different 2 are both held,
			// while the nodes' totals (2, 1, 1) would agree on 1.
			h.tCount(s, name, func() { h.tRunEachKey(s, args, name == "exists") })
			return true
		}
		var done func(any, error, time.Time)
		if name != "exists" {
			done = h.keyGoneAfter(args[1])
		}
		h.tCount(s, name, func() { h.tRun(s, args, keys, false, name == "exists", done) })
	case "pexpire", "expire":
		if !h.isLockKey(args[1]) {
			return false
		}
		h.tCount(s, name, func() { h.tExpire(s, name, args) })
	case "eval", "evalsha", "eval_ro", "evalsha_ro":
		return h.tEval(s, name, args)
	case "script":
		return h.tScript(s, args)
	default:
		if !unsupportedOnLockKeys[name] || !h.isLockKey(args[1]) {
			return false
		}
		h.tCount(s, "unsupported", func() {
			s.W.Error("ERR transparent mode: '" + name + "' is not supported on lock keys (matching lock_patterns); supported: " + transparentCommands)
		})
	}
	return true
}

// trackedLockRead reports whether name (lower case) is a read that Redis
// tracks for a client-side cache (GET, EXISTS, PTTL, TTL, a read-only
// script) and the connection has CLIENT TRACKING on for it: in OPTIN mode
// right after CLIENT CACHING YES only (rueidis turns OPTIN on for every
// RESP3 connection and caches only what it sends CACHING YES for), in
// OPTOUT mode unless right after CLIENT CACHING NO.
func trackedLockRead(s *resp.Session, name string) bool {
	c, ok := s.Data.(*conn)
	if !ok || c.rl == nil || !c.rl.tracks {
		return false
	}
	switch c.rl.trackOpt {
	case 'i':
		if c.rl.cachingNow != 'y' {
			return false
		}
	case 'o':
		if c.rl.cachingNow == 'n' {
			return false
		}
	}
	switch name {
	case "get", "exists", "pttl", "ttl", "eval_ro", "evalsha_ro":
		return true
	}
	return false
}

// tCount runs a transparent command and counts it in
// lockproxy_commands_total under a closed set of names.
func (h *Handler) tCount(s *resp.Session, name string, run func()) {
	before, resets := s.W.Len(), s.W.Resets()
	state(s).lastCmd = name
	run()
	result := "ok"
	if replyFailed(s.W, before, resets) {
		result = "error"
	}
	h.metrics.commands.WithLabelValues("transparent_"+name, result).Inc()
}

func mixedError(name string) string {
	return "ERR transparent mode: '" + name + "' mixes lock keys (matching lock_patterns) and other keys; use one kind per command"
}

// tRun runs args on every node and replies what a majority agrees on
// (for PTTL and TTL, by agreeTTL). done, when not nil, is told the
// agreement and when the command began, before the reply is written.
func (h *Handler) tRun(s *resp.Session, args [][]byte, keys []int, ttl, readOnly bool, done func(v any, err error, began time.Time)) {
	if h.fanout == nil {
		s.W.Error(errTransparentFanout)
		return
	}
	began := time.Now()
	rs := h.fanout.Run(s.Context(), strs(args), keys, readOnly)
	var v any
	var err error
	if ttl {
		v, err = agreeTTL(rs, h.fanout.NodeCount())
	} else {
		v, err = agree(rs, h.fanout.NodeCount())
	}
	if done != nil {
		done(v, err, began)
	}
	h.tReply(s, strings.ToLower(string(args[0])), v, err)
}

// keyGoneAfter is tRun's done for DEL and UNLINK of key: an integer shared
// by a majority (1: deleted, 0: already missing) leaves the key missing
// on that majority, so the locks of it counted here are over.
func (h *Handler) keyGoneAfter(key []byte) func(any, error, time.Time) {
	return func(v any, err error, began time.Time) {
		if _, ok := v.(int64); ok && err == nil {
			h.held.keyGone(string(key), began)
		}
	}
}

// tRunEachKey runs EXISTS, DEL or UNLINK once per key, each on every node
// under the majority rule, and replies the sum of the agreed counts, as a
// single Redis counts the keys it has. The keys go to each node together
// (RunEach): a node that does not answer costs one timeout, not one per
// key.
func (h *Handler) tRunEachKey(s *resp.Session, args [][]byte, readOnly bool) {
	if h.fanout == nil {
		s.W.Error(errTransparentFanout)
		return
	}
	name := strings.ToLower(string(args[0]))
	began := time.Now()
	rs := h.fanout.RunEach(s.Context(), name, strs(args[1:]), readOnly)
	per := make([]backends.NodeReply, len(rs))
	var sum int64
	for i := range args[1:] {
		for j, r := range rs {
			per[j] = backends.NodeReply{Node: r.Node, Err: r.Err}
			if r.Err != nil {
				continue
			}
			if vs, ok := r.Val.([]any); ok && len(vs) == len(args)-1 {
				per[j].Val = vs[i]
			} else {
				per[j].Err = errors.New("commands: a node gave " + strconv.Itoa(len(vs)) + " replies for " + strconv.Itoa(len(args)-1) + " keys")
			}
		}
		v, err := agree(per, h.fanout.NodeCount())
		n, ok := v.(int64)
		if err == nil && !ok {
			writeValue(s.W, v) // a node's error reply, shared by a majority
			return
		}
		if err != nil {
			h.tReply(s, name, v, err)
			return
		}
		if !readOnly {
			// Missing on a majority now, whether this deleted it or not.
			h.held.keyGone(string(args[1+i]), began)
		}
		sum += n
	}
	s.W.Int(sum)
}

// tReply writes the agreed value or the reason there is none.
func (h *Handler) tReply(s *resp.Session, name string, v any, err error) {
	var nm *noMajorityError
	var sf *scriptFailedError
	switch {
	case errors.As(err, &nm):
		s.W.Error(nm.Error())
	case errors.As(err, &sf), errors.Is(err, errScriptUnbounded):
		// A script rolled back: the error says why, as written.
		s.W.Error(err.Error())
	case err != nil:
		h.replyError(s, name, err)
	default:
		writeValue(s.W, v)
	}
}

// tSet serves SET on a lock key.
func (h *Handler) tSet(s *resp.Session, args [][]byte) {
	if len(args) < 3 {
		wrongArity(s, "set")
		return
	}
	if err := h.limits.checkKeyToken(args[1], args[2]); err != nil {
		s.W.Error(err.Error())
		return
	}
	// As Redis 7.0: an option may be repeated, a PX after a PX (or an EX
	// after an EX) replacing it, and only the TTL that applies, the last,
	// is read, once every option has been checked. The nodes get the
	// options as given, and apply the same one.
	var nx, xx, get, keepTTL, ttlSet bool
	var ttl time.Duration
	var ttlArg []byte
	var unit time.Duration
	for i := 3; i < len(args); i++ {
		o := args[i]
		switch {
		case resp.EqualFold(o, "NX") && !xx:
			nx = true
		case resp.EqualFold(o, "XX") && !nx:
			xx = true
		case resp.EqualFold(o, "GET"):
			get = true
		case resp.EqualFold(o, "KEEPTTL") && !ttlSet:
			keepTTL = true
		case resp.EqualFold(o, "PX") && unit != time.Second && !keepTTL && i+1 < len(args):
			unit, ttlArg, ttlSet = time.Millisecond, args[i+1], true
			i++
		case resp.EqualFold(o, "EX") && unit != time.Millisecond && !keepTTL && i+1 < len(args):
			unit, ttlArg, ttlSet = time.Second, args[i+1], true
			i++
		case resp.EqualFold(o, "PXAT") || resp.EqualFold(o, "EXAT"):
			s.W.Error("ERR transparent mode: SET with PXAT/EXAT is not supported on lock keys (an absolute time depends on each node's clock); use PX or EX")
			return
		default:
			s.W.Error(errSyntax.Error())
			return
		}
	}
	if ttlSet {
		var err error
		if ttl, err = parseTTL(ttlArg, unit, "set"); err != nil {
			s.W.Error(err.Error())
			return
		}
	}
	switch {
	case !ttlSet && !(keepTTL && xx):
		s.W.Error("ERR transparent mode: SET on a lock key needs PX or EX (or XX with KEEPTTL): a lock key without a TTL would never expire")
		return
	case nx && (get || keepTTL):
		s.W.Error("ERR transparent mode: SET … NX on a lock key takes only PX or EX; GET and KEEPTTL are supported with XX or without NX")
		return
	}
	if ttlSet {
		if err := h.limits.checkTTL(ttl); err != nil {
			s.W.Error(err.Error())
			return
		}
	}
	if !nx {
		if h.fanout == nil {
			s.W.Error(errTransparentFanout)
			return
		}
		v, err := h.runAcquiring(s, setScript, []string{string(args[1])}, strs(args[2:]), false, false)
		if err == nil && v == "OK" && !get {
			s.W.Simple("OK") // a status reply, as Redis gives
			return
		}
		h.tReply(s, "set", v, err)
		return
	}
	began := time.Now()
	_, err := h.backend.Lock(s.Context(), backends.LockRequest{Key: string(args[1]), Token: string(args[2]), TTL: ttl, NoReentry: true})
	// An acquisition attempt like a LOCK's, counted with the same results:
	// the NOQUORUM alert watches them whichever command the client locks
	// with.
	h.metrics.acquireDone(h.metrics.acquireResult(err), 1, time.Since(began))
	switch {
	case err == nil:
		// A lock granted through this instance, as a LOCK's.
		h.held.acquired(string(args[1]), string(args[2]), ttl, began)
		s.W.Simple("OK")
	case errors.Is(err, backends.ErrNotAcquired), errors.Is(err, backends.ErrUpgrade):
		// The key is held, by readers among which the value's token is:
		// SET NX finds it taken, as Redis would.
		s.W.Null()
	default:
		h.replyError(s, "set", err)
	}
}

// tExpire serves PEXPIRE and EXPIRE on a lock key. The TTL is held to
// locks.max_ttl: the restart quarantine counts on no lock outliving it.
// The reply is Redis's (1 when the TTL was set, else 0); on each node the
// backend follows it with the line-up of the hold's other keys (Run), so
// that it renews a LOCK holder's whole hold, reentrant holds and fence
// included, as RENEW does for the token the key holds.
func (h *Handler) tExpire(s *resp.Session, name string, args [][]byte) {
	if why := h.expireRefusal(name, args); why != "" {
		s.W.Error(why)
		return
	}
	ttl := expireTTL(name, args[2])
	h.tRun(s, args, []int{1}, false, false, func(v any, err error, began time.Time) {
		if n, ok := v.(int64); !ok || err != nil || n != 1 {
			// 0: not set (no key, or NX|XX|GT|LT), the lease as it was.
			return
		}
		if ttl <= 0 {
			// Redis deletes a key given no time left.
			h.held.keyGone(string(args[1]), began)
			return
		}
		h.held.keyRenewed(string(args[1]), ttl)
	})
}

// expireTTL is the TTL a PEXPIRE or EXPIRE (name, lower case) sets with
// arg, checked by expireRefusal.
func expireTTL(name string, arg []byte) time.Duration {
	n, _ := resp.ParseInt(arg)
	if n <= 0 {
		return 0 // none left; and a large negative would overflow below
	}
	if name == "expire" {
		n = min(n, math.MaxInt64/1000) * 1000
	}
	return time.Duration(min(n, math.MaxInt64/int64(time.Millisecond))) * time.Millisecond
}

// expireRefusal is the refusal of PEXPIRE or EXPIRE (name, lower case)
// of a lock key, as Redis 7 checks its options and TTL, or "" when it may
// run: its options in any number and order, and their contradictions,
// checked before the TTL; and locks.max_ttl.
func (h *Handler) expireRefusal(name string, args [][]byte) string {
	why, _ := h.expireRefusalKind(name, args)
	return why
}

// expireRefusalKind is expireRefusal, and whether the refusal is
// lockproxy's own (locks.max_ttl), where Redis would have run the command.
func (h *Handler) expireRefusalKind(name string, args [][]byte) (why string, maxTTL bool) {
	if len(args) < 3 {
		return "ERR wrong number of arguments for '" + name + "' command", false
	}
	var nx, xx, gt, lt bool
	for _, o := range args[3:] {
		switch {
		case resp.EqualFold(o, "NX"):
			nx = true
		case resp.EqualFold(o, "XX"):
			xx = true
		case resp.EqualFold(o, "GT"):
			gt = true
		case resp.EqualFold(o, "LT"):
			lt = true
		default:
			return "ERR Unsupported option " + relay.Clip(string(o)), false
		}
	}
	switch {
	case nx && (xx || gt || lt):
		return "ERR NX and XX, GT or LT options at the same time are not compatible", false
	case gt && lt:
		return "ERR GT and LT options at the same time are not compatible", false
	}
	n, ok := resp.ParseInt(args[2])
	if !ok {
		return errNotInteger.Error(), false
	}
	// Redis's own bound (expireGenericCommand): the TTL in ms, added to
	// the time, must fit in 64 bits. Within it Redis runs the command, so
	// a TTL lockproxy does not take is refused for locks.max_ttl, not as
	// an invalid expire time.
	ms := n
	if name == "expire" {
		if n > math.MaxInt64/1000 || n < math.MinInt64/1000 {
			return errInvalidExpire(name).Error(), false
		}
		ms = n * 1000
	}
	if ms > math.MaxInt64-time.Now().UnixMilli() {
		return errInvalidExpire(name).Error(), false
	}
	// Only the maximum applies: a short or zero TTL just ends the lock
	// sooner, as in Redis.
	if limit := h.limits.MaxTTL.Milliseconds(); limit > 0 && ms > limit {
		return "ERR TTL " + strconv.FormatInt(ms, 10) + " ms is above the maximum of " + strconv.FormatInt(limit, 10) + " ms (locks.max_ttl)", true
	}
	return "", false
}

// tEval serves EVAL, EVALSHA and their _RO forms when every key is a lock
// key; a script without keys or without lock keys is not served here.
// Without an upstream it also answers a numkeys that Redis refuses, as
// Redis does.
func (h *Handler) tEval(s *resp.Session, name string, args [][]byte) bool {
	if len(args) < 3 {
		return false
	}
	nk, ok := resp.ParseInt(args[2])
	if why := numkeysError(nk, ok, len(args)-3); why != nil {
		if h.up != nil {
			// Relayed: the upstream refuses it with these words, and
			// runs nothing.
			return false
		}
		// Without an upstream nothing else answers an EVAL: "unknown
		// command" would tell a client that sent its lock script with a
		// wrong count that lockproxy serves no scripts.
		h.tCount(s, name, func() { s.W.Error(why.Error()) })
		return true
	}
	if nk == 0 {
		return false
	}
	keys := args[3 : 3+nk]
	switch h.classify(keys) {
	case noLockKeys:
		return false
	case mixedKeys:
		h.tCount(s, name, func() {
			s.W.Error("ERR transparent mode: the script's KEYS mix lock keys (matching lock_patterns) and other keys; a script must use only lock keys or only other keys")
		})
		return true
	}
	h.tCount(s, name, func() {
		if h.fanout == nil {
			s.W.Error(errTransparentFanout)
			return
		}
		for _, k := range keys {
			if err := h.limits.checkKey(k); err != nil {
				s.W.Error(err.Error())
				return
			}
		}
		body := string(args[1])
		var sha string // of an EVAL's body, remembered for EVALSHA
		if strings.HasPrefix(name, "evalsha") {
			var known bool
			if body, known = h.scripts.get(body); !known {
				s.W.Error("NOSCRIPT No matching script. Please use EVAL.")
				return
			}
		} else {
			sha = h.scripts.add(body)
		}
		if h.namesNodeKeys(args[3+nk:], body) {
			// The script runs on the lock nodes as lockproxy's own user: a
			// lock script reaches its lock through KEYS, and one that names
			// lockproxy's keys could delete other holders' locks, or the
			// fence counters.
			s.W.Error("ERR transparent mode: the script names lockproxy's own keys (redlock.key_prefix " +
				relay.Clip(h.nodeKeyPrefix) + "); a lock script reaches its lock through KEYS")
			return
		}
		if why := h.lockKeyOutside(args[3+nk:], []byte(body), true); why != "" {
			// On the nodes the script's other arguments and its literals
			// are used as they are, outside lockproxy's key namespace: a
			// lock key there is no one's lock, and taking it is no grant.
			s.W.Error(why)
			return
		}
		var v any
		var err error
		// A write script on a key whose lock is counted here runs with the
		// reads around it (RunScript), in the same round trip: what it
		// left there tells whether it released or renewed that lock
		// (countScript).
		mayAcquire := scriptMayAcquire(body)
		if ro := strings.HasSuffix(name, "_ro"); ro || !mayAcquire && !h.held.tracks(strs(keys)) {
			verb := "eval"
			if ro {
				verb = "eval_ro"
			}
			run := body
			if !ro {
				run = boundedScript(body, h.limits.MaxTTL)
			}
			cmd := append([]string{verb, run}, strs(args[2:])...)
			idx := make([]int, nk)
			for i := range idx {
				idx[i] = 3 + i
			}
			rs := h.fanout.Run(s.Context(), cmd, idx, ro)
			if scriptReturnsTTL(body) {
				// Its reply is a key's PTTL or TTL (bsm/redislock's
				// TTL), which differs from node to node by the moments
				// each ran the grant and the script: PTTL's rule.
				v, err = agreeTTL(rs, h.fanout.NodeCount())
			} else {
				v, err = agree(rs, h.fanout.NodeCount())
			}
		} else {
			v, err = h.runAcquiring(s, boundedScript(body, h.limits.MaxTTL), strs(keys), strs(args[3+nk:]), scriptReturnsTTL(body), mayAcquire)
		}
		if sha != "" && compileFailed(v) {
			// Redis keeps no script that does not compile: SCRIPT
			// EXISTS answers 0 for it, and EVALSHA NOSCRIPT, on which
			// the client sends the EVAL that shows the error.
			h.scripts.forget(sha)
		}
		h.tReply(s, name, v, err)
	})
	return true
}

// Redis's refusals of a script's numkeys (evalGenericCommand), checked
// before the script is looked up or run.
var (
	errNumkeysNegative = errors.New("ERR Number of keys can't be negative")
	errNumkeysTooMany  = errors.New("ERR Number of keys can't be greater than number of args")
)

// numkeysError is Redis's refusal of an EVAL whose numkeys (nk, parsed
// when ok) is no count of the args arguments after it, or nil.
func numkeysError(nk int64, ok bool, args int) error {
	switch {
	case !ok:
		return errNotInteger
	case nk > int64(args):
		return errNumkeysTooMany
	case nk < 0:
		return errNumkeysNegative
	}
	return nil
}

// runAcquiring runs a script that may acquire (body) on every node with
// the reads of its keys around it (RunScript) and applies the acquisition
// rule (decideScript): what it wrote that is no grant is rolled back, and
// a grant that stands gets a fence. It returns the reply to give.
// refusable: the script is the client's and may acquire, so a run that
// wrote nothing may be its acquisition refused (scriptAttempts).
func (h *Handler) runAcquiring(s *resp.Session, body string, ks, argv []string, ttlReply, refusable bool) (any, error) {
	start := time.Now()
	// Not canceled with the client: what the scripts wrote must be seen,
	// to be rolled back if it is not a grant.
	rs := h.fanout.RunScript(context.WithoutCancel(s.Context()), body, ks, argv)
	d := decideScript(rs, h.fanout.NodeCount(), time.Since(start), h.fanout.Drift, h.limits.MaxTTL, ttlReply)
	if len(d.undo) > 0 {
		h.undo(s.Context(), ks, d.undo, d.lost)
	}
	var fenceErr error
	defer func() {
		if c, n := h.metrics.scriptAttempts(d, fenceErr, len(ks), refusable, ttlReply); n > 0 {
			h.metrics.acquireDone(c, n, time.Since(start))
		}
	}()
	// An acquisition gets a fence, as a LOCK would: LOCKINFO shows it,
	// and the next grant of the key gets a higher one. A fence that
	// reached no majority would not be above the next grant's: as a LOCK
	// would, the acquisition is then rolled back on its holders and the
	// client gets the failure (-NOQUORUM …).
	for j, v := range d.written {
		if v != nil && len(d.holders) > 0 {
			if _, err := h.fanout.Fence(context.WithoutCancel(s.Context()), d.holders, ks[j], *v); err != nil {
				h.log.Warn("transparent mode: fencing a script's acquisition failed; rolled back", zap.Error(err))
				h.undo(s.Context(), ks, writtenOn(d.holders, d.written), nil)
				fenceErr = fenceNoQuorum(rs, err)
				return nil, fenceErr
			}
		}
	}
	h.countScript(rs, d, ks, start)
	return d.reply, d.err
}

// countScript brings the locks counted here (heldLocks) up to date with
// what a script (or a SET run as one) begun at began left in its keys,
// which each node read in the same MULTI as it ran: an acquisition that
// stands is a lock granted through this instance; a key it left missing
// on a majority ends the locks of it (a compare-and-delete); a key left
// holding a token renews that token's lock to the TTL a majority has left
// (a compare-and-expire) and ends the others'. A script whose writes were
// rolled back changed nothing that is counted.
func (h *Handler) countScript(rs []backends.NodeReply, d scriptDecision, ks []string, began time.Time) {
	if len(d.undo) > 0 {
		return
	}
	need := h.fanout.NodeCount()/2 + 1
	for j, key := range ks {
		if len(d.holders) > 0 && j < len(d.written) && d.written[j] != nil {
			h.held.acquired(key, *d.written[j], d.lease, began)
			continue
		}
		// The state a majority of the nodes shares, and the TTL left
		// on that majority (PTTL's rule).
		counts := map[string]int{}
		var state string
		for _, r := range rs {
			if r.Err != nil || j >= len(r.Writes) {
				continue
			}
			w := r.Writes[j]
			st := "-"
			if w.Exists {
				st = "+" + w.Value
			}
			if counts[st]++; counts[st] >= need {
				state = st
			}
		}
		switch {
		case state == "":
			// No majority: undecided, left to the lease.
		case state == "-":
			h.held.keyGone(key, began)
		default:
			var ttls []int64
			for _, r := range rs {
				if r.Err == nil && j < len(r.Writes) && r.Writes[j].Exists && r.Writes[j].Value == state[1:] {
					ttls = append(ttls, r.Writes[j].PTTL)
				}
			}
			sort.Slice(ttls, func(a, b int) bool { return ttls[a] > ttls[b] })
			ttl := time.Duration(-1)
			if t := ttls[need-1]; t >= 0 {
				ttl = time.Duration(t) * time.Millisecond
			}
			h.held.keyHolds(key, state[1:], ttl, began)
		}
	}
}

// writtenOn is the roll-back of an acquisition that stood: on each of
// nodes, the value written to each key ("" for none), for Undo.
func writtenOn(nodes []int, written []*string) map[int][]string {
	vals := make([]string, len(written))
	for j, v := range written {
		if v != nil {
			vals[j] = *v
		}
	}
	out := make(map[int][]string, len(nodes))
	for _, n := range nodes {
		out[n] = vals
	}
	return out
}

// setScript is SET without NX on a lock key, run by runAcquiring: ARGV is
// the value and SET's options as the client gave them. A SET that leaves
// the key holding a value it did not hold (SET k v PX ms on a free key,
// SET k v XX PX ms over another holder's token) is an acquisition like a
// script's SET: it stands only on a majority within the lease, is rolled
// back elsewhere, and gets a fence above the previous holder's. A SET of
// the value the key holds is a renewal, agreed on as before.
const setScript = `return redis.call('set', KEYS[1], unpack(ARGV))`

// namesNodeKeys reports whether a script on lock keys names lockproxy's
// own keys on the nodes (redlock.key_prefix), as the relay's check does
// for the upstream: an ARGV that starts with the prefix, or a body that
// contains it, also spelled with Lua escapes in a string ('lockproxy\58').
// Like that check it guards against mistakes: a name built at run time
// is not caught.
func (h *Handler) namesNodeKeys(argv [][]byte, body string) bool {
	if h.nodeKeyPrefix == "" {
		return false
	}
	p := []byte(h.nodeKeyPrefix)
	for _, a := range argv {
		if bytes.HasPrefix(a, p) {
			return true
		}
	}
	if strings.Contains(body, h.nodeKeyPrefix) {
		return true
	}
	return strings.IndexByte(body, '\\') >= 0 && luaStrings([]byte(body), func(lit []byte) bool { return bytes.Contains(lit, p) })
}

// scriptCall finds each redis.call / redis.pcall and the command name
// after it when that is a string literal.
var (
	scriptCall = regexp.MustCompile(`\bp?call\b`)
	// The literal must be the whole first argument: 'get' .. 'set' is
	// GETSET.
	scriptLiteral = regexp.MustCompile(`\bp?call\s*\(\s*(?:"([A-Za-z_]+)"|'([A-Za-z_]+)')\s*[,)]`)
	// Every use of redis must be a field read (redis.call, redis.sha1hex):
	// redis['c' .. 'all'] is a call that scriptCall cannot see.
	scriptRedis      = regexp.MustCompile(`\bredis\b`)
	scriptRedisField = regexp.MustCompile(`\bredis\s*\.\s*[A-Za-z_]`)
	// Other ways to reach redis or run code the body does not show.
	scriptIndirect = regexp.MustCompile(`\b(?:_G|getfenv|setfenv|rawget|loadstring|load|dofile|loadfile|require)\b`)
)

// scriptTTLReturn finds a script that returns what a PTTL or TTL call
// answers (return redis.call("pttl", KEYS[1])); scriptReturn each return,
// and scriptNoTime what may follow one in such a script: the call, a
// negative number, 0, nil, false or nothing.
var (
	scriptTTLReturn = regexp.MustCompile(`\breturn\s+redis\.p?call\s*\(\s*["'](?i:p?ttl)["']`)
	scriptReturn    = regexp.MustCompile(`\breturn\b\s*`)
	scriptNoTime    = regexp.MustCompile(`^(?:redis\.p?call\s*\(\s*["'](?i:p?ttl)["']|-\s*\d+\b|0\b|nil\b|false\b|end\b|$)`)
)

// scriptReturnsTTL reports whether a script returns a key's PTTL or TTL:
// its replies are agreed on by agreeTTL, like PTTL's. Its other replies
// must not pass for a time left: negative (bsm/redislock's -3 when the
// token does not hold the key), which agreeTTL counts like any reply, 0
// (no time left) or nil. A script that may also return a positive status
// ("1: extended") or a variable keeps the plain rule: agreeTTL would take
// a 1 from one node for the time a majority has left.
func scriptReturnsTTL(body string) bool {
	if !scriptTTLReturn.MatchString(body) {
		return false
	}
	for _, m := range scriptReturn.FindAllStringIndex(body, -1) {
		if !scriptNoTime.MatchString(body[m[1]:]) {
			return false
		}
	}
	return true
}

// nonAcquiring are commands with which a script cannot put a new value in
// a key: reads, expiry changes, deletions.
var nonAcquiring = map[string]bool{
	"get": true, "mget": true, "exists": true, "pttl": true, "ttl": true, "expire": true, "pexpire": true,
	"del": true, "unlink": true, "strlen": true, "getrange": true, "type": true, "time": true, "publish": true,
}

// scriptMayAcquire reports whether a script may write a new value to a key,
// which needs the reads around it (RunScript) to apply the acquisition
// rule. It is false only when every redis.call/pcall in the body names,
// as a string literal, a command of nonAcquiring: the compare-and-delete
// and compare-and-expire scripts of lock libraries then cost one plain
// EVAL per node. Anything it cannot read (a command name in a variable
// or built from pieces, an aliased call, redis reached other than by a
// field read) counts as a possible acquisition.
func scriptMayAcquire(body string) bool {
	if len(scriptRedis.FindAllStringIndex(body, -1)) != len(scriptRedisField.FindAllStringIndex(body, -1)) ||
		scriptIndirect.MatchString(body) {
		return true
	}
	calls := scriptCall.FindAllStringIndex(body, -1)
	lits := scriptLiteral.FindAllStringSubmatch(body, -1)
	if len(calls) != len(lits) {
		return true
	}
	for _, m := range lits {
		if !nonAcquiring[strings.ToLower(m[1]+m[2])] {
			return true
		}
	}
	return false
}

// undo compare-and-deletes what a script wrote on the given nodes, in
// parallel, with a context that outlives the client: a roll-back must not
// stop because the client went away. On the lost nodes it deletes only
// values no grant holds (see backends.Fanout.Undo).
func (h *Handler) undo(ctx context.Context, keys []string, writes map[int][]string, lost map[int]bool) {
	ctx = context.WithoutCancel(ctx)
	var wg sync.WaitGroup
	for node, vals := range writes {
		var ks, vs []string
		for j, v := range vals {
			if v != "" {
				ks, vs = append(ks, keys[j]), append(vs, v)
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := h.fanout.Undo(ctx, node, ks, vs, lost[node]); err != nil {
				h.metrics.commands.WithLabelValues("transparent_undo", "error").Inc()
			}
		}()
	}
	wg.Wait()
}

// tScript serves SCRIPT LOAD, EXISTS and FLUSH. Scripts are remembered
// here so that EVALSHA can send their body; without an upstream LOAD also
// runs on every node, which checks that the script compiles.
//
// With an upstream, an EVALSHA of the same script may go there (keys that
// are not lock keys) or be served here (lock keys), and the client does
// not say which when it loads or asks: so LOAD goes to the upstream too (it
// checks the script compiles) and is remembered here when it succeeds,
// EXISTS answers 1 only for a script both have, and FLUSH goes to the
// upstream (through upstream.deny_commands, which denies it by default)
// and flushes here only when the upstream did.
func (h *Handler) tScript(s *resp.Session, args [][]byte) bool {
	var buf [16]byte
	switch sub := string(resp.Lower(buf[:], args[1])); sub {
	case "load":
		h.tCount(s, "script_load", func() {
			if len(args) != 3 {
				s.W.Error("ERR wrong number of arguments for 'script|load' command")
				return
			}
			if why := h.lockKeyOutsideKeys(nil, args[2]); why != "" {
				// Refused when loaded, as the upstream's EVALSHA of it
				// could not be checked once this instance forgot it.
				s.W.Error(why)
				return
			}
			if h.up != nil {
				if r := h.relayOne(s, args); len(r) > 0 && r[0] == '$' {
					h.scripts.add(string(args[2]))
				}
				return
			}
			if h.fanout == nil {
				s.W.Error(errTransparentFanout)
				return
			}
			v, err := agree(h.fanout.Run(s.Context(), strs(args), nil, false), h.fanout.NodeCount())
			if err == nil {
				if _, bad := v.(backends.ReplyError); !bad {
					h.scripts.add(string(args[2]))
				}
			}
			h.tReply(s, "script", v, err)
		})
	case "exists":
		h.tCount(s, "script_exists", func() {
			if len(args) < 3 {
				s.W.Error("ERR wrong number of arguments for 'script|exists' command")
				return
			}
			if h.up != nil {
				h.andScriptExists(h.relayOne(s, args), args[2:])
				return
			}
			s.W.Array(len(args) - 2)
			for _, sha := range args[2:] {
				_, ok := h.scripts.get(string(sha))
				// Integers in RESP3 too, as Redis answers.
				if ok {
					s.W.Int(1)
				} else {
					s.W.Int(0)
				}
			}
		})
	case "flush":
		h.tCount(s, "script_flush", func() {
			if h.up != nil {
				if r := h.relayOne(s, args); !bytes.HasPrefix(r, []byte("+OK\r\n")) {
					return
				}
			} else if len(args) > 3 || len(args) == 3 && !resp.EqualFold(args[2], "SYNC") && !resp.EqualFold(args[2], "ASYNC") {
				// Refused as Redis refuses it, flushing nothing: a
				// client that sent it is told, not left to find its
				// scripts gone.
				s.W.Error("ERR SCRIPT FLUSH only support SYNC|ASYNC option")
				return
			}
			h.scripts.flush()
			if h.up == nil {
				s.W.Simple("OK")
			}
		})
	default:
		return false
	}
	return true
}

// andScriptExists turns the upstream's SCRIPT EXISTS reply r (an array of
// 0 and 1, at the end of the reply buffer) into the answer for both: 1
// only where this instance remembers the script too. Anything else (an
// error) is left as it is.
func (h *Handler) andScriptExists(r []byte, shas [][]byte) {
	nl := bytes.Index(r, []byte("\r\n"))
	if len(r) == 0 || r[0] != '*' || nl < 0 {
		return
	}
	// Each element is ":0\r\n" or ":1\r\n", so a miss here is a byte
	// changed in place.
	el := r[nl+2:]
	for i, sha := range shas {
		if len(el) < 4*(i+1) || el[4*i] != ':' {
			return
		}
		if _, ok := h.scripts.get(string(sha)); !ok {
			el[4*i+1] = '0'
		}
	}
}

// strs converts arguments for go-redis; keys and values stay binary-safe.
func strs(args [][]byte) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = string(a)
	}
	return out
}

// writeValue writes a node's reply. Status replies arrive from go-redis as
// strings and are written as bulk strings (the one detail lost).
func writeValue(w *resp.Writer, v any) {
	switch t := v.(type) {
	case nil:
		w.Null()
	case int64:
		w.Int(t)
	case string:
		w.BulkString(t)
	case backends.ReplyError:
		w.Error(string(t))
	case []any:
		w.Array(len(t))
		for _, e := range t {
			writeValue(w, e)
		}
	default:
		w.Error("ERR transparent mode: a node gave a reply of an unexpected type")
	}
}

// noMajorityError is the reply when the nodes that answered disagree.
type noMajorityError struct {
	need, total, answered, ways int
}

func (e *noMajorityError) Error() string {
	return "ERR no majority: the lock nodes disagree (no reply is shared by " + strconv.Itoa(e.need) + " of " +
		strconv.Itoa(e.total) + " nodes; " + strconv.Itoa(e.answered) + " answered with " + strconv.Itoa(e.ways) +
		" different replies); not guessing"
}

// agree returns the reply shared by a majority of total nodes. Too few
// answers is a NOQUORUM; answers that split is a noMajorityError.
func agree(rs []backends.NodeReply, total int) (any, error) {
	need := total/2 + 1
	counts := map[string]int{}
	vals := map[string]any{}
	answered := 0
	for _, r := range rs {
		if r.Err != nil {
			continue
		}
		answered++
		k := valueKey(nil, r.Val)
		counts[string(k)]++
		vals[string(k)] = r.Val
	}
	for k, c := range counts {
		if c >= need {
			return vals[k], nil
		}
	}
	if answered < need {
		return nil, noQuorum(rs, total)
	}
	return nil, &noMajorityError{need: need, total: total, answered: answered, ways: len(counts)}
}

// agreeTTL is the PTTL/TTL rule. -2 (no key) and -1 (no expiry) must be
// shared by a majority like any reply. When a majority has a TTL, the
// reply is the largest t such that a majority has at least t left: the
// time for which the key is still on a majority, the conservative answer
// for a holder.
func agreeTTL(rs []backends.NodeReply, total int) (any, error) {
	need := total/2 + 1
	var ttls []int64
	for _, r := range rs {
		if n, ok := r.Val.(int64); ok && r.Err == nil && n >= 0 {
			ttls = append(ttls, n)
		}
	}
	if len(ttls) >= need {
		sort.Slice(ttls, func(i, j int) bool { return ttls[i] > ttls[j] })
		return ttls[need-1], nil
	}
	return agree(rs, total)
}

// fenceNoQuorum restates Fence's no-quorum error, which counts and names
// only the holders it was sent to, over every node, as PROTOCOL.md's
// -NOQUORUM k/n does: k the nodes that answered the script less the
// holders whose fence could not be raised, and the list those holders
// and the nodes the script failed on. Before, k was the holders at the
// fence: the nodes that answered the script without holding were in
// neither, and those it failed on named nowhere. Other errors are left
// as they are.
func fenceNoQuorum(rs []backends.NodeReply, err error) error {
	var nq *quorum.NoQuorumError
	if !errors.As(err, &nq) {
		return err
	}
	e, _ := noQuorum(rs, nq.Total).(*quorum.NoQuorumError)
	e.OK -= len(nq.Failures)
	e.Failures = append(e.Failures, nq.Failures...)
	// In the nodes' order, as the quorum names them.
	order := make(map[string]int, len(rs))
	for i, r := range rs {
		order[r.Node] = i
	}
	sort.SliceStable(e.Failures, func(i, j int) bool { return order[e.Failures[i].Node] < order[e.Failures[j].Node] })
	return e
}

func noQuorum(rs []backends.NodeReply, total int) error {
	e := &quorum.NoQuorumError{Total: total}
	for _, r := range rs {
		if r.Err != nil {
			e.Failures = append(e.Failures, quorum.NodeError{Node: r.Node, Err: r.Err})
		} else {
			e.OK++
		}
	}
	return e
}

// valueKey encodes v unambiguously, to count equal replies.
func valueKey(b []byte, v any) []byte {
	switch t := v.(type) {
	case nil:
		return append(b, 'n')
	case int64:
		return strconv.AppendInt(append(b, 'i'), t, 10)
	case string:
		b = strconv.AppendInt(append(b, 's'), int64(len(t)), 10)
		return append(append(b, ':'), t...)
	case backends.ReplyError:
		b = strconv.AppendInt(append(b, 'e'), int64(len(t)), 10)
		return append(append(b, ':'), t...)
	case []any:
		b = strconv.AppendInt(append(b, 'a'), int64(len(t)), 10)
		b = append(b, ':')
		for _, e := range t {
			b = valueKey(b, e)
		}
		return b
	default:
		return append(b, '?')
	}
}

// scriptDecision is what a script's fan-out comes to.
type scriptDecision struct {
	reply any
	err   error
	// undo lists, per node, the value to compare-and-delete for each key
	// ("" for none).
	undo map[int][]string
	// lost marks the nodes in undo whose answer was lost: there the value
	// may be another client's hold, one that locks with the same value,
	// which the script found and left (see backends.Fanout.Undo).
	lost map[int]bool
	// holders and written, for an acquisition that stands: the nodes that
	// hold it and, per key, the value the script wrote (nil: none).
	holders []int
	written []*string
	// lease is the acquisition's lease on a majority of its holders.
	lease time.Duration
	// tried counts the keys the script wrote a new value to on some node:
	// its acquisition attempts, whether they stood or were rolled back.
	tried int
}

// decideScript applies the acquisition rule to a script's replies (see the
// comment at the top of this file). elapsed is the time the fan-out took;
// drift gives the allowance for a lease.
//
// ttlReply: the script returns a key's PTTL or TTL when it does not
// acquire (scriptReturnsTTL), and the "not acquired" replies are agreed on
// by PTTL's rule: the nodes' times left differ by milliseconds.
func decideScript(rs []backends.NodeReply, total int, elapsed time.Duration, drift func(time.Duration) time.Duration, maxTTL time.Duration, ttlReply bool) scriptDecision {
	need := total/2 + 1
	agreeNot := agree
	if ttlReply {
		agreeNot = agreeTTL
	}
	// unbounded: a node where the script left a key it wrote without an
	// expiry, or with one beyond maxTTL. That is no lock: it would outlive
	// its holder, and the restart quarantine counts on max_ttl (as SET
	// without PX/EX or above max_ttl is refused).
	unbounded := false
	// written[j] is the value the script wrote to key j, if any node wrote
	// one.
	var written []*string
	wrote := map[int]bool{}
	for i, r := range rs {
		if r.Err != nil {
			continue
		}
		for j, w := range r.Writes {
			if written == nil {
				written = make([]*string, len(r.Writes))
			}
			if w.Wrote {
				wrote[i] = true
				if written[j] == nil {
					v := w.Value
					written[j] = &v
				}
			}
		}
	}
	if len(wrote) == 0 {
		v, err := agreeNot(rs, total)
		return scriptDecision{reply: v, err: err}
	}
	tried := 0
	for _, w := range written {
		if w != nil {
			tried++
		}
	}
	// Holders: nodes on which every written key holds the written value,
	// whether this script or an earlier one with the same value put it
	// there. Their lease is the shortest TTL among those keys.
	var holders []int
	lease := map[int]int64{}
	for i, r := range rs {
		if r.Err != nil || len(r.Writes) != len(written) {
			continue
		}
		holds, min := true, int64(-1)
		for j, w := range r.Writes {
			if written[j] == nil {
				continue
			}
			if !w.Exists || w.Value != *written[j] {
				holds = false
				break
			}
			if w.PTTL < 0 || (maxTTL > 0 && time.Duration(w.PTTL)*time.Millisecond > maxTTL) {
				unbounded, holds = true, false
				break
			}
			if min < 0 || w.PTTL < min {
				min = w.PTTL
			}
		}
		if holds {
			holders = append(holders, i)
			lease[i] = min
		}
	}
	if len(holders) >= need {
		hr := make([]backends.NodeReply, 0, len(holders))
		var leases []int64
		for _, i := range holders {
			hr = append(hr, rs[i])
			leases = append(leases, lease[i])
		}
		v, err := agree(hr, total)
		// An error reply is no grant, whatever the script wrote before
		// it failed (or the node refused it: a non-string value at
		// another of its lock keys): the client is told it failed and
		// will not release, so what it wrote is rolled back.
		if _, failed := v.(backends.ReplyError); err == nil && !failed && validLease(leases, need, elapsed, drift) {
			// validLease sorted the leases longest first.
			return scriptDecision{reply: v, holders: holders, written: written, lease: time.Duration(leases[need-1]) * time.Millisecond, tried: tried}
		}
	}
	// Not acquired: roll back every write of this script, and on the
	// nodes that did not answer compare-and-delete the values written
	// elsewhere, in case the script ran there before the answer was lost
	// (as LOCK's roll-back releases on every node), unless a grant's fence
	// is stored with the value there: then it is the hold of a client
	// that locks with the same value, which the script found and left.
	d := scriptDecision{undo: map[int][]string{}, lost: map[int]bool{}, tried: tried}
	for i, r := range rs {
		vals := make([]string, len(written))
		switch {
		case wrote[i]:
			for j, w := range r.Writes {
				if w.Wrote {
					vals[j] = w.Value
				}
			}
		case r.Err != nil:
			for j, w := range written {
				if w != nil {
					vals[j] = *w
				}
			}
			d.lost[i] = true
		default:
			continue
		}
		d.undo[i] = vals
	}
	// The client gets the "not acquired" reply of the nodes that answered
	// without writing, when they agree on one.
	var others []backends.NodeReply
	answered := 0
	for i, r := range rs {
		if r.Err == nil {
			answered++
			if !wrote[i] {
				others = append(others, r)
			}
		}
	}
	if unbounded {
		d.err = errScriptUnbounded
		return d
	}
	if answered < need {
		d.err = noQuorum(rs, total)
		return d
	}
	if v, err := agreeNot(others, len(others)*2-1); len(others) > 0 && err == nil {
		d.reply = v
		return d
	}
	// Otherwise the error a majority answered (the script failed after
	// its writes, or was refused), now that its writes are rolled back.
	if v, err := agree(rs, total); err == nil {
		if _, failed := v.(backends.ReplyError); failed {
			d.reply = v
			return d
		}
	}
	d.err = &scriptFailedError{holders: len(holders), need: need, total: total}
	return d
}

// validLease reports whether the lease on a majority of the holders, less
// the time spent and the drift, is positive. A lease of -1 is a key
// without expiry.
func validLease(leases []int64, need int, elapsed time.Duration, drift func(time.Duration) time.Duration) bool {
	sort.Slice(leases, func(i, j int) bool {
		a, b := leases[i], leases[j]
		if a < 0 {
			return b >= 0
		}
		return b >= 0 && a > b
	})
	l := leases[need-1]
	if l < 0 {
		return true
	}
	ttl := time.Duration(l) * time.Millisecond
	return ttl-elapsed-drift(ttl) > 0
}

// scriptFailedError is the reply when a script's acquisition was rolled
// back and no node gave a "not acquired" reply to pass on.
// errScriptUnbounded answers a script that left a lock key without an
// expiry or beyond locks.max_ttl, after its writes were rolled back.
// boundedScript is body followed by a check of its lock keys' expiry: one
// the script left without an expiry (PERSIST, SET without PX) or beyond
// maxTTL (a renewal script's PEXPIRE of an hour) is set to maxTTL, and the
// script answers errScriptClamped instead of its own reply. No lock may
// outlive locks.max_ttl: a node restarted without its data is kept out of
// every quorum for that long (plus drift), no longer, and a lock that
// outlived it could be granted again there. Plain PEXPIRE and SET are
// refused above it before they run; a script's values cannot be read
// before it runs, so its effect is checked in the same call, atomically.
// The client is told its renewal failed, which is the safe side (it
// stops relying on the lock); the lock stays, for max_ttl at most.
//
// The body runs as a function of its own, so its return is that
// function's; it is given the chunk's varargs, so a body that names
// "..." compiles and sees what it would unwrapped (none); a first line "#!lua …" (script flags) stays first. The
// function's header shares the body's first line, so that an error names
// the line of the client's script, as Redis would (user_script:N).
func boundedScript(body string, maxTTL time.Duration) string {
	head := ""
	if strings.HasPrefix(body, "#!") {
		i := strings.IndexByte(body, '\n')
		if i < 0 {
			i = len(body) - 1
		}
		head, body = body[:i+1], body[i+1:]
	}
	limit := "p < 0"
	if maxTTL > 0 {
		limit = "p < 0 or p > " + strconv.FormatInt(maxTTL.Milliseconds(), 10)
	}
	maxMs := maxTTL.Milliseconds()
	if maxMs <= 0 {
		maxMs = int64(defaultUnboundedMs)
	}
	return head + "local lockproxy_reply = (function(...) " + body + "\nend)(...)\n" +
		"for _, k in ipairs(KEYS) do\n" +
		"  local p = redis.call('pttl', k)\n" +
		"  if p ~= -2 and (" + limit + ") then\n" +
		"    redis.call('pexpire', k, " + strconv.FormatInt(maxMs, 10) + ")\n" +
		"    return redis.error_reply([==[" + errScriptClamped + "]==])\n" +
		"  end\n" +
		"end\n" +
		"return lockproxy_reply\n"
}

// errScriptClamped is a script's answer when it left a lock key without
// an expiry or beyond locks.max_ttl (see boundedScript). Redis prefixes
// an error_reply's text with nothing, so it carries its own ERR.
const errScriptClamped = "ERR transparent mode: the script left a lock key without an expiry or beyond locks.max_ttl; lockproxy set its expiry to max_ttl and answers this instead of the script's reply: a lock needs PX or EX within max_ttl"

// defaultUnboundedMs is the expiry boundedScript gives a lock key a
// script left without one when no locks.max_ttl is set: ten minutes, the
// default max_ttl.
const defaultUnboundedMs = 600000

var errScriptUnbounded = errors.New("ERR transparent mode: the script left a lock key without an expiry or beyond locks.max_ttl, so it was rolled back; a lock needs PX or EX within max_ttl")

type scriptFailedError struct{ holders, need, total int }

func (e *scriptFailedError) Error() string {
	return "ERR transparent mode: the script's write is held on " + strconv.Itoa(e.holders) + " of " + strconv.Itoa(e.total) +
		" nodes; it needs " + strconv.Itoa(e.need) + " with agreeing replies and a lease left after the time taken, so it was rolled back"
}

// globMatch matches key against a Redis-style glob: * any run of bytes
// (including '/', unlike path.Match), ? one byte, [abc], [^a-z], \x.
func globMatch(pattern string, key []byte) bool {
	p, k := 0, 0
	starP, starK := -1, 0
	for k < len(key) {
		if p < len(pattern) {
			switch c := pattern[p]; c {
			case '*':
				starP, starK = p, k
				p++
				continue
			case '?':
				p++
				k++
				continue
			case '[':
				if end, ok := matchClass(pattern, p, key[k]); ok {
					p = end
					k++
					continue
				}
			case '\\':
				if p+1 < len(pattern) && pattern[p+1] == key[k] {
					p += 2
					k++
					continue
				}
			default:
				if c == key[k] {
					p++
					k++
					continue
				}
			}
		}
		if starP < 0 {
			return false
		}
		starK++
		p, k = starP+1, starK
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

// matchClass matches b against the class starting at pattern[p] == '['
// and returns the index after the class.
func matchClass(pattern string, p int, b byte) (int, bool) {
	i := p + 1
	neg := false
	if i < len(pattern) && pattern[i] == '^' {
		neg = true
		i++
	}
	matched := false
	first := true
	for i < len(pattern) && (pattern[i] != ']' || first) {
		first = false
		lo := pattern[i]
		if lo == '\\' && i+1 < len(pattern) {
			i++
			lo = pattern[i]
		}
		hi := lo
		if i+2 < len(pattern) && pattern[i+1] == '-' && pattern[i+2] != ']' {
			hi = pattern[i+2]
			if hi == '\\' && i+3 < len(pattern) {
				i++
				hi = pattern[i+2]
			}
			i += 2
		}
		if lo > hi {
			lo, hi = hi, lo
		}
		if b >= lo && b <= hi {
			matched = true
		}
		i++
	}
	if i >= len(pattern) {
		return 0, false // unterminated: conf rejects such patterns
	}
	return i + 1, matched != neg
}

// globPos is one position of a glob: a '*', or one byte out of set.
type globPos struct {
	star bool
	set  [4]uint64 // bit b: byte b may be here
}

func (g *globPos) add(lo, hi byte) {
	for b := int(lo); b <= int(hi); b++ {
		g.set[b/64] |= 1 << (b % 64)
	}
}

var anyByte = globPos{set: [4]uint64{^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0)}}

// globPositions reads a Redis glob into positions. Where Redis's reading
// (stringmatchlen) and globMatch's could differ, or a class is not closed
// (a class that starts with ']', a range that ends in ']' or '\' or
// starts with an escaped byte), the rest of the glob is read as '*':
// more keys than either reading matches, so that an intersection is
// never missed.
func globPositions(g []byte) []globPos {
	var out []globPos
	star := func() []globPos {
		if len(out) == 0 || !out[len(out)-1].star {
			out = append(out, globPos{star: true})
		}
		return out
	}
	for i := 0; i < len(g); i++ {
		switch c := g[i]; c {
		case '*':
			star()
		case '?':
			out = append(out, anyByte)
		case '\\':
			if i+1 < len(g) {
				i++
			}
			var p globPos
			p.add(g[i], g[i])
			out = append(out, p)
		case '[':
			j := i + 1
			neg := j < len(g) && g[j] == '^'
			if neg {
				j++
			}
			if j < len(g) && g[j] == ']' {
				return star()
			}
			var p globPos
			for {
				switch {
				case j >= len(g):
					return star()
				case g[j] == ']':
				case g[j] == '\\' && j+1 < len(g):
					if j+2 < len(g) && g[j+2] == '-' {
						return star()
					}
					p.add(g[j+1], g[j+1])
					j += 2
					continue
				case j+1 < len(g) && g[j+1] == '-':
					if j+2 >= len(g) || g[j+2] == ']' || g[j+2] == '\\' {
						return star()
					}
					p.add(min(g[j], g[j+2]), max(g[j], g[j+2]))
					j += 3
					continue
				default:
					p.add(g[j], g[j])
					j++
					continue
				}
				break
			}
			if neg {
				for k := range p.set {
					p.set[k] = ^p.set[k]
				}
			}
			out = append(out, p)
			i = j
		default:
			var p globPos
			p.add(c, c)
			out = append(out, p)
		}
	}
	return out
}

// maxGlobProduct bounds the work of globsIntersect: past it, the answer
// is "they may" (a glob of that length is no one's lock pattern or key
// pattern).
const maxGlobProduct = 1 << 20

// globsIntersect reports whether some key matches both globs (positions
// from globPositions). It walks the pairs of positions both globs can be
// at after the same bytes: (len(a), len(b)) reached is a common key.
func globsIntersect(a, b []globPos) bool {
	n, m := len(a)+1, len(b)+1
	if n*m > maxGlobProduct {
		return true
	}
	seen := make([]bool, n*m)
	stack := []int{0}
	seen[0] = true
	push := func(i, j int) {
		if k := i*m + j; !seen[k] {
			seen[k] = true
			stack = append(stack, k)
		}
	}
	for len(stack) > 0 {
		k := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		i, j := k/m, k%m
		if i == len(a) && j == len(b) {
			return true
		}
		// A '*' may match nothing.
		if i < len(a) && a[i].star {
			push(i+1, j)
		}
		if j < len(b) && b[j].star {
			push(i, j+1)
		}
		if i == len(a) || j == len(b) {
			continue
		}
		// One byte both may take; a '*' takes any and stays.
		sa, sb := a[i], b[j]
		if sa.star {
			sa = anyByte
		}
		if sb.star {
			sb = anyByte
		}
		if sa.set[0]&sb.set[0] == 0 && sa.set[1]&sb.set[1] == 0 && sa.set[2]&sb.set[2] == 0 && sa.set[3]&sb.set[3] == 0 {
			continue
		}
		ni, nj := i+1, j+1
		if a[i].star {
			ni = i
		}
		if b[j].star {
			nj = j
		}
		push(ni, nj)
	}
	return false
}

// patternMayMatchLockKey reports whether a KEYS or SCAN MATCH glob may
// match a key that matches one of the lock patterns.
func (h *Handler) patternMayMatchLockKey(glob []byte) bool {
	g := globPositions(glob)
	for _, lp := range h.patterns {
		if globsIntersect(g, globPositions([]byte(lp))) {
			return true
		}
	}
	return false
}

// longestLiteral is the longest run of plain bytes in a glob, which every
// key it matches contains.
func longestLiteral(g string) string {
	var best, run []byte
	end := func() {
		if len(run) > len(best) {
			best = append(best[:0], run...)
		}
		run = run[:0]
	}
	for i := 0; i < len(g); i++ {
		switch c := g[i]; c {
		case '*', '?':
			end()
		case '\\':
			if i+1 < len(g) {
				i++
			}
			run = append(run, g[i])
		case '[':
			end()
			j := i + 1
			if j < len(g) && g[j] == '^' {
				j++
			}
			for j++; j < len(g) && g[j] != ']'; j++ {
				if g[j] == '\\' {
					j++
				}
			}
			i = j
		default:
			run = append(run, c)
		}
	}
	end()
	return string(best)
}

// namesLockKey reports whether s, a string literal of a script, names a
// key matching lock pattern lp or its beginning ('lock:' .. ARGV[1]): it
// starts with the pattern's literal start and some lock key starts with
// it. For a pattern whose literal start is empty ('*:lock:*'), whether it
// contains the pattern's longest literal run.
func namesLockKey(lp string, s []byte) bool {
	if lit := globLiteral(lp); len(lit) > 0 {
		if !bytes.HasPrefix(s, lit) {
			return false
		}
		g := make([]globPos, 0, len(s)+1)
		for _, c := range s {
			var p globPos
			p.add(c, c)
			g = append(g, p)
		}
		return globsIntersect(globPositions([]byte(lp)), append(g, globPos{star: true}))
	}
	run := longestLiteral(lp)
	return run != "" && bytes.Contains(s, []byte(run))
}

// luaStrings calls f with the value of each string literal of a Lua 5.1
// chunk, as Redis's Lua reads it (llex.c), until f returns true; it reports
// whether f did. Quoted strings ('…', "…") have their escapes decoded:
// \a \b \f \n \r \t \v, \ddd in decimal, a backslash before a line break
// is that line break, before any other byte that byte (Lua 5.1 has no \x,
// \z or \u). Long strings ([[…]], [==[…]==]) take no escapes, drop a line
// break right after their opening and read every line break as \n.
// Comments are skipped; a line comment ends at \n or \r. A string left
// open runs to the end of its line (a long one to the end of the chunk):
// Lua refuses such a chunk, so what is read there can only err on the side
// of refusing. The value is decoded because a check on the text as written
// would let 'lock\58k1' (lock:k1) through.
func luaStrings(src []byte, f func([]byte) bool) bool {
	isNL := func(c byte) bool { return c == '\n' || c == '\r' }
	// skipNL skips the line break at i: \n, \r, \r\n or \n\r, one line
	// as Lua's inclinenumber counts it.
	skipNL := func(i int) int {
		c := src[i]
		i++
		if i < len(src) && isNL(src[i]) && src[i] != c {
			i++
		}
		return i
	}
	// longOpen returns the level of a long bracket [=*[ at src[i], or -1.
	longOpen := func(i int) int {
		if i >= len(src) || src[i] != '[' {
			return -1
		}
		j := i + 1
		for j < len(src) && src[j] == '=' {
			j++
		}
		if j < len(src) && src[j] == '[' {
			return j - i - 1
		}
		return -1
	}
	// longBody returns the value of the long bracket of level lvl opened
	// at i, and where it ends.
	longBody := func(i, lvl int) ([]byte, int) {
		from := i + lvl + 2
		if from < len(src) && isNL(src[from]) {
			from = skipNL(from)
		}
		closing := "]" + strings.Repeat("=", lvl) + "]"
		body, end := src[from:], len(src)
		if k := bytes.Index(src[from:], []byte(closing)); k >= 0 {
			body, end = src[from:from+k], from+k+len(closing)
		}
		if bytes.IndexByte(body, '\r') >= 0 {
			var nb []byte
			for k := 0; k < len(body); {
				if c := body[k]; isNL(c) {
					nb = append(nb, '\n')
					k++
					if k < len(body) && isNL(body[k]) && body[k] != c {
						k++
					}
					continue
				}
				nb = append(nb, body[k])
				k++
			}
			body = nb
		}
		return body, end
	}
	var buf []byte
	for i := 0; i < len(src); {
		switch c := src[i]; {
		case c == '-' && i+1 < len(src) && src[i+1] == '-':
			i += 2
			if lvl := longOpen(i); lvl >= 0 {
				_, i = longBody(i, lvl)
				continue
			}
			for i < len(src) && !isNL(src[i]) {
				i++
			}
		case c == '\'' || c == '"':
			buf = buf[:0]
			j := i + 1
			for j < len(src) && src[j] != c && !isNL(src[j]) {
				if src[j] != '\\' {
					buf = append(buf, src[j])
					j++
					continue
				}
				j++
				if j >= len(src) {
					break
				}
				switch e := src[j]; {
				case isNL(e):
					buf = append(buf, '\n')
					j = skipNL(j)
				case e >= '0' && e <= '9':
					n := 0
					for k := 0; k < 3 && j < len(src) && src[j] >= '0' && src[j] <= '9'; k++ {
						n = n*10 + int(src[j]-'0')
						j++
					}
					buf = append(buf, byte(min(n, 255))) // Lua refuses above 255
				default:
					if d, ok := luaEscapes[e]; ok {
						e = d
					}
					buf = append(buf, e)
					j++
				}
			}
			if f(buf) {
				return true
			}
			i = j + 1
		case c == '[':
			lvl := longOpen(i)
			if lvl < 0 {
				i++
				continue
			}
			body, end := longBody(i, lvl)
			if f(body) {
				return true
			}
			i = end
		default:
			i++
		}
	}
	return false
}

// luaEscapes are Lua 5.1's one-letter escapes in quoted strings.
var luaEscapes = map[byte]byte{'a': '\a', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t', 'v': '\v'}

// lockKeyOutsideKeys returns the refusal of a script whose ARGV or body
// (nil when unknown) names a key matching lock_patterns, or "".
// Transparent mode goes by a script's KEYS: a script that names its lock
// key elsewhere is relayed to the upstream, where it would take another
// key of the same name while the lock is held on the lock nodes, or, with
// lock keys in KEYS, run on the nodes with that name used as it is,
// outside lockproxy's key namespace: no one's lock either way. The body
// is searched for string literals that name one ('lock:x', 'lock:' ..
// ARGV[1]); like the redlock.key_prefix check it guards against
// mistakes, and a script that builds the name at run time is not caught.
func (h *Handler) lockKeyOutsideKeys(argv [][]byte, body []byte) string {
	return h.lockKeyOutside(argv, body, false)
}

// lockKeyOutside is lockKeyOutsideKeys; with onNodes (a script whose KEYS
// are lock keys, served on the lock nodes) an ARGV counts as a lock key
// only by a pattern with a literal byte, as string literals in the body
// do (namesLockKey): a pattern of wildcards alone ('*', lock_patterns
// for a lockproxy that serves nothing but locks) matches every token and
// TTL a lock script is given, which are not key names, and refusing them
// refused every compare-and-delete. Relayed, such an argument may still
// be the name of a key the script takes on the upstream: every argument
// matching a pattern is refused there.
func (h *Handler) lockKeyOutside(argv [][]byte, body []byte, onNodes bool) string {
	if len(h.patterns) == 0 {
		return ""
	}
	const must = "; lock keys must be passed in KEYS, through which the lock nodes serve them"
	for _, a := range argv {
		if h.argIsLockKey(a, onNodes) {
			return "ERR transparent mode: the script's argument '" + relay.Clip(string(a)) +
				"' is a lock key (matching lock_patterns)" + must
		}
	}
	if !h.mayNameLockKey(body) {
		return ""
	}
	var named []byte
	luaStrings(body, func(lit []byte) bool {
		for _, lp := range h.patterns {
			if namesLockKey(lp, lit) {
				named = bytes.Clone(lit) // lit is luaStrings' buffer
				return true
			}
		}
		return false
	})
	if named != nil {
		return "ERR transparent mode: the script's string '" + relay.Clip(string(named)) +
			"' names a lock key (matching lock_patterns)" + must
	}
	return ""
}

// argIsLockKey reports whether a script's argument a matches a lock
// pattern; with literalOnly, one that has a literal byte (see
// lockKeyOutside).
func (h *Handler) argIsLockKey(a []byte, literalOnly bool) bool {
	if !literalOnly {
		return h.isLockKey(a)
	}
	for _, p := range h.patterns {
		if longestLiteral(p) != "" && globMatch(p, a) {
			return true
		}
	}
	return false
}

// mayNameLockKey reports whether body contains the text namesLockKey
// looks for in its string literals, or an escape that could spell it
// ('lock\58k'): most bodies do neither, and are not read further.
func (h *Handler) mayNameLockKey(body []byte) bool {
	if bytes.IndexByte(body, '\\') >= 0 {
		return true
	}
	for _, lp := range h.patterns {
		text := globLiteral(lp)
		if len(text) == 0 {
			text = []byte(longestLiteral(lp))
		}
		if len(text) > 0 && bytes.Contains(body, text) {
			return true
		}
	}
	return false
}

// onLockKeys reports whether transparent mode would serve args (a command
// on lock keys), without serving it: the relay uses it to collect the
// replies of relayed commands before a transparent reply is written, and
// to refuse lock-key commands inside MULTI (they run on the lock nodes,
// not in the upstream's transaction).
func (h *Handler) onLockKeys(args [][]byte) bool {
	if len(h.patterns) == 0 || len(args) < 2 {
		return false
	}
	var buf [16]byte
	switch name := string(resp.Lower(buf[:], args[0])); name {
	case "script":
		return true
	case "eval", "evalsha", "eval_ro", "evalsha_ro":
		if len(args) < 3 {
			return false
		}
		nk, ok := resp.ParseInt(args[2])
		if !ok || nk < 0 || nk > int64(len(args)-3) {
			return false
		}
		for _, k := range args[3 : 3+nk] {
			if h.isLockKey(k) {
				return true
			}
		}
		return false
	case "exists", "del", "unlink":
		for _, k := range args[1:] {
			if h.isLockKey(k) {
				return true
			}
		}
		return false
	case "set", "get", "pttl", "ttl", "pexpire", "expire":
		return h.isLockKey(args[1])
	default:
		return unsupportedOnLockKeys[name] && h.isLockKey(args[1])
	}
}
