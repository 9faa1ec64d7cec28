package commands

import (
	"bytes"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/relay"
	"github.com/lockproxy/lockproxy/resp"
)

// The relay: commands lockproxy does not serve itself go to the upstream
// Redis (package relay). Replies to relayed commands of one batch are
// collected together at the end of the batch (EndBatch), before a local
// command, or before a command that needs them first; they are spliced into
// the reply buffer where they belong, so that replies keep the order of the
// commands even when a local reply was written meanwhile.

// maxPending bounds the relayed commands one client may have queued before
// lockproxy collects their replies: memory per connection stays bounded
// however long the pipeline.
const maxPending = 1024

// relayConn is a connection's relay state, in conn.rl.
type relayConn struct {
	pipe *relay.Pipe
	at   int // where in s.W the replies of the pending commands go
	// State that keeps the connection pinned to its own upstream one.
	multi    bool
	dirty    bool // a command was refused inside MULTI: EXEC aborts
	watch    bool
	db       int
	tracking bool
	// tracks: the client's last CLIENT TRACKING said ON (tracking keeps
	// the pin after OFF; this follows OFF too). Reads of lock keys are
	// refused meanwhile (trackedLockRead).
	tracks bool
	// trackOpt is the mode of the CLIENT TRACKING ON in force: 'i' OPTIN,
	// 'o' OPTOUT, 0 another (every read tracked). cachingNext is what the
	// last CLIENT CACHING said ('y', 'n', 0 none), for the command after
	// it; cachingNow is that for the command being served (serve sets
	// both). In OPTIN mode only a read right after CLIENT CACHING YES
	// is tracked, in OPTOUT mode every read but one right after CLIENT
	// CACHING NO.
	trackOpt, cachingNext, cachingNow byte
	// armed: a CLIENT CACHING went to the pinned connection, and the
	// upstream applies it to the next command it runs there that is no
	// CLIENT command (outside MULTI; EXEC's commands too). Redis applies
	// it to the client's next such command, which may be one lockproxy
	// answers itself (PING, a lock command) or refuses: spent counts
	// those served since (serve), counted tells whether the command
	// being served is one, and disarmCaching spends the upstream's flag
	// where Redis would have.
	armed, counted bool
	spent          int
	// redirTo is the client id of the last CLIENT TRACKING … REDIRECT,
	// and redirUp the upstream id relayed in its place (clientids.go),
	// for the replies that give that id back (redirectInfo); 0 when
	// there was none.
	redirTo, redirUp int64
	// redirPush is {redirUp, redirTo} for the push a RESP3 client gets
	// when the target of its redirection is gone (redirBroken), read on
	// the upstream connection's reader; nil when there is none.
	redirPush atomic.Pointer[[2]int64]
	// monitor: the tunnel is MONITOR's, not pub/sub's. The upstream feeds
	// the monitor every command, the marker PING too, and has no
	// subscription to count: only RESET or QUIT ends it.
	monitor bool
	// broken: the pinned connection was lost, and with it the state (a
	// WATCH, a transaction, a database, subscriptions) the client's later
	// commands were sent in. None of them is served, not even on another
	// connection, and the client's connection closes, as Redis closing
	// it would.
	broken bool
	// watchLost: a WATCH got no pinned connection, so the transaction
	// after it cannot be protected: it fails (MULTI, its commands and
	// EXEC are refused) until EXEC, DISCARD or UNWATCH.
	watchLost bool
	// waiter: the client sent WAIT or WAITAOF, which count the writes
	// made on the connection they run on: it keeps its pinned connection
	// from then on, so that its later writes and WAITs go on the same one.
	waiter bool
	// failedTx: MULTI failed through lockproxy (its WATCH got no
	// connection, or it got none itself) and was never sent: the commands
	// queued after it are refused and EXEC aborts, until EXEC, DISCARD or
	// RESET. Not "no pinned connection": a SELECT, WAIT or CLIENT
	// TRACKING may have pinned one meanwhile, on which the queued
	// commands would run at once, outside any transaction.
	failedTx bool
	// linger: the pinned connection carried every write of the client and
	// nothing else holds it any more (after EXEC, UNWATCH, SELECT 0): it
	// is kept so that a WAIT next counts those writes (a pipeline, MULTI
	// … EXEC, then WAIT), and given back before the next command that may
	// write, which then goes over a shared connection.
	linger bool
	// light: the pinned connection holds no state the client's later
	// commands depend on, only WAIT's count (waiter, linger). Losing it
	// (a read timeout, say) then answers the command with an error and
	// the client carries on, as on a shared connection, instead of being
	// disconnected. Atomic: the lost hook reads it on the upstream
	// connection's reader goroutine.
	light atomic.Bool
	// wroteOn is the pinned connection (Pipe.PinID) that carried every
	// command of the client that may write, 0 when there was none, or
	// wroteElsewhere when one went over a shared connection or one the
	// client no longer has: WAIT cannot count those (waitCounts).
	wroteOn uint64
}

// wroteElsewhere is relayConn.wroteOn for writes WAIT cannot count.
const wroteElsewhere = ^uint64(0)

// errLostState answers the commands of a client whose pinned connection
// was lost (relayConn.broken).
const errLostState = "ERR upstream unavailable: the upstream connection that held this connection's state " +
	"(a WATCH, a transaction, a database, subscriptions) was lost; the connection is closing"

func (h *Handler) relayState(s *resp.Session) *relayConn {
	c := state(s)
	if c.rl == nil {
		// A lost pinned connection closes the client's, as Redis closing
		// it would: the client's library reconnects and, for example,
		// subscribes again, instead of waiting for messages that no
		// longer come.
		// Not when the connection held only WAIT's count (light): that
		// is recovered from in relayCollect.
		rs := &relayConn{}
		rs.pipe = h.up.NewPipe(s.ID(), func(f []byte) { h.relayPush(s, rs.redirBroken(f)) }, func() {
			if !rs.light.Load() {
				s.Close()
			}
		})
		c.rl = rs
	}
	return c.rl
}

// relayPush writes an out-of-band frame (a pub/sub message, a RESP3 push)
// to the client from the upstream connection's reader. A frame the
// client's socket does not take waits in its output buffer (resp), and a
// subscriber whose unread frames pass limits.max_output_bytes_pubsub is
// closed, as Redis closes one past its pub/sub output limit. Push refuses
// a frame only while a few wait for the connection's lock; past pushWait
// the frame is dropped (counted).
func (h *Handler) relayPush(s *resp.Session, f []byte) {
	deadline := time.Now().Add(pushWait)
	for !s.Push(f) {
		if s.Context().Err() != nil {
			return
		}
		if time.Now().After(deadline) {
			h.rm.dropped.Inc()
			return
		}
		time.Sleep(time.Millisecond)
	}
}

const pushWait = 5 * time.Second

