package relay

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// keySpec is where a command's keys are, from the upstream's COMMAND.
type keySpec struct {
	first, last, step int
	movable           bool
	// writes: the command may change what the upstream replicates (its
	// flags say write or may_replicate), for WAIT (MayWrite).
	writes bool
	// container: the command has subcommands, whose entries tell.
	container bool
	// categories are the command's ACL categories ("@write", …), for
	// per-user rules (auth.permissions).
	categories []string
}

type keySpecs map[string]keySpec

// specTable is the upstream's key positions, and those of its commands
// that Check can settle with one lookup: keys at fixed positions, not
// denied in whole or by subcommand, not special-cased by name in
// reservedKey, carrying no script.
type specTable struct {
	all    keySpecs
	simple keySpecs
}

// byName are the commands reservedKey and scriptBody handle by name.
var byName = map[string]bool{
	"eval": true, "evalsha": true, "eval_ro": true, "evalsha_ro": true, "fcall": true, "fcall_ro": true,
	"zunionstore": true, "zinterstore": true, "zdiffstore": true, "zunion": true, "zinter": true,
	"zdiff": true, "zintercard": true, "sintercard": true, "lmpop": true, "zmpop": true,
	"blmpop": true, "bzmpop": true, "xread": true, "xreadgroup": true, "sort": true, "sort_ro": true,
	"georadius": true, "georadiusbymember": true, "migrate": true, "script": true, "function": true,
}

// setSpecs installs the key positions and categories read from the
// upstream, in place of any read before.
func (r *Relay) setSpecs(ks keySpecs) {
	t := &specTable{all: ks, simple: keySpecs{}}
	for name, s := range ks {
		if s.first <= 0 || s.movable || byName[name] || r.deny[name] || r.denySub[name] != nil ||
			strings.Contains(name, "|") {
			continue
		}
		t.simple[name] = s
	}
	r.specs.Store(t)

}

// keyAt returns the first of args at s's key positions that starts with
// prefix, or nil.
func (s keySpec) keyAt(args [][]byte, prefix []byte) []byte {
	return s.keyWhere(args, func(k []byte) bool { return bytes.HasPrefix(k, prefix) })
}

// keyWhere is keyAt with any test of a key.
func (s keySpec) keyWhere(args [][]byte, match func([]byte) bool) []byte {
	last := s.last
	if last < 0 {
		last = len(args) + last
	}
	step := max(s.step, 1)
	for i := s.first; i <= last && i < len(args); i += step {
		if match(args[i]) {
			return args[i]
		}
	}
	return nil
}

// parseSpecs reads the reply to COMMAND; nil when it is not one.
func parseSpecs(f []byte) keySpecs {
	_, entries, ok := elements(f)
	if !ok || len(entries) == 0 {
		return nil
	}
	ks := keySpecs{}
	var add func(e []byte)
	add = func(e []byte) {
		_, el, ok := elements(e)
		if !ok || len(el) < 6 {
			return
		}
		name, ok := str(el[0])
		if !ok {
			return
		}
		var s keySpec
		if _, flags, ok := elements(el[2]); ok {
			for _, fl := range flags {
				switch v, _ := str(fl); string(v) {
				case "movablekeys":
					s.movable = true
				case "write", "may_replicate":
					s.writes = true
				}
			}
		}
		a, _ := integer(el[3])
		b, _ := integer(el[4])
		c, _ := integer(el[5])
		s.first, s.last, s.step = int(a), int(b), int(c)
		if len(el) >= 9 && onlyNotKeys(el[8]) {
			// SPUBLISH, SSUBSCRIBE, SUNSUBSCRIBE: first/last/step point
			// at the shard channel, for cluster routing, but the key
			// specs say it is no key, and Redis's ACL checks it against
			// the channel patterns only.
			s.first, s.last, s.step = 0, 0, 0
		}
		if len(el) >= 7 {
			if _, cats, ok := elements(el[6]); ok {
				for _, cat := range cats {
					if v, ok := str(cat); ok {
						s.categories = append(s.categories, lower(string(v)))
					}
				}
			}
		}
		if len(el) >= 10 {
			if _, subs, ok := elements(el[9]); ok && len(subs) > 0 {
				s.container = true
				for _, sub := range subs {
					add(sub)
				}
			}
		}
		ks[lower(string(name))] = s
	}
	for _, e := range entries {
		add(e)
	}
	return ks
}

