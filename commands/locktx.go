package commands

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/relay"
	"github.com/lockproxy/lockproxy/resp"
)

// Transactions on lock keys: the optimistic release and extension that
// StackExchange.Redis (LockRelease, LockExtend), go-redis (Client.Watch)
// and redis-py (pipeline watch) write by hand:
//
//	WATCH k, GET k (the client compares), MULTI, DEL k | PEXPIRE k ms, EXEC
//
// A WATCH that names only lock keys is served here: each key's value is
// read from the lock nodes as transparent GET reads it and remembered for
// the connection. The MULTI after it is served here too, and queues only
// DEL/UNLINK, PEXPIRE/EXPIRE, GET, EXISTS, PTTL and TTL of the watched
// keys, and the keyless commands lockproxy answers itself (PING, ECHO,
// UNWATCH, SELECT, CLIENT SETNAME|GETNAME: lockTxQueueLocal), answered
// in their place in EXEC's reply. EXEC runs one script on every node, in the MULTI with the holds'
// line-up that every transparent write gets (Fanout.Run): on each node it
// runs the queued commands only where every watched key still holds the
// value WATCH saw (or is still missing, for a key that was), so a node
// where another client holds the key is left alone; EXEC answers the
// commands' replies when a majority of the nodes ran them, nil when a
// majority found a watched key changed, and an error otherwise. A DEL there
// is the transparent compare-and-delete script's release (announced to
// waiters, the hold's keys lined up), a PEXPIRE its renewal.

// lockWatch is a connection's WATCH of lock keys and the transaction after
// it, in conn.lw; nil when there is none.
type lockWatch struct {
	keys []string
	vals []*string // the value each key had at WATCH; nil: it had none
	// failed is set when WATCH could not read a key from the nodes: the
	// transaction then does not run, and EXEC answers this.
	failed string
	multi  bool // MULTI was served
	dirty  bool // a command was refused in the transaction: EXEC aborts
	ops    []lockTxOp
}

// lockTxOp is a command queued in a lock-key transaction.
type lockTxOp struct {
	name string   // lower case
	keys []int    // indexes into lockWatch.keys
	args []string // the arguments after the key (PEXPIRE's TTL and options)
	// fail is the error EXEC answers in this command's place, which is
	// not run: a PEXPIRE or EXPIRE whose TTL or options Redis refuses
	// when it runs the command. Redis queues it and answers the error
	// inside EXEC's reply, running the rest.
	fail string
	// local, for a keyless command lockproxy answers itself (PING, ECHO,
	// UNWATCH, SELECT, CLIENT SETNAME|GETNAME), is the command as the
	// client sent it: not sent to the nodes, it is answered by
	// lockproxy in its place in EXEC's reply, when EXEC runs, as Redis
	// runs it then.
	local [][]byte
}

// Bounds per connection: a WATCH costs a read on every node per key, and
// the transaction is one script.
const (
	maxLockWatchKeys = 64
	maxLockTxOps     = 64
	// maxLockTxArgs bounds the arguments of one queued command (a DEL
	// naming a watched key over and over, a PEXPIRE repeating an
	// option): the script calls each with unpack, which Lua refuses
	// beyond 8000 values, failing the script after the commands before
	// it ran (a DEL's release then stands under an error reply).
	maxLockTxArgs = 1024
)

// lockTxQueued names the commands a lock-key transaction may queue.
var lockTxQueued = map[string]bool{
	"del": true, "unlink": true, "pexpire": true, "expire": true, "get": true, "exists": true, "pttl": true, "ttl": true,
}

// insideMulti is Redis's refusal of MULTI and WATCH (with their arity
// right) in a transaction, which does not abort it.
var insideMulti = map[string]string{
	"multi": "ERR MULTI calls can not be nested",
	"watch": "ERR WATCH inside MULTI is not allowed",
}

// lockTxSupported is what a lock-key transaction queues, for errors.
const lockTxSupported = "DEL, UNLINK, PEXPIRE, EXPIRE, GET, EXISTS, PTTL and TTL of the watched lock keys, " +
	"and PING, ECHO, UNWATCH, SELECT of the database in use and CLIENT SETNAME|GETNAME, which lockproxy answers itself"