// relayRoute runs before the command table for connections in a state that
// changes where commands go: in a transaction or pub/sub mode everything is
// relayed (lock commands refused in MULTI), and a local command first
// collects the replies of relayed commands before it. It reports whether it
// served the command. name is args[0] in lower case, cmd its table entry
// (nil when lockproxy does not serve it).
func (h *Handler) relayRoute(s *resp.Session, args [][]byte, name []byte, cmd *Command) bool {
	c, _ := s.Data.(*conn)
	if c == nil || c.rl == nil {
		return false
	}
	rs := c.rl
	if rs.broken {
		// Its pinned connection was lost: nothing more runs, here or
		// upstream (the connection is closing).
		s.W.Error(errLostState)
		return true
	}
	local := cmd != nil
	if local && cmd.Subs != nil {
		var sbuf [32]byte
		local = len(args) >= 2 && cmd.Subs[string(resp.Lower(sbuf[:], args[1]))] != nil
	}
	isReset := string(name) == "quit" || string(name) == "reset"
	if rs.pipe.Tunneling() {
		what := ""
		if !isReset {
			what = h.notInTunnel(string(name), args, cmd)
			if what == "" && rs.redirUp != 0 && string(name) == "client" && redirectInfoCommand(args) {
				// Its reply, tunnelled as it comes, could not have the
				// upstream id turned back (redirectInfo).
				what = strings.ToLower("client|" + string(args[1]))
			}
			if what == "" && !(local && rs.pipe.PinnedProto() == 3 && answeredInTunnel(string(name), args)) {
				h.relayTunnel(s, rs, string(name), args)
				return true
			}
		}
		// A reply of lockproxy's own (a refusal, QUIT's, RESET's, a
		// connection command's) goes after those of the commands
		// tunnelled before it, as Redis would answer them: QUIT must not
		// close the connection, nor RESET drop the upstream one, with
		// replies still on their way.
		if !h.tunnelSync(s, rs) {
			return true
		}
		if what != "" && rs.pipe.Tunneling() {
			s.W.Error("ERR '" + relay.Clip(what) + "' is not allowed in pub/sub mode through lockproxy; unsubscribe first")
			return true
		}
		// QUIT or RESET, a connection command (answeredInTunnel), or the
		// tunnel ended meanwhile: served as on any other connection.
	}
	switch {
	case rs.multi && !isReset:
		if n := string(name); rs.failedTx && n != "exec" && n != "discard" {
			// MULTI got no upstream connection (or its WATCH none) and
			// was not sent: what the client queues after it must not run
			// outside the transaction, on the shared connection or on a
			// connection pinned for another reason.
			rs.dirty = true
			s.W.Error("ERR the transaction failed through lockproxy: it has no upstream connection (see the reply to MULTI or WATCH); " +
				"nothing is queued, and EXEC will abort")
			return true
		}
		if n := string(name); (n == "keys" || n == "scan") && h.up.KeyPrefix() != "" && listingMayReach(n, args, h.up.KeyPrefix()) {
			// Outside a transaction their replies are filtered of the
			// lock keys; EXEC's reply is not. A pattern that cannot
			// match a key under the prefix needs no filtering.
			rs.dirty = true
			s.W.Error("ERR '" + n + "' is not allowed inside MULTI through lockproxy: EXEC's reply could not be filtered of lock keys (redlock.key_prefix); run it outside the transaction")
			return true
		}
		if cmd == nil && len(h.patterns) > 0 && string(name) == "script" {
			if len(args) > 1 && (resp.EqualFold(args[1], "LOAD") || resp.EqualFold(args[1], "EXISTS") || resp.EqualFold(args[1], "FLUSH")) {
				// Served partly here (tScript): LOAD and FLUSH change what
				// this instance remembers for EVALSHA, and EXISTS answers
				// for both; EXEC's reply is not read for them.
				rs.dirty = true
				s.W.Error("ERR 'script|" + strings.ToLower(string(args[1])) + "' is not allowed inside MULTI through lockproxy: " +
					"lockproxy remembers scripts for EVALSHA on lock keys outside transactions only; run it before MULTI")
				return true
			}
			// Other subcommands name no lock key: relayed below.
		} else if cmd == nil && h.onLockKeys(args) {
			rs.dirty = true
			s.W.Error("ERR '" + relay.Clip(string(args[0])) + "' on a lock key is not allowed inside MULTI: lock keys (lock_patterns) are served by the lock nodes, not in the upstream's transaction")
			return true
		}
		if cmd != nil && cmd.Group == groupLock {
			rs.dirty = true
			s.W.Error("ERR '" + cmd.Name + "' is not allowed inside MULTI: lock commands run on the lock nodes, not in the upstream's transaction")
			return true
		}
		if what := stateChangeInMulti(string(name), args); what != "" {
			rs.dirty = true
			s.W.Error("ERR '" + what + "' is not allowed inside MULTI through lockproxy: it changes the connection's state, which lockproxy tracks outside transactions only")
			return true
		}
		if local && answeredInTunnel(string(name), args) {
			// Queued, EXEC would run it upstream and give the pinned
			// connection's answer: its id (which names another client
			// here), its name, the upstream's clients or INFO.
			what := string(name)
			if what == "client" {
				what += "|" + strings.ToLower(string(args[1]))
			}
			rs.dirty = true
			s.W.Error("ERR '" + what + "' is not allowed inside MULTI through lockproxy: lockproxy answers it, and inside a transaction " +
				"the upstream connection would; run it outside the transaction")
			return true
		}
		if string(name) == "client" && rs.redirUp != 0 && redirectInfoCommand(args) {
			// EXEC's reply would give the upstream id of the
			// redirection's target, which redirectInfo turns back into
			// the client's outside transactions only.
			rs.dirty = true
			s.W.Error("ERR '" + strings.ToLower(string(args[0])+"|"+string(args[1])) + "' is not allowed inside MULTI through lockproxy " +
				"after a CLIENT TRACKING … REDIRECT: its reply would give the upstream's id of the client redirected to; run it outside the transaction")
			return true
		}
		if string(name) == "client" {
			if what := clientIDCommand(args); what != "" {
				// The id is translated to the upstream connection the
				// client named has now (clientids.go); at EXEC it may
				// have another, or none.
				rs.dirty = true
				s.W.Error("ERR '" + what + "' naming a client by id is not allowed inside MULTI through lockproxy: " +
					"the id is translated to that client's upstream connection when the command runs, which inside a transaction is not when it is sent")
				return true
			}
		}
		h.relayNamed(s, args, name)
		return true
	}
	if local && rs.pipe.Pending() > 0 {
		h.relayCollect(s, rs, true)
	}
	return false
}

// bcastReachesPrefix refuses CLIENT TRACKING ON … BCAST (args) whose
// invalidations may name keys under prefix, the lock key prefix: one with
// no PREFIX (every key), or with a PREFIX that a key under prefix may
// start with. Relayed commands may not touch or list those keys, and a
// broadcast tracker would learn each one written on the upstream. It
// returns the refusal, or "".
func bcastReachesPrefix(args [][]byte, prefix string) string {
	if prefix == "" || len(args) < 3 || !resp.EqualFold(args[2], "ON") || !hasWord(args, "BCAST") {
		return ""
	}
	var prefixes int
	for i := 3; i+1 < len(args); i++ {
		if resp.EqualFold(args[i], "PREFIX") {
			p := args[i+1]
			if bytes.HasPrefix(p, []byte(prefix)) || bytes.HasPrefix([]byte(prefix), p) {
				return "ERR CLIENT TRACKING BCAST with PREFIX '" + relay.Clip(string(p)) + "' would report lockproxy's keys (prefix '" +
					relay.Clip(prefix) + "'); give prefixes outside it"
			}
			prefixes++
			i++
		}
	}
	if prefixes == 0 {
		return "ERR CLIENT TRACKING BCAST without PREFIX would report every key, lockproxy's own (prefix '" +
			relay.Clip(prefix) + "') among them; give one or more PREFIX outside it"
	}
	return ""
}

