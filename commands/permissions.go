package commands

import (
	"bytes"

	"github.com/lockproxy/lockproxy/resp"
)

// Permission limits what a user may do (auth.permissions): the commands
// it may run, and the globs every key of a command must match.
type Permission struct {
	// Commands are lower-case names; "@lock" stands for lockproxy's lock
	// commands, "@all" for every command.
	Commands []string
	// Keys are Redis-style globs (globMatch: * takes any bytes, '/'
	// included); none: any key.
	Keys []string
}

// perm is a Permission made ready for the checks.
type perm struct {
	all, lock bool
	cmds      map[string]bool
	keys      []string
}

func newPerm(p Permission) *perm {
	pm := &perm{cmds: map[string]bool{}, keys: p.Keys}
	for _, c := range p.Commands {
		switch c {
		case "@all":
			pm.all = true
		case "@lock":
			pm.lock = true
		default:
			pm.cmds[c] = true
		}
	}
	return pm
}

// alwaysPermitted are the commands every user may run: a client library
// sends them as it connects, and they reach no key.
var alwaysPermitted = map[string]bool{
	"auth": true, "hello": true, "ping": true, "echo": true, "quit": true, "reset": true,
	"command": true, "info": true,
}

// keyOutside reports whether k matches none of the user's globs.
func (p *perm) keyOutside(k []byte) bool {
	for _, g := range p.keys {
		if globMatch(g, k) {
			return false
		}
	}
	return true
}

// permitted tells whether p lets a connection run args, whose lower-case
// name is name and whose table entry is c (nil for a relayed command); when
// not, it is the error reply, in Redis's words.
func (h *Handler) permitted(p *perm, user, name string, c *Command, args [][]byte) (string, bool) {
	switch {
	case alwaysPermitted[name]:
		return "", true
	case name == "client" && len(args) > 1 && loopLocal(name, args):
		return "", true // the connection's own name and id
	case p.all, p.cmds[name], p.lock && c != nil && c.Group == groupLock:
	case (name == "exec" || name == "discard") && p.cmds["multi"]:
		// A transaction the user may open, it may end.
	default:
		h.metrics.deniedCommand.Inc()
		return "NOPERM User " + user + " has no permissions to run the '" + name + "' command", false
	}
	if len(p.keys) == 0 {
		return "", true
	}
	if scriptCommands[name] {
		// A script reaches whatever keys it names inside, on the upstream
		// and (in transparent mode) on the lock nodes, lockproxy's own
		// keys included: a user limited to some keys runs none.
		h.metrics.deniedKey.Inc()
		return "NOPERM User " + user + " has key patterns and may not run scripts ('" + name + "'): a script reaches keys it does not declare", false
	}
	if (name == "sort" || name == "sort_ro") && sortReadsOtherKeys(args) {
		// BY and GET read keys made from a pattern, as Redis refuses
		// them to users without access to every key.
		h.metrics.deniedKey.Inc()
		return "NOPERM BY and GET options of SORT read keys outside this user's patterns", false
	}
	var bad []byte
	switch {
	case c != nil:
		if c.FirstKey > 0 {
			last := c.LastKey
			if last < 0 {
				last = len(args) + last
			}
			for i := c.FirstKey; i <= last && i < len(args); i += max(c.Step, 1) {
				if p.keyOutside(args[i]) {
					bad = args[i]
					break
				}
			}
		}
	case h.up != nil && !h.onLockKeys(args):
		bad = h.up.KeyWhere([]byte(name), args, p.keyOutside)
	default:
		// No upstream: only transparent mode serves such a command.
		bad = transparentKeyWhere(name, args, p.keyOutside)
	}
	if bad != nil {
		h.metrics.deniedKey.Inc()
		return "NOPERM No permissions to access a key", false
	}
	return "", true
}

// scriptCommands run code that may reach any key.
var scriptCommands = map[string]bool{
	"eval": true, "evalsha": true, "eval_ro": true, "evalsha_ro": true, "fcall": true, "fcall_ro": true,
}

// sortReadsOtherKeys tells whether a SORT reads keys by pattern: BY with a
// '*' in it (BY without one does not sort by keys), or GET other than '#'.
func sortReadsOtherKeys(args [][]byte) bool {
	for i := 2; i+1 < len(args); i++ {
		switch {
		case resp.EqualFold(args[i], "BY"):
			if bytes.IndexByte(args[i+1], '*') >= 0 {
				return true
			}
			i++
		case resp.EqualFold(args[i], "GET"):
			if string(args[i+1]) != "#" {
				return true
			}
			i++
		}
	}
	return false
}

// checkPermission answers a command the connection's user may not run,
// and reports whether it did. In a transaction the refusal also aborts
// the EXEC, as in Redis.
func (h *Handler) checkPermission(s *resp.Session, cs *conn, name string, c *Command, args [][]byte) bool {
	msg, ok := h.permitted(cs.perm, userName(cs), name, c, args)
	if ok {
		return false
	}
	if cs.rl != nil && cs.rl.multi {
		cs.rl.dirty = true
	}
	s.W.Error(msg)
	return true
}

// transparentKeyWhere is the first key for which match is true of a
// command transparent mode serves (see onLockKeys), or nil.
func transparentKeyWhere(name string, args [][]byte, match func([]byte) bool) []byte {
	from, n := 1, 1
	switch name {
	case "script":
		return nil // its argument is a subcommand
	case "eval", "evalsha", "eval_ro", "evalsha_ro":
		if len(args) < 3 {
			return nil
		}
		nk, ok := resp.ParseInt(args[2])
		if !ok || nk < 0 {
			return nil // refused as a syntax error
		}
		from, n = 3, int(nk)
	case "exists", "del", "unlink":
		n = len(args)
	}
	for i := from; i < from+n && i < len(args); i++ {
		if match(args[i]) {
			return args[i]
		}
	}
	return nil
}
