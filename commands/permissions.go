package commands

import (
	"bytes"
	"slices"
	"strings"

	"github.com/lockproxy/lockproxy/resp"
)

// Permission limits what a user may do (auth.permissions): the commands
// it may run, the globs every key of a command must match and those every
// pub/sub channel must match.
type Permission struct {
	// Commands are rules in order, each "+" (allow) or "-" (deny; no sign:
	// allow) and a lower-case command ("get"), subcommand ("config|get")
	// or category ("@write"; "@lock" is lockproxy's lock commands, "@all"
	// every command). The last rule that matches decides; none: refused.
	Commands []string
	// Keys are Redis-style globs (globMatch: * takes any bytes, '/'
	// included). With neither Keys nor LimitKeys: any key.
	Keys      []string
	LimitKeys bool
	// Channels are globs for pub/sub channels, as Keys for keys.
	Channels      []string
	LimitChannels bool
}

// rule is one command rule of a Permission.
type rule struct {
	allow    bool
	cmd, sub string // the command, and the subcommand for "cmd|sub"
	category string // "@write", …; "" for a command rule
}

// matches tells whether r names the command name (subcommand sub) whose
// categories are cats. When the categories are not known (known false: a
// relayed command the upstream has not described), a rule that removes a
// category is taken to match and one that adds it not: "+@all -@write"
// refuses what it cannot tell is not a write.
func (r rule) matches(name, sub string, cats []string, known bool) bool {
	switch {
	case r.category == "@all":
		return true
	case r.category != "" && !known:
		return !r.allow
	case r.category != "":
		return slices.Contains(cats, r.category)
	case r.cmd != name:
		return false
	}
	return r.sub == "" || r.sub == sub
}

// perm is a Permission made ready for the checks.
type perm struct {
	rules []rule
	// keys, when limitKeys, are the globs every key must match; channels,
	// when limitChannels, those for channels.
	keys          []string
	limitKeys     bool
	channels      []string
	limitChannels bool
	// everything is true when the rules allow every command, key and
	// channel: only such a user runs scripts or reads a lock key's value
	// (see permitted).
	everything bool
}

func newPerm(p Permission) *perm {
	pm := &perm{}
	for _, c := range p.Commands {
		r := rule{allow: true}
		switch {
		case strings.HasPrefix(c, "-"):
			r.allow, c = false, c[1:]
		case strings.HasPrefix(c, "+"):
			c = c[1:]
		}
		if strings.HasPrefix(c, "@") {
			r.category = c
		} else {
			r.cmd, r.sub, _ = strings.Cut(c, "|")
		}
		pm.rules = append(pm.rules, r)
	}
	// A "*" glob takes every name: the same as no limit (allkeys,
	// allchannels), which a user must have to run scripts.
	pm.keys, pm.limitKeys = p.Keys, (p.LimitKeys || len(p.Keys) > 0) && !slices.Contains(p.Keys, "*")
	pm.channels, pm.limitChannels = p.Channels, (p.LimitChannels || len(p.Channels) > 0) && !slices.Contains(p.Channels, "*")
	pm.everything = allowsEveryCommand(pm.rules) && !pm.limitKeys && !pm.limitChannels
	return pm
}

// allowsEveryCommand tells whether rules allow every command: a "+@all"
// with no denying rule after it. It errs on the side of "no" ("+@all -get
// +get" is taken as narrower), which only costs such a user its scripts.
func allowsEveryCommand(rules []rule) bool {
	all := false
	for _, r := range rules {
		switch {
		case r.category == "@all":
			all = r.allow
		case !r.allow:
			all = false
		}
	}
	return all
}

// allows tells whether the rules let the user run the command name (with
// subcommand sub, "" for none) whose categories are cats.
func (p *perm) allows(name, sub string, cats []string, known bool) bool {
	ok := false
	for _, r := range p.rules {
		if r.matches(name, sub, cats, known) {
			ok = r.allow
		}
	}
	return ok
}

// alwaysPermitted are the commands every user may run: a client library
// sends them as it connects, and they reach no key.
var alwaysPermitted = map[string]bool{
	"auth": true, "hello": true, "ping": true, "echo": true, "quit": true, "reset": true,
	"command": true, "info": true,
}