// listingMayReach tells whether KEYS or SCAN (name, in lower case) may
// list a key that starts with prefix: KEYS unless its pattern cannot
// match one, SCAN unless it has a MATCH and none of its MATCH values (Redis
// uses the last; a "MATCH" that is another option's value is taken for
// one too: a refusal beats a leak) can.
func listingMayReach(name string, args [][]byte, prefix string) bool {
	var pats [][]byte
	switch name {
	case "keys":
		if len(args) != 2 {
			return true
		}
		pats = args[1:]
	case "scan":
		for i := 2; i+1 < len(args); i++ {
			if resp.EqualFold(args[i], "MATCH") {
				pats = append(pats, args[i+1])
			}
		}
		if len(pats) == 0 {
			return true
		}
	default:
		return true
	}
	under := make([]globPos, 0, len(prefix)+1) // prefix*
	for i := 0; i < len(prefix); i++ {
		var p globPos
		p.add(prefix[i], prefix[i])
		under = append(under, p)
	}
	under = append(under, globPos{star: true})
	for _, p := range pats {
		if globsIntersect(globPositions(p), under) {
			return true
		}
	}
	return false
}

// relayOne relays one command the handler serves partly itself (see
// tScript), after the replies of commands relayed before it, and returns
// its reply (or the refusal), the end of the reply buffer.
func (h *Handler) relayOne(s *resp.Session, args [][]byte) []byte {
	h.relayFlush(s)
	at := s.W.Len()
	h.relay(s, args)
	if rs := h.relayState(s); rs.pipe.Pending() > 0 {
		h.relayCollect(s, rs, true)
	}
	return s.W.Bytes()[at:]
}

// answeredInTunnel tells whether a connection command lockproxy serves
// from memory (name in lower case) is answered by lockproxy on a RESP3
// subscribed connection too, after the replies tunnelled before it
// (tunnelSync): tunnelled, it would get the answer of the pinned upstream
// connection (CLIENT ID its id, which names another client here; CLIENT
// GETNAME its name; CLIENT LIST and INFO the upstream's). In RESP2 Redis
// refuses them while subscribed, and the upstream's refusal is relayed.
// PING and ECHO answer the same upstream; COMMAND asks the upstream
// itself, which it cannot on a tunnelled connection. Inside MULTI they
// are refused (relayRoute): EXEC's reply is the upstream's.
func answeredInTunnel(name string, args [][]byte) bool {
	switch name {
	case "info":
		return true
	case "client":
		return len(args) >= 2 && (resp.EqualFold(args[1], "ID") || resp.EqualFold(args[1], "GETNAME") ||
			resp.EqualFold(args[1], "INFO") || resp.EqualFold(args[1], "LIST"))
	}
	return false
}

// notInTunnel names a command (name in lower case, cmd its table entry or
// nil) that a connection in pub/sub mode may not send, or is "". Every
// upstream frame then goes to the client as it comes (RESP3 allows any
// command while subscribed), so what lockproxy does around a command
// cannot happen: a lock command's reply would overtake the upstream's
// replies before it, KEYS and SCAN replies could not be filtered, a
// transaction or a state change would stay on the connection, which goes
// back to the shared pool once the last subscription ends, and a blocking
// command would hold it.
func (h *Handler) notInTunnel(name string, args [][]byte, cmd *Command) string {
	switch name {
	case "subscribe", "psubscribe", "ssubscribe", "unsubscribe", "punsubscribe", "sunsubscribe", "ping":
		return ""
	case "multi", "exec", "discard", "watch", "unwatch", "keys", "scan":
		return name
	}
	if cmd != nil && cmd.Group == groupLock || h.onLockKeys(args) || isBlocking(name) ||
		(name == "xread" || name == "xreadgroup") && hasWord(args, "BLOCK") {
		return name
	}
	if what := stateChangeInMulti(name, args); what != "" {
		return what
	}
	if name == "client" {
		if what := clientIDCommand(args); what != "" {
			// Its id is translated, or it is answered here
			// (clientids.go), which a tunnel, relaying every frame as it
			// comes, cannot do in order.
			return what
		}
	}
	if len(h.patterns) > 0 && (h.up.KeyWhere([]byte(name), args, h.lockKey) != nil || h.sortLockPattern([]byte(name), args) != nil ||
		h.scriptLockKey([]byte(name), args) != "") {
		return name
	}
	return ""
}

// stateChangeInMulti names a command (with its subcommand) that changes a
// connection's state when EXEC runs it, or is "". Queued in a transaction
// it would run on the client's pinned upstream connection behind
// lockproxy's back: the database, protocol, user, name, reply mode or
// subscriptions lockproxy tracks for the client would be wrong after EXEC,
// and the connection, taken for clean, would go back to the shared pool
// with them, to the next client that pins one. So it is refused, which
// makes EXEC abort, as Redis does after any queuing error.
func stateChangeInMulti(name string, args [][]byte) string {
	switch name {
	case "select", "hello", "auth", "subscribe", "psubscribe", "ssubscribe", "monitor":
		return name
	case "client":
		if len(args) < 2 {
			return ""
		}
		var buf [32]byte
		switch sub := string(resp.Lower(buf[:], args[1])); sub {
		case "reply", "tracking", "caching", "setname", "setinfo", "no-evict", "no-touch":
			return "client|" + sub
		}
	}
	return ""
}

// relayFlush collects the replies of s's relayed commands still pending,
// so that a reply written now comes after them.
func (h *Handler) relayFlush(s *resp.Session) {
	if c, ok := s.Data.(*conn); ok && c.rl != nil && c.rl.pipe.Pending() > 0 {
		h.relayCollect(s, c.rl, true)
	}
}

// EndBatch implements resp.BatchHandler: the replies of the batch's relayed
// commands are collected before the batch's replies are flushed. When they
// are all the batch's replies (the common case: a client relaying through
// a shared connection), the upstream connection's reader writes them to the
// client itself and this goroutine goes back to reading at once: no
// goroutine hand-off per reply, and the client's next batch is read while
// the upstream answers.
func (h *Handler) EndBatch(s *resp.Session) {
	c, ok := s.Data.(*conn)
	if !ok || c.rl == nil || c.rl.pipe.Pending() == 0 {
		return
	}
	rs := c.rl
	if rs.at == 0 && s.W.Len() == 0 && !rs.pipe.Pinned() {
		if write, ok := s.BeginAsync(); ok && rs.pipe.CollectAsync(s.Context(), s.W.Proto(), write, s.Later()) {
			return
		}
	}
	if s.Later() != nil {
		// On the event loop, BeginAsync refuses only a connection that is
		// going away, and the loop must not wait for the upstream.
		relayCanceled(s, rs)
		return
	}
	h.relayCollect(s, rs, true)
}

func (h *Handler) relayClosed(s *resp.Session) {
	if c, ok := s.Data.(*conn); ok && c.rl != nil {
		c.rl.pipe.Done()
	}
}