// onlyNotKeys tells whether f, a command's key specifications (the ninth
// field of its COMMAND entry), lists at least one and every one carries
// the not_key flag: the legacy first/last/step then name arguments that
// are no keys.
// A command whose specs mix both keeps its legacy positions: checking a
// channel as a key as well errs on the safe side.
func onlyNotKeys(f []byte) bool {
	_, specs, ok := elements(f)
	if !ok || len(specs) == 0 {
		return false
	}
	for _, spec := range specs {
		_, fields, ok := elements(spec) // RESP2 array or RESP3 map: name, value, …
		if !ok {
			return false
		}
		notKey := false
		for i := 0; i+1 < len(fields); i += 2 {
			if name, _ := str(fields[i]); string(name) != "flags" {
				continue
			}
			_, flags, _ := elements(fields[i+1])
			for _, fl := range flags {
				if v, _ := str(fl); lower(string(v)) == "not_key" {
					notKey = true
				}
			}
		}
		if !notKey {
			return false
		}
	}
	return true
}

// DeniedError is a command refused by upstream.deny_commands.
type DeniedError struct {
	Name   string
	Script bool // a script's body names the command
}

func (e *DeniedError) Error() string {
	if e.Script {
		return fmt.Sprintf("ERR the script calls '%s', which is denied by lockproxy (upstream.deny_commands)", e.Name)
	}
	return fmt.Sprintf("ERR '%s' is denied by lockproxy (upstream.deny_commands)", e.Name)
}

// UnsupportedError is a command never relayed, whatever
// upstream.deny_commands says (see neverRelayed).
type UnsupportedError struct {
	Name string // "replconf", "script|debug"
}

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("ERR '%s' is not supported through lockproxy: the upstream connection is shared with other clients, "+
		"and it would not answer with exactly one reply or would leave state on the connection", e.Name)
}

// neverRelayed names the commands that break what a shared upstream
// connection relies on: one reply per command, in order, and no state
// left on the connection for the next client's commands. Redis never
// answers REPLCONF ACK from a connection that is no replica's, so every
// reply behind it would go to the wrong client; SYNC and PSYNC turn the
// connection into a replication stream (an RDB, then every write); SCRIPT
// DEBUG (below) makes the next EVAL on the connection, any client's, open
// a Lua debugger that takes the other clients' commands for debugger
// commands. CLIENT REPLY, of the same kind, is refused by the commands
// package; MONITOR and the subscribe commands run on a pinned connection
// in tunnel mode; DEBUG is left to deny_commands (its subcommands each
// answer once, or take the upstream down). READONLY and READWRITE set a
// cluster connection's mode for every command after them, and ASKING the
// next command's, whoever sends it.
var neverRelayed = map[string]bool{"replconf": true, "sync": true, "psync": true,
	"readonly": true, "readwrite": true, "asking": true}

// neverRelayedSub are neverRelayed's subcommands, by command.
var neverRelayedSub = map[string]string{"script": "debug"}

// ReservedError is a command that would touch lockproxy's lock keys.
type ReservedError struct {
	Key    string
	Prefix string
	Script bool
	// Pattern: Key is a SORT BY or GET pattern that may look up a key
	// under the prefix.
	Pattern bool
	// Restore: a FUNCTION RESTORE, whose bodies cannot be checked.
	Restore bool
}

