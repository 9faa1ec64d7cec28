package commands

import (
	"bytes"
	"errors"
	"strconv"

	"github.com/lockproxy/lockproxy/relay"
	"github.com/lockproxy/lockproxy/resp"
)

// Relayed commands that name a client by its id. A client reads its id
// from lockproxy (CLIENT ID, HELLO), which is not the id of any upstream
// connection: relayed as it is, the id would name no connection there, or
// one pinned to another client, or a shared one. So the id is translated
// to that of the upstream connection the client named has pinned
// (relay.Named) and the command relayed with it, or the command is
// answered here, never relayed with a lockproxy id.

// errRedirectMissing is Redis's reply to a CLIENT TRACKING … REDIRECT that
// names no client: through lockproxy also one with no upstream connection
// of its own, which no redirection could reach.
const errRedirectMissing = "ERR The client ID you want redirect to does not exist"

// clientIDCommand names a CLIENT subcommand (args[0] is CLIENT) that names
// a client by its id, or is "": UNBLOCK, TRACKING with REDIRECT, KILL with
// an ID filter.
func clientIDCommand(args [][]byte) string {
	if len(args) < 2 {
		return ""
	}
	switch {
	case resp.EqualFold(args[1], "UNBLOCK"):
		return "client|unblock"
	case resp.EqualFold(args[1], "TRACKING") && hasWord(args, "REDIRECT"):
		return "client|tracking"
	case resp.EqualFold(args[1], "KILL") && killsByID(args):
		return "client|kill"
	}
	return ""
}

// killsByID tells whether a CLIENT KILL has an ID filter (the new form,
// filter-value pairs; the old one, CLIENT KILL addr:port, has three
// arguments).
func killsByID(args [][]byte) bool {
	if len(args) == 3 {
		return false
	}
	for i := 2; i+1 < len(args); i += 2 {
		if resp.EqualFold(args[i], "ID") {
			return true
		}
	}
	return false
}

// clientUnblock is CLIENT UNBLOCK id [TIMEOUT|ERROR]. A client waiting in
// lockproxy's own LOCK … WAIT (or RLOCK) is unblocked here (lockWaits):
// nothing upstream holds it. Otherwise the command is relayed with the
// upstream id of the connection the client of that id is blocked on; :0,
// as Redis answers for a client that is not blocked, when it is in no
// relayed blocking command either.
func (h *Handler) clientUnblock(s *resp.Session, rs *relayConn, args [][]byte) {
	id, how, ok := unblockArgs(s, args)
	if !ok {
		return
	}
	if h.waits.waiting(id) {
		// The relayed commands sent before it run first, as on Redis,
		// where the client it wakes sees what they did: they wait in
		// the pipe for the batch's end, and the wait ends at once.
		if rs.pipe.Pending() > 0 {
			h.relayCollect(s, rs, true)
			if rs.broken {
				// Those found the pinned connection lost: nothing more
				// runs (relayRoute).
				s.W.Error(errLostState)
				return
			}
		}
		if h.waits.unblock(id, how) {
			s.W.Int(1)
			return
		}
	}
	up, err := h.up.Named(id, relay.NameBlocked)
	switch {
	case errors.Is(err, relay.ErrNoSuchConn):
		s.W.Int(0)
		return
	case err != nil:
		relayError(s, "ERR CLIENT UNBLOCK through lockproxy: client "+strconv.FormatInt(id, 10)+
			" is blocked upstream, but the upstream did not tell its connection's id (CLIENT ID refused): "+err.Error())
		return
	}
	out := append([][]byte{args[0], args[1], []byte(strconv.FormatInt(up, 10))}, args[3:]...)
	h.relayAdd(s, rs, out)
}

// unblockArgs reads CLIENT UNBLOCK id [TIMEOUT|ERROR] as Redis does, or
// writes Redis's error for it and returns false.
func unblockArgs(s *resp.Session, args [][]byte) (id int64, how byte, ok bool) {
	switch {
	case len(args) < 3:
		relayError(s, "ERR wrong number of arguments for 'client|unblock' command")
		return 0, 0, false
	case len(args) > 4:
		// Redis's arity for it is -3; its handler takes 3 or 4.
		relayError(s, "ERR unknown subcommand or wrong number of arguments for '"+relay.Clip(string(args[1]))+"'. Try CLIENT HELP.")
		return 0, 0, false
	}
	if len(args) == 4 && !resp.EqualFold(args[3], "TIMEOUT") && !resp.EqualFold(args[3], "ERROR") {
		relayError(s, "ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR")
		return 0, 0, false
	}
	id, ok = resp.ParseInt(args[2])
	if !ok {
		relayError(s, errNotInteger.Error())
		return 0, 0, false
	}
	how = unblockedTimeout
	if len(args) == 4 && resp.EqualFold(args[3], "ERROR") {
		how = unblockedError
	}
	return id, how, true
}