// bcastOutside tells whether CLIENT TRACKING ON … BCAST (args) would
// report keys outside the user's globs: it has no PREFIX (every key), or
// a PREFIX that no glob of the form "literal*" covers (every key starting
// with the PREFIX starts with the literal). Other globs cannot be shown to
// cover a prefix, and are not taken for one.
func (p *perm) bcastOutside(args [][]byte) bool {
	if len(args) < 3 || !resp.EqualFold(args[2], "ON") || !hasWord(args, "BCAST") {
		return false
	}
	prefixes := 0
	for i := 3; i+1 < len(args); i++ {
		if !resp.EqualFold(args[i], "PREFIX") {
			continue
		}
		pre := args[i+1]
		i++
		prefixes++
		covered := false
		for _, g := range p.keys {
			lit, ok := strings.CutSuffix(g, "*")
			if ok && !strings.ContainsAny(lit, "*?[\\") && bytes.HasPrefix(pre, []byte(lit)) {
				covered = true
				break
			}
		}
		if !covered {
			return true
		}
	}
	return prefixes == 0
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

// channelDenied tells whether a pub/sub command reaches a channel the
// user's globs do not allow. A PSUBSCRIBE pattern must equal one of them,
// as in Redis: a pattern's reach cannot be compared with a glob's.
func (p *perm) channelDenied(name string, args [][]byte) bool {
	if !p.limitChannels {
		return false
	}
	var chans [][]byte
	switch name {
	case "subscribe", "ssubscribe", "psubscribe":
		chans = args[1:]
	case "publish", "spublish":
		if len(args) > 1 {
			chans = args[1:2]
		}
	}
	for _, ch := range chans {
		ok := false
		for _, g := range p.channels {
			if name == "psubscribe" && g == string(ch) || name != "psubscribe" && globMatch(g, ch) {
				ok = true
				break
			}
		}
		if !ok {
			return true
		}
	}
	return false
}

// transparentCategories are the categories of the commands transparent
// mode serves, for a handler without an upstream to ask (Redis 7's).
var transparentCategories = map[string][]string{
	"get":           {"@read", "@string", "@fast"},
	"set":           {"@write", "@string", "@slow"},
	"del":           {"@keyspace", "@write", "@slow"},
	"unlink":        {"@keyspace", "@write", "@fast"},
	"exists":        {"@keyspace", "@read", "@fast"},
	"pexpire":       {"@keyspace", "@write", "@fast"},
	"expire":        {"@keyspace", "@write", "@fast"},
	"pttl":          {"@keyspace", "@read", "@fast"},
	"ttl":           {"@keyspace", "@read", "@fast"},
	"eval":          {"@slow", "@scripting"},
	"evalsha":       {"@slow", "@scripting"},
	"eval_ro":       {"@slow", "@scripting"},
	"evalsha_ro":    {"@slow", "@scripting"},
	"script|load":   {"@slow", "@scripting"},
	"script|exists": {"@slow", "@scripting"},
	"script|flush":  {"@slow", "@scripting"},
}

// maxSubcommand is the longest argument taken for a subcommand name:
// longer ones are none, so a huge argument is never copied or lowered.
const maxSubcommand = 64

// commandOf is the command's name as rules and refusals name it ("name",
// or "name|sub" for a container's subcommand), the subcommand (args[1]
// in lower case, "" when there is none or it is too long to be one), and
// its categories: from lockproxy's table (c) for what lockproxy serves,
// else the upstream's COMMAND table, else transparent mode's. known is
// false when none of them describes the command.
func (h *Handler) commandOf(name string, c *Command, args [][]byte) (full, sub string, cats []string, known bool) {
	full = name
	if len(args) > 1 && len(args[1]) <= maxSubcommand {
		var buf [maxSubcommand]byte
		sub = string(resp.Lower(buf[:], args[1]))
	}
	if c != nil {
		if sc := c.Subs[sub]; sc != nil {
			return name + "|" + sub, sub, sc.Categories, true
		}
		if len(c.Subs) == 0 {
			return name, sub, c.Categories, true
		}
		// A subcommand lockproxy does not serve (CLIENT PAUSE) is
		// relayed: it is what the upstream says it is.
		full = name + "|" + sub
		if h.up != nil && sub != "" {
			if f, cs, ok := h.up.Command([]byte(name), args); ok && f == full {
				return full, sub, cs, true
			}
		}
		if cs, ok := unlistedSubCategories[full]; ok && h.up == nil {
			return full, sub, cs, true
		}
		return full, sub, nil, false
	}
	if h.up != nil {
		if f, cs, ok := h.up.Command([]byte(name), args); ok {
			return f, sub, cs, true
		}
	}
	if cs, ok := transparentCategories[name+"|"+sub]; ok && name == "script" {
		return name + "|" + sub, sub, cs, true
	}
	cs, ok := transparentCategories[name]
	return name, sub, cs, ok
}

// unlistedSubCategories are Redis's categories of the subcommands that
// lockproxy serves without an upstream but leaves out of its command
// table, where they would take them from the upstream when there is one
// (CLIENT UNBLOCK: see clientUnblockLocal; CLIENT HELP and COMMAND HELP:
// see help).
var unlistedSubCategories = map[string][]string{
	"client|unblock": {"@admin", "@slow", "@dangerous", "@connection"},
	"client|help":    {"@slow", "@connection"},
	"command|help":   {"@slow", "@connection"},
}

// ownClientSubs are the CLIENT subcommands every user may run: about its
// own connection, sent by client libraries as they connect.
var ownClientSubs = map[string]bool{"setname": true, "getname": true, "id": true, "setinfo": true, "info": true}

// permitted tells whether p lets a connection run args, whose lower-case
// name is name and whose table entry is c (nil for a relayed command); when
// not, it is the error reply, in Redis's words.
//
// relayed is true when the connection is in a state (MULTI, RESP3 pub/sub)
// in which every command goes to the upstream: then INFO and the like are
// the upstream's, and only QUIT and RESET, still lockproxy's, go unchecked.
func (h *Handler) permitted(p *perm, user, name string, c *Command, args [][]byte, relayed bool) (string, bool) {
	if name == "quit" || name == "reset" || alwaysPermitted[name] && !relayed {
		return "", true
	}
	full, sub, cats, known := h.commandOf(name, c, args)
	switch {
	case name == "client" && ownClientSubs[sub] && !relayed:
		return "", true // the connection's own name and id
	case !p.allows(name, sub, cats, known) && !h.endsTransaction(p, name):
		h.metrics.deniedCommand.Inc()
		return "NOPERM User " + user + " has no permissions to run the '" + full + "' command", false
	case scriptCommands[name] && !p.everything:
		return h.refuseScript(p, user, name), false
	}
	if p.channelDenied(name, args) {
		h.metrics.deniedChannel.Inc()
		return "NOPERM No permissions to access a channel", false
	}
	if !p.limitKeys {
		return h.lockValueCheck(p, user, name, args)
	}
	if name == "client" && strings.EqualFold(sub, "tracking") && p.bcastOutside(args) {
		// Broadcast invalidations name every key written under the
		// prefixes, whoever writes it.
		h.metrics.deniedKey.Inc()
		return "NOPERM No permissions to access a key", false
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
	return h.lockValueCheck(p, user, name, args)
}

// refuseScript is the refusal of a script (EVAL, FCALL, …) to a user not
// allowed everything, counted under the limit that stops it. A script
// runs as lockproxy's own user, on the upstream and (in transparent mode)
// on the lock nodes, and reaches whatever commands, keys and channels it
// names inside, which lockproxy cannot check as Redis's ACL checks each
// redis.call: so any limit at all keeps a user from scripts.
func (h *Handler) refuseScript(p *perm, user, name string) string {
	switch {
	case p.limitKeys:
		h.metrics.deniedKey.Inc()
		return "NOPERM User " + user + " has key patterns and may not run scripts ('" + name + "'): a script reaches keys it does not declare"
	case p.limitChannels:
		h.metrics.deniedChannel.Inc()
		return "NOPERM User " + user + " has channel patterns and may not run scripts ('" + name + "'): a script reaches channels it does not declare"
	}
	h.metrics.deniedCommand.Inc()
	return "NOPERM User " + user + " is not allowed every command and may not run scripts ('" + name + "'): lockproxy cannot check the commands a script calls"
}

// lockValueCheck refuses, to a user not allowed everything, the commands
// that show a lock key's value (transparent mode's GET, and SET … GET):
// the value is the holder's token, with which UNLOCK releases the lock
// and LOCK … TOKEN joins it under the same fence, so LOCKINFO shows it
// only to the caller that names it. Lockproxy cannot tell whether LOCK or
// a client's own SET NX put the value there, so it is refused for all;
// such a user checks a lock with LOCKINFO key TOKEN token, PTTL or
// EXISTS. A user allowed everything, who could read the value with a
// script anyway, is served as before.
func (h *Handler) lockValueCheck(p *perm, user, name string, args [][]byte) (string, bool) {
	if p.everything || !h.readsLockValue(name, args) {
		return "", true
	}
	h.metrics.deniedKey.Inc()
	return "NOPERM User " + user + " may not read a lock key's value, its holder's token: use LOCKINFO key TOKEN token, PTTL or EXISTS", false
}

// readsLockValue tells whether args (named name, in lower case) is a
// command transparent mode serves with a lock key's value in the reply:
// GET, or SET with the GET option.
func (h *Handler) readsLockValue(name string, args [][]byte) bool {
	if name != "get" && name != "set" || len(args) < 2 || !h.isLockKey(args[1]) {
		return false
	}
	if name == "get" {
		return true
	}
	// A TTL cannot be "GET", so any option spelled so is the flag; every
	// option is looked at, as tSet takes repeated ones.
	for i := 3; i < len(args); i++ {
		if resp.EqualFold(args[i], "GET") {
			return true
		}
	}
	return false
}

// endsTransaction tells whether name is EXEC or DISCARD and the user may
// open a transaction: one it may open, it may end.
func (h *Handler) endsTransaction(p *perm, name string) bool {
	if name != "exec" && name != "discard" {
		return false
	}
	multi := [][]byte{[]byte("multi")}
	_, sub, cats, known := h.commandOf("multi", table["multi"], multi)
	return p.allows("multi", sub, cats, known)
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
	relayed := cs.rl != nil && (cs.rl.multi || cs.rl.pipe.Tunneling())
	msg, ok := h.permitted(cs.perm, userName(cs), name, c, args, relayed)
	if ok {
		return false
	}
	if cs.rl != nil && cs.rl.multi {
		cs.rl.dirty = true
	}
	if cs.lw != nil && cs.lw.multi {
		cs.lw.dirty = true
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