func (e *ReservedError) Error() string {
	if e.Pattern {
		return fmt.Sprintf("ERR SORT's BY/GET pattern '%s' may read keys under the prefix '%s', which is reserved for lockproxy's locks; "+
			"use a pattern that starts with other text", Clip(e.Key), e.Prefix)
	}
	if e.Restore {
		return fmt.Sprintf("ERR FUNCTION RESTORE is not supported through lockproxy: the libraries' bodies cannot be checked for keys under the prefix '%s', "+
			"which is reserved for lockproxy's locks; load them with FUNCTION LOAD", e.Prefix)
	}
	if e.Script {
		return fmt.Sprintf("ERR script names the key prefix '%s', which is reserved for lockproxy's locks", e.Prefix)
	}
	return fmt.Sprintf("ERR key '%s' is reserved for lockproxy's locks (prefix '%s'); relayed commands may not touch it", Clip(e.Key), e.Prefix)
}

// Clip shortens user text echoed in an error reply, as Redis does: at
// most 128 bytes, with line breaks made spaces so the reply stays one line.
func Clip(s string) string {
	if len(s) > 128 {
		s = s[:128] + "..."
	}
	return strings.Map(func(r rune) rune {
		if r == '\r' || r == '\n' {
			return ' '
		}
		return r
	}, s)
}

// Check returns a *DeniedError or *ReservedError when args may not be
// relayed, else nil. name is the lower-case command name. It allocates
// nothing for a command that passes (the relay's hot path).
func (r *Relay) Check(name []byte, args [][]byte) error {
	if t := r.specs.Load(); t != nil && len(r.prefix) > 0 {
		// Most commands (GET, SET, HSET…): one lookup.
		if s, ok := t.simple[string(name)]; ok {
			if bad := s.keyAt(args, r.prefix); bad != nil {
				return &ReservedError{Key: string(bad), Prefix: r.cfg.KeyPrefix}
			}
			return nil
		}
	}
	if neverRelayed[string(name)] {
		return &UnsupportedError{Name: string(name)}
	}
	if sub, ok := neverRelayedSub[string(name)]; ok && len(args) > 1 && bytes.EqualFold(args[1], []byte(sub)) {
		return &UnsupportedError{Name: string(name) + "|" + sub}
	}
	if r.deny[string(name)] {
		return &DeniedError{Name: string(name)}
	}
	if subs := r.denySub[string(name)]; subs != nil && len(args) > 1 {
		var buf [32]byte
		if sub := lowerInto(buf[:0], args[1]); subs[string(sub)] {
			return &DeniedError{Name: string(name) + "|" + string(sub)}
		}
	}
	if body := scriptBody(string(name), args); body != nil && (len(r.deny) > 0 || len(r.denySub) > 0) {
		if d := r.deniedInScript(body); d != "" {
			return &DeniedError{Name: d, Script: true}
		}
	}
	if len(r.prefix) == 0 {
		return nil
	}
	r.needSpecs()
	if bad := r.reservedKey(string(name), args); bad != nil {
		return &ReservedError{Key: string(bad), Prefix: r.cfg.KeyPrefix}
	}
	for _, a := range ScriptArgs(name, args) {
		// A script handed a key's name in ARGV reaches it as surely as
		// one given it in KEYS.
		if bytes.HasPrefix(a, r.prefix) {
			return &ReservedError{Key: string(a), Prefix: r.cfg.KeyPrefix}
		}
	}
	for _, p := range SortPatterns(name, args) {
		if PatternMayReach(p, r.prefix) {
			return &ReservedError{Key: string(p), Prefix: r.cfg.KeyPrefix, Pattern: true}
		}
	}
	if body := scriptBody(string(name), args); body != nil && (bytes.Contains(body, r.prefix) || bytes.Contains(luaUnescaped(body), r.prefix)) {
		return &ReservedError{Prefix: r.cfg.KeyPrefix, Script: true}
	}
	if string(name) == "function" && len(args) > 1 && bytes.EqualFold(args[1], []byte("restore")) {
		// A dump's library bodies cannot be searched for the prefix
		// (Redis compresses them): FUNCTION LOAD's can.
		return &ReservedError{Prefix: r.cfg.KeyPrefix, Script: true, Restore: true}
	}
	return nil
}