// clientUnblockLocal is CLIENT UNBLOCK without an upstream: the only
// commands a client can block in are lockproxy's own LOCK and RLOCK …
// WAIT, which it ends (:1); any other id answers :0, as Redis answers
// for a client that is not blocked.
func (h *Handler) clientUnblockLocal(s *resp.Session, args [][]byte) {
	id, how, ok := unblockArgs(s, args)
	if !ok {
		h.metrics.commands.WithLabelValues("client_unblock", "error").Inc()
		return
	}
	h.metrics.commands.WithLabelValues("client_unblock", "ok").Inc()
	state(s).lastCmd = "client_unblock"
	if h.waits.unblock(id, how) {
		s.W.Int(1)
		return
	}
	s.W.Int(0)
}

// redirection is a CLIENT TRACKING on … REDIRECT's target as
// trackingRedirect translated it: the client id given (to) and the
// upstream id relayed in its place (up).
type redirection struct{ to, up int64 }

// trackingRedirect returns CLIENT TRACKING's arguments with the client id
// of its REDIRECT option translated (relay.Named), or false after writing
// the reply Redis gives when that client does not exist. Options are read
// as Redis reads them, up to the first it would refuse (a second
// REDIRECT, an unknown word): Redis stops there too, before it looks up
// any id after it.
// For ON it also returns the redirection, whose target relay.Named marked:
// the caller keeps it (trackRedirected) once Redis has accepted the
// command, or takes the mark back when Redis refuses it.
func (h *Handler) trackingRedirect(s *resp.Session, args [][]byte) ([][]byte, *redirection, bool) {
	var out [][]byte
	var redir *redirection
	redirects := 0
	for j := 3; j < len(args); j++ {
		more := j+1 < len(args)
		switch {
		case resp.EqualFold(args[j], "REDIRECT") && more:
			if redirects++; redirects > 1 {
				return orArgs(out, args), redir, true
			}
			j++
			id, ok := resp.ParseInt(args[j])
			if !ok {
				relayError(s, errNotInteger.Error())
				return nil, nil, false
			}
			// Only ON sets a redirection: for OFF (or a word Redis then
			// refuses) it only checks that the client exists, and the
			// client keeps no connection for it.
			off := !resp.EqualFold(args[2], "ON")
			what := relay.NameRedirect
			if off {
				what = relay.NameExists
			}
			up, err := h.up.Named(id, what)
			switch {
			case errors.Is(err, relay.ErrNoSuchConn):
				relayError(s, errRedirectMissing)
				return nil, nil, false
			case err != nil:
				relayError(s, "ERR CLIENT TRACKING through lockproxy: the upstream did not tell the id of client "+
					strconv.FormatInt(id, 10)+"'s connection (CLIENT ID refused): "+err.Error())
				return nil, nil, false
			}
			if out == nil {
				out = append([][]byte(nil), args...)
			}
			out[j] = []byte(strconv.FormatInt(up, 10))
			if !off {
				redir = &redirection{to: id, up: up}
			}
		case resp.EqualFold(args[j], "PREFIX") && more:
			j++
		case resp.EqualFold(args[j], "BCAST") || resp.EqualFold(args[j], "OPTIN") ||
			resp.EqualFold(args[j], "OPTOUT") || resp.EqualFold(args[j], "NOLOOP"):
		default:
			return orArgs(out, args), redir, true
		}
	}
	return orArgs(out, args), redir, true
}