// relayAdd queues args for the upstream.
func (h *Handler) relayAdd(s *resp.Session, rs *relayConn, args [][]byte) {
	p := rs.pipe
	if p.Pending() > 0 && s.W.Len() != rs.at {
		// A local reply was written after the pending commands: theirs go
		// before it, and this command's after.
		h.relayCollect(s, rs, true)
	}
	if rs.broken {
		// The collect above found the pinned connection lost: this
		// command was meant for it. Answered in its place (rs.at marks
		// the answer, as the reply of a relayed command).
		rs.at = s.W.Len()
		s.W.Error(errLostState)
		return
	}
	if rs.linger && !rs.multi && !p.RedirectTarget() {
		// (A redirection's target keeps its connection: maybeUnpin.)
		var buf [32]byte
		if h.up.MayWrite(resp.Lower(buf[:], args[0]), args) {
			// The pin was kept for a WAIT only (linger): a write gives it
			// back, after the commands queued on it, and goes over a
			// shared connection as any other client's.
			if p.Pending() > 0 {
				h.relayCollect(s, rs, true)
			}
			rs.linger = false
			rs.light.Store(false)
			p.Unpin(true)
			if rs.broken {
				rs.at = s.W.Len()
				s.W.Error(errLostState)
				return
			}
		}
	}
	if rs.wroteOn != wroteElsewhere {
		h.noteWrite(rs, args)
	}
	if p.Pending() == 0 {
		rs.at = s.W.Len()
	}
	p.Add(args)
	if p.Pending() >= maxPending {
		h.relayCollect(s, rs, true)
	}
}

// relayCanceled answers the pending commands, unsent, as canceled: their
// connection is going away.
func relayCanceled(s *resp.Session, rs *relayConn) {
	n := rs.pipe.Pending()
	rs.pipe.Discard()
	var b []byte
	for range n {
		b = append(b, "-ERR command canceled: connection closing or server shutting down\r\n"...)
	}
	splice(s.W, rs.at, b)
}

// relayCollect waits for the replies of the pending commands and puts them
// where they belong in s.W.
func (h *Handler) relayCollect(s *resp.Session, rs *relayConn, timed bool) {
	// Replies another goroutine still writes (EndBatch) come first, and
	// the pipe's call is free again once they are written.
	written := s.WaitAsync()
	n := rs.pipe.Pending()
	if n == 0 {
		return
	}
	if !written {
		// The client is gone while the upstream's replies to its last
		// batch are still on their way: nothing more is sent for it.
		relayCanceled(s, rs)
		return
	}
	out, err := rs.pipe.Collect(s.Context(), s.W.Proto(), timed)
	if err != nil {
		var b []byte
		for range n {
			b = append(b, "-ERR command canceled: connection closing or server shutting down\r\n"...)
		}
		out = b
	}
	splice(s.W, rs.at, out)
	h.relayLost(s, rs)
}

// relayLost takes in the loss of the pinned connection a Collect found
// (Pipe.Lost), if any, and reports whether the client carries on.
func (h *Handler) relayLost(s *resp.Session, rs *relayConn) bool {
	if !rs.pipe.Lost() {
		return true
	}
	if rs.light.Load() {
		// It held only WAIT's count (waiter, linger): the commands
		// got the error, as on a shared connection, and the client
		// carries on. Writes made on the lost connection cannot be
		// counted by a WAIT on another (refused then); with none, the
		// next WAIT pins a new one.
		rs.light.Store(false)
		rs.waiter, rs.linger = false, false
		if rs.wroteOn != 0 {
			rs.wroteOn = wroteElsewhere
		}
		return true
	}
	// The pinned connection failed, and its transaction, watches,
	// database or subscriptions with it: the commands after these
	// were sent in that state, and run nowhere else.
	h.relayBroken(s, rs)
	return false
}

// pinnedHello switches the client's pinned upstream connection, if it has
// one in another protocol, to proto with HELLO, for the client's HELLO:
// on Redis HELLO switches the client's own connection, whose replies and
// pushes (a tracking redirection's invalidations, which a RESP3 target
// gets unsubscribed) then come in that protocol. The connection keeps its
// state (database, watches, tracking, the redirections that name it, its
// user). Called with nothing pending (relayRoute collected it), outside
// MULTI and the tunnel (HELLO is refused there). It reports false after
// writing an error reply.
func (h *Handler) pinnedHello(s *resp.Session, rs *relayConn, proto int) bool {
	p := rs.pipe
	if !p.Pinned() || p.PinnedProto() == proto || p.Tunneling() || rs.multi || p.Pending() > 0 {
		return true
	}
	p.Add([][]byte{[]byte("HELLO"), []byte(strconv.Itoa(proto))})
	out, err := p.Collect(s.Context(), proto, true)
	if !h.relayLost(s, rs) {
		s.W.Error(errLostState)
		return false
	}
	switch {
	case err != nil:
		s.W.Error("ERR command canceled: connection closing or server shutting down")
		return false
	case !p.Pinned():
		// Lost while it held only WAIT's count: the client carries on
		// over shared connections, in proto.
		return true
	case len(out) == 0 || out[0] == '-' || out[0] == '!':
		line, _, _ := bytes.Cut(out, []byte("\r\n"))
		relayError(s, "ERR HELLO through lockproxy: the upstream did not switch this client's connection to RESP"+
			strconv.Itoa(proto)+": "+relay.Clip(string(line)))
		return false
	}
	p.SetPinnedProto(proto)
	return true
}

// relayBroken stops a client whose pinned connection was lost: its later
// commands are refused (relayRoute, relayAdd), and its connection closes
// once the replies so far are written. The lost hook closes it too, from
// the upstream's reader; this covers a connection lockproxy closed
// itself, and the commands the client goroutine serves meanwhile.
func (h *Handler) relayBroken(s *resp.Session, rs *relayConn) {
	rs.broken = true
	rs.pipe.Close()
	rs.multi, rs.dirty, rs.watch, rs.watchLost, rs.db, rs.tracking, rs.monitor = false, false, false, false, 0, false, false
	rs.failedTx, rs.linger, rs.tracks = false, false, false
	rs.trackOpt, rs.cachingNext, rs.cachingNow = 0, 0, 0
	rs.redirTo, rs.redirUp = 0, 0
	rs.redirPush.Store(nil)
	rs.light.Store(false)
	s.SetPubSub(false)
	s.CloseAfterReply()
}

// noteWrite records where a command that may write goes (rs.wroteOn), for
// WAIT: on the client's pinned connection, or elsewhere.
func (h *Handler) noteWrite(rs *relayConn, args [][]byte) {
	id := rs.pipe.PinID()
	if id != 0 && rs.wroteOn == id {
		return // nothing changes, whatever the command
	}
	var buf [32]byte
	if !h.up.MayWrite(resp.Lower(buf[:], args[0]), args) {
		return
	}
	if id == 0 || rs.wroteOn != 0 {
		rs.wroteOn = wroteElsewhere
	} else {
		rs.wroteOn = id
	}
}

// waitCounts tells whether WAIT or WAITAOF, run on the client's pinned
// connection (the one it has, or the one it is about to get), would count
// the client's writes: Redis counts those made on the connection WAIT
// runs on. That holds when the client wrote nothing yet (WAIT then
// answers at once, as on Redis), or wrote only on its current pinned
// connection; a pinned connection that carried the client's writes is
// kept after its state is done with (linger) for that. Writes over a
// shared connection, which carries other clients' too, or over a pinned
// one the client no longer has, cannot be waited for: another
// connection's WAIT would answer that every replica has them when none
// may have. That holds for WAIT 0 too, which returns a count of replicas.
// A client that passes keeps its pinned connection from then on (waiter),
// so its later writes count.
func (h *Handler) waitCounts(rs *relayConn) bool {
	if rs.wroteOn != 0 && rs.wroteOn != rs.pipe.PinID() {
		return false
	}
	rs.waiter = true
	return true
}