// luaUnescaped is a script body with its escapes read as Lua 5.1 (Redis's
// Lua) reads them in a quoted string, so that a string literal cannot hide
// the prefix from a plain search: a decimal escape is its byte
// ('lockproxy\58' is "lockproxy:"), \a \b \f \n \r \t \v are control
// bytes, an escaped line break is a newline, and a backslash before any
// other character is that character ('lockproxy\:' is "lockproxy:" too).
// It is read so everywhere, in long strings and comments as well: that can
// only err on the side of refusing. body itself when it has no escape.
func luaUnescaped(body []byte) []byte {
	if bytes.IndexByte(body, '\\') < 0 {
		return body
	}
	out := make([]byte, 0, len(body))
	for i := 0; i < len(body); i++ {
		c := body[i]
		if c != '\\' || i+1 == len(body) {
			out = append(out, c)
			continue
		}
		j, n := i+1, 0
		for j < len(body) && j < i+4 && body[j] >= '0' && body[j] <= '9' {
			n = n*10 + int(body[j]-'0')
			j++
		}
		if j > i+1 {
			out = append(out, byte(min(n, 255))) // Lua refuses above 255
			i = j - 1
			continue
		}
		e := body[i+1]
		i++
		switch d, ok := luaEscapes[e]; {
		case ok:
			e = d
		case e == '\n' || e == '\r':
			// A line break, \r\n or \n\r too, is one newline.
			if i+1 < len(body) && (body[i+1] == '\n' || body[i+1] == '\r') && body[i+1] != e {
				i++
			}
			e = '\n'
		}
		out = append(out, e) // \\, \', \: …: the character itself
	}
	return out
}