// lockTx serves WATCH, MULTI, the commands queued after it, EXEC, DISCARD
// and UNWATCH on a connection that watches lock keys, and the first WATCH
// of lock keys. It reports whether it answered; QUIT and RESET end the
// state and go on to be served as always.
func (h *Handler) lockTx(s *resp.Session, cs *conn, name string, args [][]byte) bool {
	lw := cs.lw
	rs := cs.rl
	if lw == nil {
		if name == "unwatch" && h.up == nil && !cs.tx {
			// Nothing watched (a WATCH refused, say): Redis answers OK.
			// Without an upstream nothing else would, and redis-py's
			// Pipeline.reset sends it for a pipeline that watched and did
			// not EXEC, and fails on an error reply.
			if len(args) != 1 {
				wrongArity(s, name)
				return true
			}
			s.W.Simple("OK")
			return true
		}
		if name == "watch" && h.up == nil && len(args) < 2 && !cs.tx {
			// Redis's arity error; without an upstream nothing else
			// would answer it but "unknown command".
			wrongArity(s, name)
			return true
		}
		if name != "watch" || len(args) < 2 || cs.tx {
			return false
		}
		if rs != nil && rs.multi && h.classify(args[1:]) != noLockKeys {
			// WATCH of lock keys inside a relayed MULTI: Redis refuses
			// any WATCH there, without aborting the transaction; the
			// relay would refuse it for its lock keys, and abort it.
			h.relayFlush(s)
			s.W.Error(insideMulti[name])
			return true
		}
		if rs != nil && (rs.multi || rs.broken || rs.pipe.Tunneling()) {
			// WATCH inside a relayed MULTI, or in pub/sub mode: the
			// relay answers it (relayRoute).
			return false
		}
		switch h.classify(args[1:]) {
		case noLockKeys:
			return false
		case mixedKeys:
			h.relayFlush(s)
			h.tCount(s, "watch", func() {
				s.W.Error("ERR transparent mode: 'watch' mixes lock keys (matching lock_patterns) and other keys; " +
					"lock keys are served by the lock nodes and other keys are not, so one transaction cannot span both")
			})
			return true
		}
		h.relayFlush(s)
		if rs != nil && (rs.watch || rs.watchLost) {
			h.tCount(s, "watch", func() {
				s.W.Error("ERR transparent mode: this connection already watches keys on the upstream; a transaction cannot span " +
					"lock keys (lock_patterns, on the lock nodes) and other keys: UNWATCH first")
			})
			return true
		}
		lw = &lockWatch{}
		h.tCount(s, "watch", func() {
			if h.lockWatchKeys(s, lw, args[1:]) {
				cs.lw = lw
			}
		})
		return true
	}
	switch name {
	case "quit", "reset":
		cs.lw = nil
		return false
	}
	if rs != nil && (rs.broken || rs.pipe.Tunneling()) {
		// In pub/sub mode (a SUBSCRIBE after the WATCH): the relay
		// answers or refuses every command (relayRoute); the watch stays
		// for after it.
		return false
	}
	switch name {
	case "watch", "unwatch", "multi", "exec", "discard":
		cs.lastCmd = name
	}
	if !lw.multi {
		switch name {
		case "watch":
			if len(args) < 2 {
				h.relayFlush(s)
				wrongArity(s, name)
				return true
			}
			h.relayFlush(s)
			h.tCount(s, "watch", func() {
				if h.classify(args[1:]) != allLockKeys {
					s.W.Error("ERR transparent mode: this connection watches lock keys (matching lock_patterns), which are on the lock nodes; " +
						"a transaction cannot span them and other keys: UNWATCH first")
					return
				}
				h.lockWatchKeys(s, lw, args[1:])
			})
		case "unwatch":
			h.relayFlush(s)
			if len(args) != 1 {
				// Refused, and the watch stays, as in Redis.
				wrongArity(s, name)
				return true
			}
			cs.lw = nil
			s.W.Simple("OK")
		case "multi":
			h.relayFlush(s)
			if len(args) != 1 {
				wrongArity(s, name)
				return true
			}
			lw.multi = true
			s.W.Simple("OK")
		case "exec", "discard":
			h.relayFlush(s)
			switch {
			case name == "exec" && len(args) != 1:
				// Redis refuses an EXEC with arguments as an aborted
				// transaction, and unwatches (execCommandAbort).
				cs.lw = nil
				s.W.Error(execAbort(args))
			case len(args) != 1:
				wrongArity(s, name)
			default:
				// The watch stays, as in Redis.
				s.W.Error("ERR " + strings.ToUpper(name) + " without MULTI")
			}
		default:
			return false
		}
		return true
	}
	// In the transaction: nothing here is relayed.
	h.relayFlush(s)
	switch name {
	case "exec":
		cs.lw = nil
		h.tCount(s, "exec", func() {
			if lw.dirty || len(args) != 1 {
				s.W.Error(execAbort(args))
				return
			}
			h.lockExec(s, lw)
		})
	case "discard":
		if len(args) != 1 {
			lw.dirty = true
			wrongArity(s, name)
			return true
		}
		cs.lw = nil
		s.W.Simple("OK")
	case "multi", "watch":
		if name == "multi" && len(args) != 1 || name == "watch" && len(args) < 2 {
			// Redis checks the arity first, and flags the transaction.
			lw.dirty = true
			wrongArity(s, name)
			return true
		}
		// Redis answers it and leaves the transaction as it was.
		s.W.Error(insideMulti[name])
	default:
		if lockTxQueued[name] {
			cs.lastCmd = name
		}
		if why := h.lockTxQueue(s, lw, name, args); why != "" {
			lw.dirty = true
			h.metrics.commands.WithLabelValues("transaction", "error").Inc()
			s.W.Error(why)
			return true
		}
		s.W.Simple("QUEUED")
	}
	return true
}

