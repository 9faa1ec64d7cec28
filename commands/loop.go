package commands

import (
	"github.com/lockproxy/lockproxy/resp"
)

// LoopSafe implements resp.LoopHandler: the batches the server's event loop
// may run. Two kinds qualify, so that ServeRESP and EndBatch never wait:
//
//   - every command relayed on the shared upstream connection as it is
//     (relayPlain), with the replies written by the upstream's reader
//     (EndBatch, CollectAsync): the hot path of a drop-in proxy;
//   - every command one of the connection commands a client library sends
//     when it connects (loopLocal), answered from memory.
//
// A mix of the two is not: a local reply between relayed ones makes the
// relay wait for the replies before it. Nor is anything on a connection
// with a transaction, a pinned upstream connection or relayed replies
// pending, nor a command on lock keys (served by the lock nodes), nor a
// relayed command before the upstream's COMMAND table is read: checking it
// would dial the upstream for the table.
func (h *Handler) LoopSafe(s *resp.Session, cmds [][][]byte) bool {
	return h.loopKind(s, cmds) != batchNone
}

// ServeLoop implements resp.LoopHandler: it serves the batches LoopSafe
// admits. Relayed commands go straight to the relay: the checks ServeRESP
// would make on the way are the ones loopKind just made.
func (h *Handler) ServeLoop(s *resp.Session, cmds [][][]byte) bool {
	switch h.loopKind(s, cmds) {
	case batchRelay:
		rs := h.relayState(s)
		for _, args := range cmds {
			h.rm.relayed.Inc()
			h.relayAdd(s, rs, args)
		}
		h.EndBatch(s)
	case batchLocal:
		for _, args := range cmds {
			h.ServeRESP(s, args)
		}
		h.EndBatch(s)
	default:
		return false
	}
	return true
}

// LoopReady implements resp.LoopHandler: whether s's state lets the event
// loop serve it: no transaction, pinned upstream connection or relayed
// replies pending, and no KEEPALIVE lock (whose watchdog the connection's
// goroutine tends).
func (h *Handler) LoopReady(s *resp.Session) bool {
	c, ok := s.Data.(*conn)
	if !ok {
		return true
	}
	if c.rl != nil && (c.rl.multi || c.rl.pipe.Pinned() || c.rl.pipe.Pending() > 0) {
		return false
	}
	// A user with permissions has each command checked, on its goroutine;
	// a WATCH of lock keys makes the commands after it answered here or
	// refused (lockTx), which the loop's relaying would skip.
	return c.ka == nil && c.perm == nil && c.lw == nil
}

// What kind of batch the event loop may run.
const (
	batchNone = iota
	batchRelay
	batchLocal
)

func (h *Handler) loopKind(s *resp.Session, cmds [][][]byte) int {
	if len(cmds) == 0 || len(cmds) >= maxPending {
		return batchNone
	}
	if !h.LoopReady(s) {
		return batchNone
	}
	authed := !h.authRequired()
	if c, ok := s.Data.(*conn); ok {
		authed = authed || c.authed
	}
	var nbuf [32]byte
	relayed, local := 0, 0
	for _, args := range cmds {
		if len(args) == 0 {
			return batchNone
		}
		name := resp.Lower(nbuf[:], args[0])
		switch {
		case loopLocal(string(name), args) && (authed || noAuthNeeded(args[0])):
			local++
		case authed && h.up != nil && h.up.KnowsCommands() && table[string(name)] == nil && relayPlain(string(name), args) &&
			!h.onLockKeys(args) && !h.lockKeyCommand(args) && h.up.Check(name, args) == nil:
			relayed++
		default:
			return batchNone
		}
	}
	switch {
	case local == 0:
		return batchRelay
	case relayed == 0:
		return batchLocal
	}
	return batchNone
}

// loopLocal names the commands the event loop answers: those a client
// library sends as it connects (ioredis's ready check is INFO), answered
// from memory. RESET, SELECT, QUIT, COMMAND and CLIENT LIST are not among
// them.
func loopLocal(name string, args [][]byte) bool {
	switch name {
	case "ping", "echo", "hello", "auth", "info":
		return true
	case "client":
		if len(args) < 2 {
			return false
		}
		for _, sub := range []string{"SETNAME", "GETNAME", "ID", "SETINFO", "INFO", "NO-EVICT", "NO-TOUCH"} {
			if resp.EqualFold(args[1], sub) {
				return true
			}
		}
	}
	return false
}

// lockKeyCommand tells, erring towards yes, whether transparent mode may
// serve args (a command on lock keys, or a script): any argument that
// looks like a lock key will do. Such a command runs on the lock nodes,
// which the event loop must not wait for.
func (h *Handler) lockKeyCommand(args [][]byte) bool {
	if len(h.patterns) == 0 || len(args) < 2 {
		return false
	}
	var buf [16]byte
	switch string(resp.Lower(buf[:], args[0])) {
	case "eval", "evalsha", "eval_ro", "evalsha_ro", "script", "fcall", "fcall_ro":
		return true
	}
	for _, a := range args[1:] {
		if h.isLockKey(a) {
			return true
		}
	}
	return false
}