// luaEscapes are Lua 5.1's one-letter escapes.
var luaEscapes = map[byte]byte{'a': '\a', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t', 'v': '\v'}

func lowerInto(b []byte, s []byte) []byte {
	for _, c := range s {
		if c >= 'A' && c <= 'Z' {
			c += 32
		}
		b = append(b, c)
	}
	return b
}

// deniedInScript names a denied command (or "command|sub") that a script
// body names as a quoted string, as redis.call('flushall') does, or is "".
// It is a guard against mistakes, not a boundary: a script can build a
// command's name at run time. The upstream's ACL for lockproxy's user is
// what holds against a client that means it (see README).
func (r *Relay) deniedInScript(body []byte) string {
	lower := bytes.ToLower(body)
	quoted := func(w string) bool {
		for _, q := range []byte{'\'', '"'} {
			if bytes.Contains(lower, append(append(append(make([]byte, 0, len(w)+2), q), w...), q)) {
				return true
			}
		}
		return false
	}
	for name := range r.deny {
		if quoted(name) {
			return name
		}
	}
	for name, subs := range r.denySub {
		if !quoted(name) {
			continue
		}
		for sub := range subs {
			if quoted(sub) {
				return name + "|" + sub
			}
		}
	}
	return ""
}

// scriptBody is the Lua or function source a command carries.
func scriptBody(name string, args [][]byte) []byte {
	switch name {
	case "eval", "eval_ro":
		if len(args) > 1 {
			return args[1]
		}
	case "script", "function":
		if len(args) > 2 && (bytes.EqualFold(args[1], []byte("load"))) {
			return args[len(args)-1]
		}
	}
	return nil
}

// ScriptBody is the Lua or function source that a command (name in lower
// case) carries: EVAL's and EVAL_RO's script, SCRIPT LOAD's and FUNCTION
// LOAD's body; nil for any other. EVALSHA carries none: only the caller
// that remembers bodies by SHA1 knows it.
func ScriptBody(name []byte, args [][]byte) []byte { return scriptBody(string(name), args) }

// ScriptArgs returns the ARGV of EVAL, EVALSHA, FCALL and their _RO forms
// (name in lower case), the arguments after numkeys keys, or nil for any
// other command. A numkeys that is no count Redis accepts (the upstream
// refuses the command) gives every argument after it: a false alarm on a
// key beats a missed argument.
func ScriptArgs(name []byte, args [][]byte) [][]byte {
	switch string(name) {
	case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro":
	default:
		return nil
	}
	if len(args) < 3 {
		return nil
	}
	n, err := strconv.Atoi(string(args[2]))
	if err != nil || n < 0 || n > len(args)-3 {
		return args[3:]
	}
	return args[3+n:]
}

// reservedKey returns the first key of the command under the lock prefix,
// or nil.
func (r *Relay) reservedKey(name string, args [][]byte) []byte {
	return r.keyWhere(name, args, func(k []byte) bool { return bytes.HasPrefix(k, r.prefix) })
}

// SortPatterns returns the BY and GET patterns of a SORT or SORT_RO (name
// in lower case) that make Redis look keys up, or nil: those with a '*',
// which the value of each element replaces ("#", and a pattern with no
// '*', BY nosort among them, look nothing up). The options are read in
// order, as Redis's parser reads them, so that LIMIT's and STORE's values
// are not taken for options.
func SortPatterns(name []byte, args [][]byte) [][]byte {
	if n := string(name); n != "sort" && n != "sort_ro" {
		return nil
	}
	var out [][]byte
	for i := 2; i < len(args); i++ {
		switch a := args[i]; {
		case bytes.EqualFold(a, []byte("limit")):
			i += 2
		case bytes.EqualFold(a, []byte("store")):
			i++
		case bytes.EqualFold(a, []byte("by")), bytes.EqualFold(a, []byte("get")):
			if i+1 < len(args) && bytes.IndexByte(args[i+1], '*') >= 0 {
				out = append(out, args[i+1])
			}
			i++
		}
	}
	return out
}

// PatternMayReach tells whether a SORT pattern (see SortPatterns) may look
// up a key that starts with prefix. Every key it looks up starts with the
// text before its first '*' (what follows, a "->field" too, comes after
// the element's value): when neither that text nor prefix starts with the
// other, no such key can start with prefix. Otherwise one may, since the
// value is any text.
func PatternMayReach(pattern, prefix []byte) bool {
	lit := pattern
	if i := bytes.IndexByte(pattern, '*'); i >= 0 {
		lit = pattern[:i]
	}
	return bytes.HasPrefix(lit, prefix) || bytes.HasPrefix(prefix, lit)
}

// MayWrite tells whether the command (name in lower case) may change what
// the upstream replicates, as WAIT counts: the upstream's COMMAND table
// flags it write or may_replicate (scripts, PUBLISH), for a container
// that of its subcommand. A command the table does not describe counts as
// a write. The table is read first when it is not yet (needSpecs, as Check
// does with a key prefix set): taken for a write, a read relayed before the
// first dial would get the client's WAIT refused. While the upstream
// cannot be reached every command counts as a write.
func (r *Relay) MayWrite(name []byte, args [][]byte) bool {
	t := r.specs.Load()
	if t == nil {
		r.needSpecs()
		if t = r.specs.Load(); t == nil {
			return true
		}
	}
	s, ok := t.all[string(name)]
	if !ok || s.writes {
		return true
	}
	switch string(name) {
	case "eval", "evalsha", "fcall":
		// A script may write, and Redis 7.0 flags these neither write
		// nor may_replicate (their _RO forms cannot write).
		return true
	}
	if s.container && len(args) > 1 && len(args[1]) <= 64 {
		var buf [128]byte
		sub := lowerInto(append(append(buf[:0], name...), '|'), args[1])
		if sp, ok := t.all[string(sub)]; ok {
			return sp.writes
		}
		return true
	}
	return false
}

// KnowsCommands tells whether the upstream's COMMAND table has been read:
// until it has, checking or relaying a command may dial the upstream for
// it (needSpecs), which the event loop must not wait for.
func (r *Relay) KnowsCommands() bool { return r.specs.Load() != nil }

// KeyPrefix is the lock key prefix relayed commands may not touch; ""
// when none is reserved.
func (r *Relay) KeyPrefix() string { return r.cfg.KeyPrefix }

// KeyWhere returns the first key of the command (name in lower case) for
// which match is true, or nil: for per-user key rules.
func (r *Relay) KeyWhere(name []byte, args [][]byte, match func([]byte) bool) []byte {
	r.needSpecs()
	return r.keyWhere(string(name), args, match)
}

// Command is what the upstream's COMMAND table says of a command, for
// per-user rules: its name, "name|sub" for a container's subcommand
// (CONFIG GET: "config|get"), and its ACL categories. Known is false when
// the upstream has not told (it is down, or has no such command).
func (r *Relay) Command(name []byte, args [][]byte) (full string, categories []string, known bool) {
	r.needSpecs()
	full = string(name)
	t := r.specs.Load()
	if t == nil {
		return full, nil, false
	}
	s, ok := t.all[full]
	if !ok {
		return full, nil, false
	}
	if len(args) > 1 && len(args[1]) <= 64 {
		// A subcommand name is short: a long argument is none, and is
		// not copied.
		var buf [128]byte
		sub := lowerInto(append(append(buf[:0], full...), '|'), args[1])
		if sp, ok := t.all[string(sub)]; ok {
			return string(sub), sp.categories, true
		}
	}
	return full, s.categories, true
}

// needSpecs makes sure the key positions are known when the upstream can
// tell them: they come with the first connection's handshake, so one is
// dialed now (or fails fast in a backoff) rather than every argument be
// taken for a key. While the upstream is unreachable it dials nothing: the
// command's own Collect fails at once then too (pool.get), so a command
// costs at most one dial_timeout.
func (r *Relay) needSpecs() {
	if r.specs.Load() != nil || r.unreachable(time.Now()) != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.DialTimeout)
	_, _ = r.shared[0].get(ctx, 0)
	cancel()
}