// lockWatchKeys reads keys from the lock nodes, as transparent GET does,
// and adds them to lw with the values read. A key watched already keeps
// the value it was first watched with, as a Redis WATCH of a watched key
// changes nothing. It writes WATCH's reply and reports whether lw is to
// be kept: a WATCH refused for its keys leaves the connection as it was,
// one whose read failed is kept, failed, so that its transaction does not
// run (its client may not look at WATCH's reply before EXEC).
func (h *Handler) lockWatchKeys(s *resp.Session, lw *lockWatch, keys [][]byte) bool {
	if h.fanout == nil {
		s.W.Error(errTransparentFanout)
		return false
	}
	if db := selectedDB(s); db != 0 {
		s.W.Error("ERR transparent mode: lock keys (lock_patterns) live in database 0 of the lock nodes, and this connection selected database " +
			strconv.Itoa(db) + "; SELECT 0 to use them (LOCK and the other lock commands ignore SELECT)")
		return false
	}
	var fresh []string
	for _, k := range keys {
		if err := h.limits.checkKey(k); err != nil {
			s.W.Error(err.Error())
			return false
		}
		if lw.index(string(k)) < 0 && !containsString(fresh, string(k)) {
			fresh = append(fresh, string(k))
		}
	}
	if len(lw.keys)+len(fresh) > maxLockWatchKeys {
		s.W.Error("ERR transparent mode: at most " + strconv.Itoa(maxLockWatchKeys) + " lock keys may be watched on one connection")
		return false
	}
	if len(fresh) == 0 {
		s.W.Simple("OK")
		return true
	}
	rs := h.fanout.RunEach(s.Context(), "get", fresh, true)
	per := make([]backends.NodeReply, len(rs))
	vals := make([]*string, len(fresh))
	for i := range fresh {
		for j, r := range rs {
			per[j] = backends.NodeReply{Node: r.Node, Err: r.Err}
			if r.Err != nil {
				continue
			}
			if vs, ok := r.Val.([]any); ok && len(vs) == len(fresh) {
				per[j].Val = vs[i]
			} else {
				per[j].Err = errors.New("commands: a node gave a reply of another shape to WATCH's reads")
			}
		}
		v, err := agree(per, h.fanout.NodeCount())
		if err == nil {
			switch t := v.(type) {
			case nil:
				continue
			case string:
				vals[i] = &t
				continue
			case backends.ReplyError:
				err = t
			default:
				err = errors.New("ERR transparent mode: a node gave a reply of an unexpected type")
			}
		}
		// The transaction cannot be protected: it will not run.
		before := s.W.Len()
		h.tReply(s, "watch", nil, err)
		msg := strings.TrimSuffix(strings.TrimPrefix(string(s.W.Bytes()[before:]), "-"), "\r\n")
		lw.failed = "ERR transparent mode: the WATCH of lock key '" + relay.Clip(fresh[i]) + "' could not read it from the lock nodes (" +
			msg + "); the transaction was not run"
		lw.keys = append(lw.keys, fresh...)
		lw.vals = append(lw.vals, vals...)
		return true
	}
	lw.keys = append(lw.keys, fresh...)
	lw.vals = append(lw.vals, vals...)
	s.W.Simple("OK")
	return true
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// index is the position of key among the watched keys, or -1.
func (lw *lockWatch) index(key string) int {
	for i, k := range lw.keys {
		if k == key {
			return i
		}
	}
	return -1
}

// lockTxQueue queues a command of a lock-key transaction, or returns why
// it is refused (which aborts the transaction at EXEC).
func (h *Handler) lockTxQueue(s *resp.Session, lw *lockWatch, name string, args [][]byte) string {
	refused := "ERR '" + relay.Clip(name) + "' is not queued: a transaction after WATCH of lock keys runs on the lock nodes and queues only " +
		lockTxSupported + "; EXEC will abort the transaction"
	var keys [][]byte
	var rest []string
	var fail string
	switch name {
	case "get", "pttl", "ttl":
		if len(args) != 2 {
			return "ERR wrong number of arguments for '" + name + "' command"
		}
		keys = args[1:]
	case "exists", "del", "unlink":
		if len(args) < 2 {
			return "ERR wrong number of arguments for '" + name + "' command"
		}
		keys = args[1:]
	case "ping", "echo", "unwatch", "select", "client", "hello":
		return h.lockTxQueueLocal(s, lw, name, args)
	case "pexpire", "expire":
		if len(args) < 3 {
			return "ERR wrong number of arguments for '" + name + "' command"
		}
		if lw.index(string(args[1])) < 0 {
			return refused
		}
		// A TTL or option Redis refuses is its error when the command
		// runs, inside EXEC's reply, not a refusal that aborts the
		// transaction. A TTL above locks.max_ttl, which Redis would
		// run, is refused now and aborts it: answered inside EXEC's
		// reply, it would be lost on a client that only looks at
		// whether EXEC ran (StackExchange.Redis's LockExtend answers
		// true), which would take its lock for extended.
		var maxTTL bool
		if fail, maxTTL = h.expireRefusalKind(name, args); maxTTL {
			return fail
		}
		keys = args[1:2]
		rest = strs(args[2:])
	default:
		if h.up == nil && lookup(args[0]) == nil && !h.onLockKeys(args) {
			// Nothing here or anywhere would run it: Redis's refusal of
			// an unknown command, which aborts the transaction as there.
			return unknownCommand(args)
		}
		return refused
	}
	if len(args) > maxLockTxArgs {
		return "ERR transparent mode: a command queued in a transaction on lock keys takes at most " + strconv.Itoa(maxLockTxArgs) + " arguments"
	}
	op := lockTxOp{name: name, args: rest, fail: fail}
	for _, k := range keys {
		i := lw.index(string(k))
		if i < 0 {
			return refused
		}
		op.keys = append(op.keys, i)
	}
	if db := selectedDB(s); db != 0 {
		return "ERR transparent mode: lock keys (lock_patterns) live in database 0 of the lock nodes, and this connection selected database " +
			strconv.Itoa(db) + "; SELECT 0 to use them"
	}
	if trackedLockRead(s, name) {
		return "ERR transparent mode: lock keys (lock_patterns) are served by the lock nodes, which send no CLIENT TRACKING invalidations, " +
			"so a cached reply would never be invalidated; read lock keys on a connection without CLIENT TRACKING"
	}
	if len(lw.ops) >= maxLockTxOps {
		return "ERR transparent mode: at most " + strconv.Itoa(maxLockTxOps) + " commands may be queued in a transaction on lock keys"
	}
	lw.ops = append(lw.ops, op)
	return ""
}

// lockTxQueueLocal queues a keyless command that lockproxy answers itself
// in a lock-key transaction, or returns why it is refused (which aborts
// the transaction at EXEC). Redis queues these and runs them when EXEC
// runs: so does lockproxy, answering each in its place in EXEC's reply,
// with what it answers outside a transaction, once the lock nodes ran the
// rest. Arity is checked now, as Redis checks it when it queues; a
// command's other errors (PING's extra arguments, a client name with a
// space) are its reply inside EXEC's, as there. A command that would
// change what the lock nodes' part means or needs the upstream is refused
// now, saying why.
func (h *Handler) lockTxQueueLocal(s *resp.Session, lw *lockWatch, name string, args [][]byte) string {
	switch name {
	case "echo", "unwatch":
		// Their arities, 2 and 1, as Redis's (UNWATCH is not in the
		// command table: the relay or lockTx answers it).
		if want := map[string]int{"echo": 2, "unwatch": 1}[name]; len(args) != want {
			return "ERR wrong number of arguments for '" + name + "' command"
		}
	case "select":
		if len(args) != 2 {
			return "ERR wrong number of arguments for 'select' command"
		}
		if n, ok := resp.ParseInt(args[1]); h.up != nil && ok && int(n) != selectedDB(s) {
			// Without an upstream lockproxy has database 0 alone, and
			// answers SELECT of another as Redis answers one out of range.
			return "ERR transparent mode: SELECT of another database cannot be queued in a transaction on lock keys: " +
				"the transaction runs on the lock nodes, whose lock keys live in database 0, and the upstream, " +
				"where the database is selected, has no part in it; SELECT before WATCH or after EXEC; EXEC will abort the transaction"
		}
	case "client":
		if len(args) < 2 {
			return "ERR wrong number of arguments for 'client' command"
		}
		var buf [32]byte
		sub := string(resp.Lower(buf[:], args[1]))
		var sc *Command
		if c := lookup(args[0]); c != nil {
			sc = c.Subs[sub]
		}
		switch {
		case sc == nil && h.up == nil:
			return "ERR unknown subcommand '" + string(cString(args[1], 128)) + "'. Try CLIENT HELP."
		case sub != "setname" && sub != "getname":
			return "ERR transparent mode: 'client|" + relay.Clip(sub) + "' cannot be queued in a transaction on lock keys, " +
				"which queues of the connection's commands only PING, ECHO, UNWATCH, SELECT of the database in use and CLIENT SETNAME|GETNAME; " +
				"send it before WATCH or after EXEC; EXEC will abort the transaction"
		case !arityOK(sc.Arity, len(args)):
			return "ERR wrong number of arguments for 'client|" + sub + "' command"
		}
	case "hello":
		// Run by EXEC, it would switch the protocol half-way through
		// EXEC's reply (Redis does), and with an upstream it is the
		// upstream connection's protocol too.
		return "ERR transparent mode: HELLO cannot be queued in a transaction on lock keys: it changes the connection's protocol, " +
			"which lockproxy does not change inside EXEC's reply; send it before WATCH or after EXEC; EXEC will abort the transaction"
	}
	if len(lw.ops) >= maxLockTxOps {
		return "ERR transparent mode: at most " + strconv.Itoa(maxLockTxOps) + " commands may be queued in a transaction on lock keys"
	}
	if len(args) > maxLockTxArgs {
		return "ERR transparent mode: a command queued in a transaction on lock keys takes at most " + strconv.Itoa(maxLockTxArgs) + " arguments"
	}
	local := make([][]byte, len(args)) // args is the reader's buffer
	for i, a := range args {
		local[i] = bytes.Clone(a)
	}
	lw.ops = append(lw.ops, lockTxOp{name: name, local: local})
	return ""
}

// lockTxLocal answers a queued keyless command (lockTxOp.local) inside
// EXEC's reply, as lockproxy answers it outside a transaction.
func (h *Handler) lockTxLocal(s *resp.Session, args [][]byte) {
	switch strings.ToLower(string(args[0])) {
	case "ping":
		h.ping(s, args)
	case "echo":
		h.echo(s, args)
	case "unwatch":
		// EXEC unwatches the keys anyway.
		s.W.Simple("OK")
	case "select":
		if h.up == nil {
			h.selectDB(s, args)
		} else if _, ok := resp.ParseInt(args[1]); !ok {
			s.W.Error(errNotInteger.Error())
		} else {
			s.W.Simple("OK") // the database in use (lockTxQueueLocal)
		}
	case "client":
		if resp.EqualFold(args[1], "SETNAME") {
			h.clientSetName(s, args)
		} else {
			h.clientGetName(s, args)
		}
	default:
		s.W.Error("ERR transparent mode: '" + relay.Clip(string(args[0])) + "' was queued and cannot be answered")
	}
}

// lockTxScript runs a lock-key transaction on one node. KEYS are the
// watched keys; ARGV starts with, for each, "1" and the value WATCH saw, or
// "0" and "" for a key that had none; then each queued command as its
// name, its number of keys, their indexes in KEYS, its number of other
// arguments, and those. It returns false, which is nil, when a watched
// key holds anything else, and runs nothing; else the array of the
// commands' replies.
const lockTxScript = `local n = #KEYS
for i = 1, n do
  local v = redis.call('get', KEYS[i])
  if ARGV[2*i-1] == '1' then
    if v ~= ARGV[2*i] then return false end
  elseif v then
    return false
  end
end
local out = {}
local j = 2*n + 1
while j <= #ARGV do
  local cmd = {ARGV[j]}
  local nk = tonumber(ARGV[j+1])
  for a = 1, nk do cmd[#cmd+1] = KEYS[tonumber(ARGV[j+1+a])] end
  j = j + 2 + nk
  local na = tonumber(ARGV[j])
  for a = 1, na do cmd[#cmd+1] = ARGV[j+a] end
  j = j + 1 + na
  out[#out+1] = redis.call(unpack(cmd))
end
return out`

// lockExec runs lw's transaction on the lock nodes and writes EXEC's reply.
func (h *Handler) lockExec(s *resp.Session, lw *lockWatch) {
	if lw.failed != "" {
		s.W.Error(lw.failed)
		return
	}
	if h.fanout == nil {
		s.W.Error(errTransparentFanout)
		return
	}
	n := len(lw.keys)
	cmd := make([]string, 0, 3+3*n+4*len(lw.ops))
	cmd = append(cmd, "eval", lockTxScript, strconv.Itoa(n))
	cmd = append(cmd, lw.keys...)
	for _, v := range lw.vals {
		if v == nil {
			cmd = append(cmd, "0", "")
		} else {
			cmd = append(cmd, "1", *v)
		}
	}
	readOnly := true
	ttl := make([]bool, 0, len(lw.ops))
	for _, op := range lw.ops {
		if op.fail != "" || op.local != nil {
			continue
		}
		cmd = append(cmd, op.name, strconv.Itoa(len(op.keys)))
		for _, k := range op.keys {
			cmd = append(cmd, strconv.Itoa(k+1))
		}
		cmd = append(cmd, strconv.Itoa(len(op.args)))
		cmd = append(cmd, op.args...)
		switch op.name {
		case "del", "unlink", "pexpire", "expire":
			readOnly = false
		}
		ttl = append(ttl, op.name == "pttl" || op.name == "ttl")
	}
	keyAt := make([]int, n)
	for i := range keyAt {
		keyAt[i] = 3 + i
	}
	began := time.Now()
	rs := h.fanout.Run(s.Context(), cmd, keyAt, readOnly)
	v, aborted, err := decideExec(rs, h.fanout.NodeCount(), ttl)
	switch {
	case err != nil:
		h.tReply(s, "exec", nil, err)
	case aborted:
		s.W.NullArray()
	default:
		out := withFailed(lw.ops, v)
		h.countExec(lw, out, began)
		vs, ok := out.([]any)
		if !ok || len(vs) != len(lw.ops) {
			writeValue(s.W, out) // cannot be: withFailed answers one per command
			return
		}
		s.W.Array(len(vs))
		for i, op := range lw.ops {
			if op.local != nil {
				h.lockTxLocal(s, op.local)
				continue
			}
			writeValue(s.W, vs[i])
		}
	}
}

// countExec brings the locks counted here (heldLocks) up to date with a
// lock-key transaction begun at began that a majority ran (out: its
// replies, one per queued command): there each watched key still held
// the value WATCH saw, so a DEL or UNLINK released that value's lock and
// a PEXPIRE or EXPIRE that answered 1 renewed it (StackExchange.Redis's
// LockRelease and LockExtend).
func (h *Handler) countExec(lw *lockWatch, out any, began time.Time) {
	replies, ok := out.([]any)
	if !ok || len(replies) != len(lw.ops) {
		return
	}
	for i, op := range lw.ops {
		if op.fail != "" {
			continue
		}
		switch op.name {
		case "del", "unlink":
			if _, ok := replies[i].(int64); ok {
				for _, k := range op.keys {
					h.held.keyGone(lw.keys[k], began)
				}
			}
		case "pexpire", "expire":
			if n, ok := replies[i].(int64); !ok || n != 1 || len(op.keys) != 1 || len(op.args) == 0 {
				continue
			}
			k := op.keys[0]
			ttl := expireTTL(op.name, []byte(op.args[0]))
			switch {
			case ttl <= 0:
				h.held.keyGone(lw.keys[k], began)
			case lw.vals[k] != nil:
				h.held.keyHolds(lw.keys[k], *lw.vals[k], ttl, began)
			}
		}
	}
}

// withFailed is EXEC's reply: the replies of the commands run (ran, from
// decideExec) with each failed command's error in its place.
func withFailed(ops []lockTxOp, ran any) any {
	vs, ok := ran.([]any)
	if !ok {
		return ran
	}
	out := make([]any, 0, len(ops))
	for _, op := range ops {
		if op.fail != "" {
			out = append(out, backends.ReplyError(op.fail))
			continue
		}
		if op.local != nil {
			out = append(out, nil) // answered by lockTxLocal
			continue
		}
		if len(vs) == 0 {
			return ran // cannot be: decideExec answers one reply per command run
		}
		out = append(out, vs[0])
		vs = vs[1:]
	}
	return out
}

// decideExec is what a lock-key transaction's EXEC answers, from each
// node's reply to lockTxScript: aborted when a majority of all total
// nodes found a watched key changed (and ran nothing); the array of the
// commands' replies when a majority ran them, each reply the one a
// majority of all nodes shares (by PTTL's rule for those ttl marks); else
// a majority's error reply, or the reason there is no majority.
func decideExec(rs []backends.NodeReply, total int, ttl []bool) (v any, aborted bool, err error) {
	need := total/2 + 1
	nils, ran := 0, 0
	for _, r := range rs {
		if r.Err != nil {
			continue
		}
		switch t := r.Val.(type) {
		case nil:
			nils++
		case []any:
			if len(t) == len(ttl) {
				ran++
			}
		}
	}
	switch {
	case nils >= need:
		return nil, true, nil
	case ran < need:
		v, err := agree(rs, total)
		if err == nil {
			if _, ok := v.(backends.ReplyError); !ok {
				// Cannot be: a shared nil or array is counted above.
				err = errors.New("commands: EXEC's replies could not be decided")
			}
		}
		return v, false, err
	}
	out := make([]any, len(ttl))
	per := make([]backends.NodeReply, len(rs))
	for i := range ttl {
		for j, r := range rs {
			per[j] = backends.NodeReply{Node: r.Node, Err: r.Err}
			if r.Err != nil {
				continue
			}
			if vs, ok := r.Val.([]any); ok && len(vs) == len(ttl) {
				per[j].Val = vs[i]
			} else {
				per[j].Err = errNotRun
			}
		}
		var e any
		var err error
		if ttl[i] {
			e, err = agreeTTL(per, total)
		} else {
			e, err = agree(per, total)
		}
		if err != nil {
			return nil, false, err
		}
		out[i] = e
	}
	return out, false, nil
}

// errNotRun marks a node that did not run a transaction the majority ran.
var errNotRun = errors.New("the transaction did not run on this node")