// trackRedirected relays a CLIENT TRACKING on … REDIRECT (args, translated)
// whose target relay.Named marked (redir), and waits for its reply: Redis
// checks the rest of the command (PREFIX without BCAST, a second
// REDIRECT, a BCAST switch while tracking) after it looked the id up, so
// the mark was set before Redis could refuse. Refused, the command set no
// redirection: the mark is taken back (relay.Unredirect), or the target
// would keep its pinned connection for as long as it stays connected.
// Accepted, the translation is kept (relayConn.redirTo, redirUp) for the
// replies that give the id back (redirectInfo, redirBroken).
func (h *Handler) trackRedirected(s *resp.Session, rs *relayConn, args [][]byte, redir *redirection) {
	if rs.pipe.Pending() > 0 {
		// The reply read below must be this command's alone.
		h.relayCollect(s, rs, true)
	}
	h.relayAdd(s, rs, args)
	at := rs.at
	h.relayCollect(s, rs, true)
	if b := s.W.Bytes(); at >= len(b) || !bytes.HasPrefix(b[at:], []byte("+OK\r\n")) {
		h.up.Unredirect(redir.to, redir.up)
		return
	}
	rs.redirTo, rs.redirUp = redir.to, redir.up
	rs.redirPush.Store(&[2]int64{redir.up, redir.to})
}

// orArgs is out when set, else args.
func orArgs(out, args [][]byte) [][]byte {
	if out != nil {
		return out
	}
	return args
}

// redirectInfo relays CLIENT GETREDIR or CLIENT TRACKINGINFO, whose reply
// gives the id of the client a tracking redirection goes to, with the
// upstream id that trackingRedirect put in its place turned back into the
// lockproxy id the client gave: it is the id the client knows, and the one
// CLIENT UNBLOCK or another REDIRECT takes.
func (h *Handler) redirectInfo(s *resp.Session, rs *relayConn, args [][]byte) {
	if rs.pipe.Pending() > 0 {
		// The reply read below must be this command's alone.
		h.relayCollect(s, rs, true)
	}
	h.relayAdd(s, rs, args)
	at := rs.at
	h.relayCollect(s, rs, true)
	up, to := strconv.FormatInt(rs.redirUp, 10), strconv.FormatInt(rs.redirTo, 10)
	// GETREDIR's reply is the integer; TRACKINGINFO's has it after the
	// "redirect" key, which comes before any prefix (the only free text),
	// in RESP2's array and RESP3's map alike.
	old, repl := []byte(":"+up+"\r\n"), []byte(":"+to+"\r\n")
	if resp.EqualFold(args[1], "TRACKINGINFO") {
		old, repl = append([]byte("$8\r\nredirect\r\n"), old...), append([]byte("$8\r\nredirect\r\n"), repl...)
	}
	b := s.W.Bytes()
	if at > len(b) {
		return
	}
	i := bytes.Index(b[at:], old)
	if i < 0 || !resp.EqualFold(args[1], "TRACKINGINFO") && i != 0 {
		return
	}
	tail := bytes.Clone(b[at+i+len(old):])
	head := bytes.Clone(b[:at+i])
	s.W.Reset()
	s.W.Raw(head)
	s.W.Raw(repl)
	s.W.Raw(tail)
}

// redirectInfoCommand tells whether a CLIENT command (args[0]) is GETREDIR
// or TRACKINGINFO, whose replies name the client a redirection goes to.
func redirectInfoCommand(args [][]byte) bool {
	return len(args) == 2 && (resp.EqualFold(args[1], "GETREDIR") || resp.EqualFold(args[1], "TRACKINGINFO"))
}

// redirBrokenPush begins the push Redis sends a RESP3 client whose
// tracking redirection names a client that is gone, before that client's
// id: ">2", "tracking-redir-broken", id.
var redirBrokenPush = []byte(">2\r\n$21\r\ntracking-redir-broken\r\n:")

// redirBroken is the out-of-band frame f as the client gets it: the
// tracking-redir-broken push with the upstream id of the redirection's
// target turned back into the client id it gave (trackingRedirect), as
// CLIENT GETREDIR's reply is (redirectInfo). It runs on the upstream
// connection's reader, for every push: one atomic load when the client
// redirected nowhere.
func (rs *relayConn) redirBroken(f []byte) []byte {
	ids := rs.redirPush.Load()
	if ids == nil || !bytes.HasPrefix(f, redirBrokenPush) {
		return f
	}
	if n, ok := resp.ParseInt(bytes.TrimSuffix(f[len(redirBrokenPush):], []byte("\r\n"))); !ok || n != ids[0] {
		return f
	}
	out := append(bytes.Clone(redirBrokenPush), strconv.FormatInt(ids[1], 10)...)
	return append(out, '\r', '\n')
}