// keyWhere returns the first key of the command for which match is true,
// or nil. An unknown command, or one whose keys move and that is not
// special-cased here, has every argument checked: a false alarm on a value
// beats a missed key.
func (r *Relay) keyWhere(name string, args [][]byte, match func([]byte) bool) []byte {
	span := func(from, n int) []byte {
		for i := from; i < from+n && i < len(args); i++ {
			if match(args[i]) {
				return args[i]
			}
		}
		return nil
	}
	numkeys := func(at int) int {
		if at >= len(args) {
			return 0
		}
		n, err := strconv.Atoi(string(args[at]))
		if err != nil || n < 0 {
			return len(args)
		}
		return n
	}
	after := func(word string) []byte {
		for i := 1; i+1 < len(args); i++ {
			if bytes.EqualFold(args[i], []byte(word)) && match(args[i+1]) {
				return args[i+1]
			}
		}
		return nil
	}
	first := func(b ...[]byte) []byte {
		for _, k := range b {
			if k != nil {
				return k
			}
		}
		return nil
	}
	switch name {
	case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro":
		return span(3, numkeys(2))
	case "zunionstore", "zinterstore", "zdiffstore":
		return first(span(1, 1), span(3, numkeys(2)))
	case "zunion", "zinter", "zdiff", "zintercard", "sintercard", "lmpop", "zmpop":
		return span(2, numkeys(1))
	case "blmpop", "bzmpop":
		return span(3, numkeys(2))
	case "xread", "xreadgroup":
		return xreadKeys(args, span)
	case "sort", "sort_ro":
		return first(span(1, 1), after("store"))
	case "georadius", "georadiusbymember":
		return first(span(1, 1), after("store"), after("storedist"))
	case "migrate":
		return migrateKeys(args, span)
	}
	all := func() []byte { return span(1, len(args)) }
	t := r.specs.Load()
	if t == nil {
		return all()
	}
	specs := t.all
	s, ok := specs[name]
	if ok && s.first == 0 && !s.movable && len(args) > 1 {
		// A container (OBJECT, XINFO, …): its subcommand knows the keys.
		var buf [64]byte
		sub := append(append(append(buf[:0], name...), '|'), lowerInto(nil, args[1])...)
		if sp, ok2 := specs[string(sub)]; ok2 {
			s = sp
		}
	}
	switch {
	case !ok, s.movable:
		return all()
	case s.first <= 0:
		return nil
	}
	return s.keyWhere(args, match)
}