// sortLockPattern returns a BY or GET pattern of a SORT or SORT_RO (name
// in lower case) that may look up a key matching a lock pattern, or nil.
// Such keys are served by the lock nodes: on the upstream the pattern
// would read other keys of the same names.
func (h *Handler) sortLockPattern(name []byte, args [][]byte) []byte {
	for _, p := range relay.SortPatterns(name, args) {
		for _, lp := range h.patterns {
			if relay.PatternMayReach(p, globLiteral(lp)) {
				return p
			}
		}
	}
	return nil
}

// globLiteral is the text every key a glob matches starts with: the glob
// up to its first special character.
func globLiteral(g string) []byte {
	if i := strings.IndexAny(g, `*?[\`); i >= 0 {
		g = g[:i]
	}
	return []byte(g)
}

// selectedDB is the database the client selected (SELECT, which lets a
// client leave database 0 only with an upstream), 0 when it selected none.
func selectedDB(s *resp.Session) int {
	if c, ok := s.Data.(*conn); ok && c.rl != nil {
		return c.rl.db
	}
	return 0
}

// keysLockPattern returns the pattern of a KEYS or SCAN … MATCH (name in
// lower case) that may match a key matching lock_patterns, or nil. Lock
// keys are on the lock nodes, never on the upstream that answers KEYS and
// SCAN, so such a reply would leave out every lock held: a check for
// holders (the seed's read-write lock asks KEYS lock:x:read:* before it
// takes the write lock) would find none. A pattern of '*' alone, and SCAN
// without MATCH, list the whole keyspace and are relayed: they list the
// upstream's keys, not the locks, as a listing of another database would.
// Every MATCH of a SCAN is checked (Redis uses the last), and a "MATCH"
// that is another option's value too: a refusal beats a miss.
func (h *Handler) keysLockPattern(name []byte, args [][]byte) []byte {
	var pats [][]byte
	switch string(name) {
	case "keys":
		if len(args) == 2 {
			pats = args[1:]
		}
	case "scan":
		for i := 2; i+1 < len(args); i++ {
			if resp.EqualFold(args[i], "MATCH") {
				pats = append(pats, args[i+1])
			}
		}
	default:
		return nil
	}
	for _, p := range pats {
		if len(bytes.Trim(p, "*")) == 0 && len(p) > 0 {
			continue // the whole keyspace
		}
		if h.patternMayMatchLockKey(p) {
			return p
		}
	}
	return nil
}

// scriptNumkeysRefused reports whether args is an EVAL, EVALSHA, FCALL or
// _RO form (name in lower case) whose numkeys Redis refuses (numkeysError,
// read as Redis reads it) before it runs anything. Such a command names
// no key, and the upstream answers it with Redis's own refusal: checked
// for lock keys, every argument after the count was taken for a key, and
// the client was told that EVAL is not supported on lock keys.
func scriptNumkeysRefused(name []byte, args [][]byte) bool {
	switch string(name) {
	case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro":
	default:
		return false
	}
	if len(args) < 3 {
		return false
	}
	nk, ok := resp.ParseInt(args[2])
	return numkeysError(nk, ok, len(args)-3) != nil
}

// scriptLockKey returns the refusal of a relayed script command (name in
// lower case: EVAL, EVALSHA, FCALL, their _RO forms, SCRIPT LOAD, FUNCTION
// LOAD) whose ARGV or body names a lock key (lockKeyOutsideKeys), or "".
// An EVALSHA's body is known when this instance remembers it; one loaded
// through lockproxy was checked when loaded.
func (h *Handler) scriptLockKey(name []byte, args [][]byte) string {
	var body []byte
	switch string(name) {
	case "eval", "eval_ro", "fcall", "fcall_ro":
		body = relay.ScriptBody(name, args)
	case "evalsha", "evalsha_ro":
		if len(args) > 1 {
			if b, ok := h.scripts.get(string(args[1])); ok {
				body = []byte(b)
			}
		}
	case "script", "function":
		if body = relay.ScriptBody(name, args); body == nil {
			return ""
		}
	default:
		return ""
	}
	return h.lockKeyOutsideKeys(relay.ScriptArgs(name, args), body)
}

// splice inserts data into w at offset at, before what was written since.
func splice(w *resp.Writer, at int, data []byte) {
	if w.Len() == at {
		w.Raw(data)
		return
	}
	b := w.Bytes()
	tail := bytes.Clone(b[at:])
	head := b[:at]
	w.Reset()
	w.Raw(head)
	w.Raw(data)
	w.Raw(tail)
}

// relayLocal writes a reply lockproxy makes itself for a relayed command.
func relayError(s *resp.Session, msg string) { s.W.Error(msg) }

// execAbort is the reply to an EXEC that discards its transaction, in
// Redis's words: an EXEC Redis refuses itself (its arity) names that
// reason, whatever flagged the transaction before; any other names the
// queuing errors before it.
func execAbort(args [][]byte) string {
	if len(args) != 1 {
		return "EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' command"
	}
	return "EXECABORT Transaction discarded because of previous errors."
}

// pin gives the connection an upstream connection of its own, after the
// replies pending on the shared one. It reports false after writing an
// error reply when none could be had.
func (h *Handler) pin(s *resp.Session, rs *relayConn) bool {
	// The caller puts state on the connection (a transaction, a
	// database…), or blocks it: until maybeUnpin finds that state done
	// with, losing the connection loses the client's state.
	rs.linger = false
	rs.light.Store(false)
	if rs.pipe.Pinned() {
		return true
	}
	h.relayCollect(s, rs, true)
	if err := rs.pipe.Pin(s.Context(), s.W.Proto(), 0); err != nil {
		relayError(s, "ERR upstream unavailable: "+err.Error())
		return false
	}
	return true
}

// maybeUnpin gives the pinned connection back once no state needs it,
// unless WAIT needs it: the client is a waiter, or every write of the
// client went over it (linger: kept until a write, see relayAdd).
func (h *Handler) maybeUnpin(rs *relayConn) {
	rs.linger = false
	rs.light.Store(false)
	if !rs.pipe.Pinned() || rs.pipe.Pending() > 0 || rs.multi || rs.watch || rs.db != 0 ||
		rs.tracking || rs.pipe.Tunneling() || rs.pipe.RedirectTarget() {
		// A redirection's target (CLIENT TRACKING … REDIRECT) keeps its
		// connection, which the redirection names, as long as it lives:
		// it gets the invalidations whenever it is subscribed, as on
		// Redis.
		return
	}
	wroteHere := rs.wroteOn != 0 && rs.wroteOn == rs.pipe.PinID()
	if !rs.waiter && !wroteHere {
		rs.pipe.Unpin(true)
		return
	}
	rs.linger = !rs.waiter
	rs.light.Store(true)
}

// blocking names the commands that may block the upstream connection.
var blocking = map[string]bool{
	"blpop": true, "brpop": true, "brpoplpush": true, "blmove": true, "blmpop": true,
	"bzpopmin": true, "bzpopmax": true, "bzmpop": true, "wait": true, "waitaof": true,
}

// isBlocking tells whether name is in blocking, without a map lookup for
// the commands (GET, SET…) that cannot be.
func isBlocking(name string) bool {
	return name != "" && (name[0] == 'b' || name[0] == 'w') && blocking[name]
}

// relay serves a command lockproxy does not know by relaying it.
func (h *Handler) relay(s *resp.Session, args [][]byte) {
	var buf [32]byte
	h.relayNamed(s, args, resp.Lower(buf[:], args[0]))
}

// relayNamed is relay with the command's name already in lower case.
func (h *Handler) relayNamed(s *resp.Session, args [][]byte, lname []byte) {
	rs := h.relayState(s)
	if err := h.up.Check(lname, args); err != nil {
		if rs.multi {
			rs.dirty = true
		}
		h.rm.refused.Inc()
		relayError(s, err.Error())
		return
	}
	if len(h.patterns) > 0 && !scriptNumkeysRefused(lname, args) {
		// A command transparent mode does not serve (it served those it
		// does before this) may still name a lock key, in any key
		// position: HSET, MSETNX, FCALL, OBJECT ENCODING… On the upstream
		// it would act on another key of the same name, a lock of one
		// node.
		if k := h.up.KeyWhere(lname, args, h.lockKey); k != nil {
			if rs.multi {
				rs.dirty = true
			}
			h.rm.refused.Inc()
			relayError(s, "ERR transparent mode: '"+relay.Clip(string(lname))+"' is not supported on lock keys (lock_patterns match '"+
				relay.Clip(string(k))+"'); supported: "+transparentCommands)
			return
		}
		if p := h.sortLockPattern(lname, args); p != nil {
			if rs.multi {
				rs.dirty = true
			}
			h.rm.refused.Inc()
			relayError(s, "ERR transparent mode: SORT's BY/GET pattern '"+relay.Clip(string(p))+
				"' may read keys matching lock_patterns, which the lock nodes serve; use a pattern that starts with other text")
			return
		}
		if p := h.keysLockPattern(lname, args); p != nil {
			if rs.multi {
				rs.dirty = true
			}
			h.rm.refused.Inc()
			relayError(s, "ERR transparent mode: '"+relay.Clip(string(lname))+"' pattern '"+relay.Clip(string(p))+
				"' may match lock keys (lock_patterns), which are on the lock nodes, not the upstream: the reply would not list them. "+
				"Ask for one lock key with EXISTS, PTTL or LOCKINFO, or use a pattern that cannot match lock_patterns")
			return
		}
		if why := h.scriptLockKey(lname, args); why != "" {
			if rs.multi {
				rs.dirty = true
			}
			h.rm.refused.Inc()
			relayError(s, why)
			return
		}
	}
	name := string(lname) // compared below, not kept: no allocation
	if (name == "wait" || name == "waitaof") && !h.waitCounts(rs) {
		if rs.multi {
			rs.dirty = true
		}
		h.rm.refused.Inc()
		relayError(s, "ERR '"+name+"' through lockproxy cannot count this connection's writes: some went over an upstream connection "+
			"shared with other clients, or over one this connection no longer has, which it does not see. Send WAIT 0 0 before the "+
			"connection's first write: lockproxy then keeps its writes and WAITs on one upstream connection")
		return
	}
	if rs.armed && rs.tracks && name != "client" {
		h.disarmCaching(s, rs, name)
	}
	if name == "client" && len(args) > 2 && rs.tracks && !rs.multi && resp.EqualFold(args[1], "CACHING") {
		rs.armed, rs.spent = true, 0
	}
	h.rm.relayed.Inc()
	if !rs.multi && relayPlain(name, args) {
		// The hot path, and the only one the event loop runs (LoopSafe).
		h.relayAdd(s, rs, args)
		return
	}
	if name == "exec" && rs.multi && len(args) != 1 {
		// Redis aborts the transaction for an EXEC it refuses (7.0 on;
		// 6.2 flags it): the dirty EXEC below ends it either way.
		rs.dirty = true
	}
	switch {
	case (name == "multi" || name == "discard" || name == "unwatch") && len(args) != 1:
		// Redis refuses them for their arity and the connection's state
		// stays as it was (a transaction flagged, as after any queuing
		// error). Relayed, they would be taken for the change they name:
		// a DISCARD refused inside MULTI would send the connection back
		// to the idle list still in the transaction, the next client to
		// pin it having its commands queued, not run.
		if rs.multi {
			rs.dirty = true
		}
		relayError(s, "ERR wrong number of arguments for '"+name+"' command")
	case name == "multi":
		if rs.watchLost {
			// Its WATCH got no upstream connection: the transaction
			// could not be protected, so it fails as a whole.
			rs.multi, rs.dirty, rs.failedTx = true, true, true
			relayError(s, "ERR the transaction failed through lockproxy: its WATCH got no upstream connection; nothing is queued, and EXEC will abort")
			return
		}
		if !h.pin(s, rs) {
			// A failed transaction, with no connection: the commands the
			// client queues after it are refused (relayRoute), not run
			// on the shared connection, and EXEC aborts.
			rs.multi, rs.dirty, rs.failedTx = true, true, true
			return
		}
		rs.multi = true
		h.relayAdd(s, rs, args)
	case (name == "exec" || name == "discard") && rs.multi && rs.failedTx:
		// A failed transaction (above): nothing was queued upstream, on
		// any connection.
		if name == "exec" {
			s.W.Error(execAbort(args))
		} else {
			s.W.Simple("OK")
		}
		rs.multi, rs.dirty, rs.watch, rs.watchLost, rs.failedTx = false, false, false, false, false
		h.maybeUnpin(rs)
	case (name == "exec" || name == "discard") && rs.multi:
		if rs.dirty && name == "exec" {
			// DISCARD's reply, whatever it is, is not the client's: EXEC
			// answers in its place, one reply for one command.
			h.relayUnseen(s, rs, "DISCARD")
			s.W.Error(execAbort(args))
		} else {
			h.relayAdd(s, rs, args)
			h.relayCollect(s, rs, true)
		}
		rs.multi, rs.dirty, rs.watch, rs.watchLost = false, false, false, false
		h.maybeUnpin(rs)
	case name == "watch" && !rs.multi:
		if !h.pin(s, rs) {
			rs.watchLost = true
			return
		}
		rs.watch = true
		h.relayAdd(s, rs, args)
	case name == "unwatch" && !rs.multi,
		name == "exec" && !rs.multi && len(args) != 1:
		// An EXEC with arguments and no MULTI unwatches too: Redis
		// answers it as an aborted transaction (execCommandAbort).
		h.relayAdd(s, rs, args)
		h.relayCollect(s, rs, true)
		rs.watch, rs.watchLost = false, false
		h.maybeUnpin(rs)
	case rs.multi:
		h.relayAdd(s, rs, args)
	case name == "subscribe" || name == "psubscribe" || name == "ssubscribe" || name == "monitor":
		if name == "monitor" && len(args) != 1 || name != "monitor" && len(args) < 2 {
			// Redis refuses it for its arity and the connection stays as
			// it was: it must not enter tunnel mode.
			relayError(s, "ERR wrong number of arguments for '"+name+"' command")
			return
		}
		if !h.pin(s, rs) {
			return
		}
		h.relayCollect(s, rs, true)
		// Replies before it go out before the first message, and the
		// tunnel's frames go out as they come (see relayTunnel).
		_ = s.PassPushes()
		// Before it is sent: its reply may reach the client before
		// Tunnel returns, and CLIENT LIST TYPE pubsub must list it then.
		rs.monitor = name == "monitor"
		s.SetPubSub(!rs.monitor)
		if err := rs.pipe.Tunnel(args); err != nil {
			rs.monitor = false
			s.SetPubSub(false)
			relayError(s, "ERR upstream unavailable: "+err.Error())
		}
		// A SUBSCRIBE the upstream refuses for another reason (an ACL on
		// channels) leaves no subscription: the next command that cannot
		// be tunnelled finds the tunnel over (tunnelSync) and is served as
		// on any other connection.
	case name == "unsubscribe" || name == "punsubscribe" || name == "sunsubscribe":
		// Not subscribed (a subscribed connection is in tunnel mode): Redis
		// answers one frame per channel, which on a shared connection
		// would be taken for other commands' replies. Answered here the
		// way Redis would.
		relayUnsubscribed(s, name, args[1:])
	case name == "keys" || name == "scan":
		// The replies before it first: the filter below reads one reply,
		// which must be this one.
		if rs.pipe.Pending() > 0 {
			h.relayCollect(s, rs, true)
		}
		h.relayAdd(s, rs, args)
		at := rs.at
		h.relayCollect(s, rs, true)
		b := s.W.Bytes()
		if filtered := h.up.FilterKeys(b[at:], name == "scan"); len(filtered) != len(b)-at {
			head := bytes.Clone(b[:at])
			s.W.Reset()
			s.W.Raw(head)
			s.W.Raw(filtered)
		}
	case name == "client" && len(args) > 1 && resp.EqualFold(args[1], "REPLY"):
		// A connection that stops replying would leave the other clients
		// sharing it without their replies.
		h.rm.refused.Inc()
		relayError(s, "ERR CLIENT REPLY is not supported through lockproxy")
	case name == "client" && len(args) > 2 && resp.EqualFold(args[1], "TRACKING"):
		if why := bcastReachesPrefix(args, h.up.KeyPrefix()); why != "" {
			h.rm.refused.Inc()
			relayError(s, why)
			return
		}
		if !h.pin(s, rs) {
			return
		}
		// After pin: a client may redirect to itself, its connection
		// being the one just pinned.
		args, redir, ok := h.trackingRedirect(s, args)
		if !ok {
			h.maybeUnpin(rs)
			return
		}
		rs.tracking = rs.tracking || resp.EqualFold(args[2], "ON")
		rs.tracks = resp.EqualFold(args[2], "ON")
		// Tracking turned off drops a CLIENT CACHING's flag upstream.
		rs.armed = rs.armed && rs.tracks
		rs.trackOpt = 0
		switch {
		case rs.tracks && hasWord(args, "OPTIN"):
			rs.trackOpt = 'i'
		case rs.tracks && hasWord(args, "OPTOUT"):
			rs.trackOpt = 'o'
		}
		if redir != nil {
			h.trackRedirected(s, rs, args, redir)
			return
		}
		h.relayAdd(s, rs, args)
	case name == "client" && len(args) > 1 && resp.EqualFold(args[1], "UNBLOCK"):
		h.clientUnblock(s, rs, args)
	case name == "client" && rs.redirUp != 0 && redirectInfoCommand(args):
		h.redirectInfo(s, rs, args)
	case name == "client" && clientIDCommand(args) == "client|kill":
		// Redis would close the client of that id; the upstream has no
		// such client, and the id may be that of another's connection.
		h.rm.refused.Inc()
		relayError(s, "ERR CLIENT KILL ID is not supported through lockproxy: the id is lockproxy's (CLIENT ID), "+
			"not that of an upstream connection; lockproxy does not close its clients for others")
	case isBlocking(name) || (name == "xread" || name == "xreadgroup") && hasWord(args, "BLOCK"):
		h.relayBlocking(s, rs, args)
	default:
		h.relayAdd(s, rs, args)
	}
}

// disarmCaching runs before a relayed command (name, no CLIENT one) while
// the pinned connection holds a CLIENT CACHING's flag (armed). When a
// command served by lockproxy came between, Redis would have applied the
// flag to that one: the upstream's is spent with a PING, whose reply the
// client does not see, so that it does not apply to this command (after
// CLIENT CACHING NO in OPTOUT mode, a read that Redis tracks would go
// untracked, and the client's cache would keep the value past a change).
func (h *Handler) disarmCaching(s *resp.Session, rs *relayConn, name string) {
	if rs.spent > 1 || rs.spent == 1 && !rs.counted {
		h.relayUnseen(s, rs, "PING")
		rs.armed = false
		return
	}
	if name != "multi" && !rs.multi || name == "exec" {
		// This command is the one the flag is for, upstream as in Redis.
		rs.armed = false
	}
}

// relayPlain tells whether relayNamed relays name (lower case) on the
// shared connection with nothing else to do, outside a transaction: not a
// command that pins the connection, changes its state, blocks, or whose
// reply is filtered or refused. SORT and FUNCTION are not either: the
// event loop relays what this admits after checking its keys only, and
// relayNamed also checks SORT's BY/GET patterns and FUNCTION LOAD's body
// against lock_patterns (sortLockPattern, scriptLockKey).
func relayPlain(name string, args [][]byte) bool {
	switch name {
	case "multi", "exec", "discard", "watch", "unwatch",
		"subscribe", "psubscribe", "ssubscribe", "monitor",
		"unsubscribe", "punsubscribe", "sunsubscribe", "keys", "scan",
		"sort", "sort_ro", "function":
		return false
	case "client":
		return len(args) < 2 || !resp.EqualFold(args[1], "REPLY") && !resp.EqualFold(args[1], "TRACKING") &&
			clientIDCommand(args) == "" && !redirectInfoCommand(args)
	case "xread", "xreadgroup":
		return !hasWord(args, "BLOCK")
	}
	return !isBlocking(name)
}

// relayUnsubscribed answers an UNSUBSCRIBE of a connection with no
// subscription: one ["unsubscribe", channel, 0] per channel, or one with a
// null channel when none is named (a push in RESP3).
func relayUnsubscribed(s *resp.Session, name string, channels [][]byte) {
	if len(channels) == 0 {
		s.W.Push(3)
		s.W.BulkString(name)
		s.W.Null()
		s.W.Int(0)
		return
	}
	for _, ch := range channels {
		s.W.Push(3)
		s.W.BulkString(name)
		s.W.Bulk(ch)
		s.W.Int(0)
	}
}

func hasWord(args [][]byte, w string) bool {
	for _, a := range args[1:] {
		if resp.EqualFold(a, w) {
			return true
		}
	}
	return false
}

// relayBlocking runs a blocking command on a connection of the client's
// own, with no read timeout, watching the client: if it goes away the
// upstream connection is closed, so that a BLPOP left behind cannot take
// an element that no one will receive.
func (h *Handler) relayBlocking(s *resp.Session, rs *relayConn, args [][]byte) {
	if !h.pin(s, rs) {
		return
	}
	h.relayAdd(s, rs, args)
	_ = s.Flush()
	rs.at = s.W.Len()
	stop := s.WatchClose()
	h.relayCollect(s, rs, false)
	stop()
	// Also when it was pinned: pin cleared linger, which maybeUnpin
	// recomputes (a connection pinned for state stays).
	h.maybeUnpin(rs)
}

// relayTunnel relays a command of a connection in pub/sub (or MONITOR)
// mode: every frame the upstream sends goes to the client in order, so the
// replies come that way too. After an UNSUBSCRIBE the connection asks the
// upstream whether any subscription is left.
func (h *Handler) relayTunnel(s *resp.Session, rs *relayConn, name string, args [][]byte) {
	if err := h.up.Check([]byte(name), args); err != nil {
		// lockproxy's own refusal: after the replies before it.
		if h.tunnelSync(s, rs) {
			relayError(s, err.Error())
		}
		return
	}
	// The replies so far go out before this command's, which, like every
	// frame of the tunnel, go to the client as they come: held until the
	// end of the batch, they would fill the push queue and stall the
	// upstream connection's reader (and with it the marker PING
	// tunnelSync waits for).
	_ = s.PassPushes()
	if rs.wroteOn != wroteElsewhere {
		h.noteWrite(rs, args) // PUBLISH, on the tunnel's connection
	}
	if err := rs.pipe.Tunnel(args); err != nil {
		relayError(s, "ERR upstream unavailable: "+err.Error())
		// The subscriptions went with the connection.
		h.relayBroken(s, rs)
		return
	}
	switch name {
	case "unsubscribe", "punsubscribe", "sunsubscribe":
		// Whether any subscription is left: the same marker.
		h.tunnelSync(s, rs)
	}
}

// tunnelSync makes sure, before lockproxy writes a reply of its own on a
// tunnelled connection, that the replies to the commands tunnelled before
// it have come back and are written to the client: they come as push
// frames, in the order the upstream sends them, so a reply written at once
// would overtake them. The marker PING of EndTunnel follows those
// commands, and its answer comes after theirs; it also tells whether the
// last subscription ended (under MONITOR only that the replies came: the
// relay tells the marker's reply from the feed's lines). The wait is
// bounded by the relay's read timeout and the client's context.
// tunnelSync reports false when the upstream did not answer: the client's
// connection is then closed, as for a lost pinned connection, since the
// replies it waits for can no longer come before any other.
func (h *Handler) tunnelSync(s *resp.Session, rs *relayConn) bool {
	// Frames go out as they come while it waits (see relayTunnel).
	_ = s.PassPushes()
	ended, err := rs.pipe.EndTunnel(s.Context())
	if err != nil {
		h.log.Debug("relay: no answer on a pub/sub connection; closing the client's", zap.Int64("client", s.ID()), zap.Error(err))
		h.relayBroken(s, rs)
		s.Close()
		return false
	}
	// Frames another writer (a KEEPALIVE push) held up are written before
	// any reply of the caller's.
	_ = s.PassPushes()
	if ended {
		// The batch's replies go to s.W again, and pushes wait for them.
		// (A MONITOR ends here only when the upstream refused it.)
		rs.monitor = false
		s.HoldPushes()
		s.SetPubSub(false)
		h.maybeUnpin(rs)
	}
	return true
}

// selectCmd is SELECT: database 0 only without an upstream; with one, any
// database the upstream has, on a connection of the client's own.
func (h *Handler) selectCmd(s *resp.Session, args [][]byte) {
	if h.up == nil {
		h.selectDB(s, args)
		return
	}
	n, ok := resp.ParseInt(args[1])
	if !ok {
		s.W.Error(errNotInteger.Error())
		return
	}
	rs := h.relayState(s)
	if int(n) == rs.db {
		s.W.Simple("OK")
		return
	}
	if !h.pin(s, rs) {
		return
	}
	h.relayAdd(s, rs, args)
	at := rs.at
	h.relayCollect(s, rs, true)
	if bytes.HasPrefix(s.W.Bytes()[at:], []byte("+OK")) {
		rs.db = int(n)
		rs.pipe.SetPinnedDB(rs.db)
	}
	h.maybeUnpin(rs)
}

// reset is RESET: the connection's state back to a new one's, an upstream
// connection of its own dropped with everything on it, or, when a tracking
// redirection names it, reset upstream and kept (relay.Pipe.Reset).
func (h *Handler) reset(s *resp.Session, args [][]byte) {
	c := state(s)
	if c.rl != nil {
		// After the replies in flight, when tunnelled (relayRoute), or
		// collected (relayRoute, for a local command). A connection a
		// tracking redirection names is kept, reset upstream: the
		// client keeps its id, and the redirection must still reach it.
		c.rl.pipe.Reset(s.Context())
		c.rl.multi, c.rl.dirty, c.rl.watch, c.rl.db, c.rl.tracking, c.rl.monitor = false, false, false, 0, false, false
		c.rl.watchLost, c.rl.waiter, c.rl.failedTx, c.rl.linger, c.rl.tracks = false, false, false, false, false
		c.rl.trackOpt, c.rl.cachingNext, c.rl.cachingNow = 0, 0, 0
		c.rl.armed, c.rl.counted, c.rl.spent = false, false, 0
		c.rl.redirTo, c.rl.redirUp = 0, 0
		c.rl.redirPush.Store(nil)
		c.rl.light.Store(false)
	}
	// No tunnel any more: the batch's replies go to s.W, pushes wait for
	// them.
	s.HoldPushes()
	s.SetPubSub(false)
	c.name = ""
	s.SetName("")
	c.authed = false // RESET signs the connection out, as in Redis
	c.perm = nil
	if h.authRequired() {
		s.SetAuthenticated(false)
	}
	s.SetProto(2)
	if c.ka != nil {
		c.ka.proto.Store(2)
		// The connection's KEEPALIVE locks end as on its close, and
		// the notices of its losses are dropped: the next user of a
		// pooled connection starts with none of the last one's.
		h.keepalive.connReset(c.ka)
	}
	s.W.Simple("RESET")
}

// relayMetrics count what the relay does.
type relayMetrics struct {
	relayed, refused, dropped prometheus.Counter
}

func newRelayMetrics(reg prometheus.Registerer) *relayMetrics {
	m := &relayMetrics{
		relayed: prometheus.NewCounter(prometheus.CounterOpts{Name: "lockproxy_relay_commands_total",
			Help: "Commands relayed to the upstream Redis."}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "lockproxy_relay_refused_total",
			Help: "Commands refused instead of relayed: denied, or touching the lock key prefix."}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "lockproxy_relay_pushes_dropped_total",
			Help: "Pub/sub messages and pushes dropped for a client that did not read them."}),
	}
	reg.MustRegister(m.relayed, m.refused, m.dropped)
	return m
}

// relayUnseen relays cmd (a command without arguments) on rs after what
// is queued, collects the replies, and drops cmd's own, the last frame:
// the client did not send it and gets no reply for it.
func (h *Handler) relayUnseen(s *resp.Session, rs *relayConn, cmd string) {
	h.relayAdd(s, rs, [][]byte{[]byte(cmd)})
	at := rs.at
	h.relayCollect(s, rs, true)
	b := s.W.Bytes()
	last := -1
	for i := at; i < len(b); {
		n, err := relay.FrameEnd(b[i:])
		if err != nil || n == 0 {
			break
		}
		last, i = i, i+n
	}
	if last >= 0 {
		w := bytes.Clone(b[:last])
		s.W.Reset()
		s.W.Raw(w)
	}
}