// xreadKeys are the keys of XREAD and XREADGROUP, found as Redis's
// xreadCommand reads its options: in any order, each with its values
// (COUNT n, BLOCK ms, GROUP group consumer, NOACK), up to STREAMS, after
// which the first half of the arguments are keys. A group, a consumer or
// an option's value may be the word "streams". An argument Redis would
// refuse the command for has every argument checked.
func xreadKeys(args [][]byte, span func(from, n int) []byte) []byte {
	for i := 1; i < len(args); i++ {
		more := len(args) - i - 1
		switch a := args[i]; {
		case (bytes.EqualFold(a, []byte("count")) || bytes.EqualFold(a, []byte("block"))) && more >= 1:
			i++
		case bytes.EqualFold(a, []byte("group")) && more >= 2:
			i += 2
		case bytes.EqualFold(a, []byte("noack")):
		case bytes.EqualFold(a, []byte("streams")) && more >= 1:
			return span(i+1, more/2+more%2)
		default:
			return span(1, len(args))
		}
	}
	return nil
}

// migrateKeys are the key spans of MIGRATE host port key|"" db timeout
// [COPY] [REPLACE] [AUTH password] [AUTH2 username password] [KEYS
// key…], as Redis's migrateGetKeys finds them: the KEYS clause is looked
// for from the sixth argument on, past the options' values (a password
// may be "keys"), and with it the "" at position 3 is a placeholder, no
// key. A non-empty key with a KEYS clause, which Redis refuses, is checked
// with the clause's keys: a refusal either way.
func migrateKeys(args [][]byte, span func(from, n int) []byte) []byte {
	for i := 6; i < len(args); i++ {
		switch {
		case bytes.EqualFold(args[i], []byte("keys")):
			if len(args[3]) == 0 {
				return span(i+1, len(args))
			}
			if k := span(3, 1); k != nil {
				return k
			}
			return span(i+1, len(args))
		case bytes.EqualFold(args[i], []byte("auth")):
			i++
		case bytes.EqualFold(args[i], []byte("auth2")):
			i += 2
		}
	}
	return span(3, 1)
}

// FilterKeys removes lock keys from a KEYS reply (an array of names) or a
// SCAN reply ([cursor, names]). Other replies (errors) pass unchanged.
func (r *Relay) FilterKeys(reply []byte, scan bool) []byte {
	prefix := []byte(r.cfg.KeyPrefix)
	if len(prefix) == 0 {
		return reply
	}
	t, el, ok := elements(reply)
	if !ok {
		return reply
	}
	names := el
	var head []byte
	if scan {
		if len(el) != 2 {
			return reply
		}
		head = el[0]
		var ok2 bool
		if t, names, ok2 = elements(el[1]); !ok2 {
			return reply
		}
	}
	kept := names[:0:0]
	for _, n := range names {
		if s, ok := str(n); ok && bytes.HasPrefix(s, prefix) {
			continue
		}
		kept = append(kept, n)
	}
	if len(kept) == len(names) {
		return reply
	}
	var out []byte
	if scan {
		out = append(out, '*', '2', '\r', '\n')
		out = append(out, head...)
	}
	out = append(out, t)
	out = strconv.AppendInt(out, int64(len(kept)), 10)
	out = append(out, '\r', '\n')
	for _, k := range kept {
		out = append(out, k...)
	}
	return out
}
