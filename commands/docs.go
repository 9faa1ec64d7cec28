package commands

import (
	"strings"

	"github.com/lockproxy/lockproxy/resp"
)

// COMMAND and its subcommands, written from the table in the shapes Redis 7
// uses. redis-cli reads COMMAND DOCS when it starts and asserts the reply's
// shape, so the shapes here follow Redis exactly: status strings for flags,
// bulk strings for names and docs, maps (flat arrays in RESP2) for docs.

func (h *Handler) command(s *resp.Session, args [][]byte) {
	names := sortedNames()
	s.W.Array(len(names))
	for _, n := range names {
		writeInfo(s.W, nil, table[n])
	}
}

func (h *Handler) commandCount(s *resp.Session, args [][]byte) { s.W.Int(int64(len(table))) }

func (h *Handler) commandList(s *resp.Session, args [][]byte) {
	f, ok := parseListFilter(args)
	if !ok {
		s.W.Error(errSyntax.Error())
		return
	}
	var names []string
	if f == nil {
		names = sortedNames()
	} else {
		names = f.local()
	}
	s.W.Array(len(names))
	for _, n := range names {
		s.W.BulkString(n)
	}
}

// listFilter is COMMAND LIST's FILTERBY MODULE|ACLCAT|PATTERN arg.
type listFilter struct {
	kind string // "module", "aclcat" or "pattern"
	arg  string
}

// parseListFilter parses COMMAND LIST [FILTERBY kind arg] (args from
// COMMAND) as Redis 7's commandListCommand does: one FILTERBY with exactly
// its two words, else a syntax error (ok false). The filter is nil when
// none is given.
func parseListFilter(args [][]byte) (f *listFilter, ok bool) {
	switch {
	case len(args) == 2:
		return nil, true
	case len(args) != 5 || !resp.EqualFold(args[2], "FILTERBY"):
		return nil, false
	}
	kind := strings.ToLower(string(args[3]))
	switch kind {
	case "module", "aclcat", "pattern":
	default:
		return nil, false
	}
	return &listFilter{kind: kind, arg: string(args[4])}, true
}

// matches tells whether the filter lists c (a subcommand of parent, or a
// command when parent is nil), as Redis's shouldFilterFromCommandList:
// ACLCAT a category's name without '@', case-insensitively; PATTERN a
// glob matched against the full name ("client|id"), case-insensitively;
// MODULE none, lockproxy having no module commands.
func (f *listFilter) matches(parent, c *Command) bool {
	switch f.kind {
	case "aclcat":
		for _, cat := range c.Categories {
			if strings.EqualFold(strings.TrimPrefix(cat, "@"), f.arg) {
				return true
			}
		}
		return false
	case "pattern":
		return globMatch(strings.ToLower(f.arg), []byte(fullName(parent, c)))
	}
	return false
}

// local is what the filter lists of lockproxy's table, commands and
// subcommands, sorted.
func (f *listFilter) local() []string {
	names := []string{}
	for _, n := range sortedNames() {
		c := table[n]
		if f.matches(nil, c) {
			names = append(names, n)
		}
		for _, sc := range sortedSubs(c) {
			if f.matches(c, sc) {
				names = append(names, fullName(c, sc))
			}
		}
	}
	return names
}

func (h *Handler) commandInfo(s *resp.Session, args [][]byte) {
	if len(args) == 2 {
		h.command(s, args)
		return
	}
	s.W.Array(len(args) - 2)
	for _, a := range args[2:] {
		parent, c := find(string(a))
		if c == nil {
			// Redis's addReplyNull: "$-1" in RESP2, not a null array.
			s.W.Null()
			continue
		}
		writeInfo(s.W, parent, c)
	}
}

// find resolves "lock" or "client|setname".
func find(name string) (parent, c *Command) {
	name = strings.ToLower(name)
	if p, sub, ok := strings.Cut(name, "|"); ok {
		if parent = table[p]; parent != nil {
			return parent, parent.Subs[sub]
		}
		return nil, nil
	}
	return nil, table[name]
}

func writeInfo(w *resp.Writer, parent, c *Command) { writeInfoWith(w, parent, c, nil) }

// writeInfoWith is writeInfo with extra, COMMAND INFO entries of the
// upstream's, among c's subcommands.
func writeInfoWith(w *resp.Writer, parent, c *Command, extra [][]byte) {
	w.Array(10)
	w.BulkString(fullName(parent, c))
	w.Int(int64(c.Arity))
	w.Set(len(c.Flags))
	for _, f := range c.Flags {
		w.Simple(f)
	}
	w.Int(int64(c.FirstKey))
	w.Int(int64(c.LastKey))
	w.Int(int64(c.Step))
	w.Set(len(c.Categories))
	for _, cat := range c.Categories {
		w.Simple(cat)
	}
	w.Array(0) // tips
	if c.FirstKey > 0 {
		writeKeySpec(w, c)
	} else {
		w.Array(0)
	}
	subs := sortedSubs(c)
	w.Array(len(subs) + len(extra))
	for _, sc := range subs {
		writeInfo(w, c, sc)
	}
	for _, e := range extra {
		w.Raw(e)
	}
}

func writeKeySpec(w *resp.Writer, c *Command) {
	w.Array(1)
	w.Map(3)
	w.BulkString("flags")
	w.Set(1)
	if hasFlag(c, "write") {
		w.Simple("RW")
	} else {
		w.Simple("RO")
	}
	w.BulkString("begin_search")
	w.Map(2)
	w.BulkString("type")
	w.BulkString("index")
	w.BulkString("spec")
	w.Map(1)
	w.BulkString("index")
	w.Int(int64(c.FirstKey))
	w.BulkString("find_keys")
	w.Map(2)
	w.BulkString("type")
	w.BulkString("range")
	w.BulkString("spec")
	w.Map(3)
	w.BulkString("lastkey")
	w.Int(int64(c.LastKey - c.FirstKey))
	w.BulkString("keystep")
	w.Int(int64(c.Step))
	w.BulkString("limit")
	w.Int(0)
}

func hasFlag(c *Command, f string) bool {
	for _, x := range c.Flags {
		if x == f {
			return true
		}
	}
	return false
}

func (h *Handler) commandDocs(s *resp.Session, args [][]byte) {
	type entry struct {
		parent, c *Command
	}
	var entries []entry
	if len(args) == 2 {
		for _, n := range sortedNames() {
			entries = append(entries, entry{nil, table[n]})
		}
	} else {
		for _, a := range args[2:] {
			if p, c := find(string(a)); c != nil {
				entries = append(entries, entry{p, c})
			}
		}
	}
	s.W.Map(len(entries))
	for _, e := range entries {
		s.W.BulkString(fullName(e.parent, e.c))
		writeDoc(s.W, e.c)
	}
}

func writeDoc(w *resp.Writer, c *Command) { writeDocWith(w, c, nil) }

// writeDocWith is writeDoc with extra, the upstream's subcommand docs
// (name and doc frames in turn), among c's subcommands.
func writeDocWith(w *resp.Writer, c *Command, extra [][]byte) {
	n := 4
	if len(c.Args) > 0 {
		n++
	}
	if len(c.Subs) > 0 || len(extra) > 0 {
		n++
	}
	w.Map(n)
	w.BulkString("summary")
	w.BulkString(c.Summary)
	w.BulkString("since")
	w.BulkString(c.Since)
	w.BulkString("group")
	w.BulkString(c.Group)
	w.BulkString("complexity")
	w.BulkString(c.Complexity)
	if len(c.Args) > 0 {
		w.BulkString("arguments")
		writeArgs(w, c.Args)
	}
	if len(c.Subs) > 0 || len(extra) > 0 {
		w.BulkString("subcommands")
		subs := sortedSubs(c)
		w.Map(len(subs) + len(extra)/2)
		for _, sc := range subs {
			w.BulkString(fullName(c, sc))
			writeDoc(w, sc)
		}
		for _, e := range extra {
			w.Raw(e)
		}
	}
}

func writeArgs(w *resp.Writer, args []Arg) {
	w.Array(len(args))
	for i, a := range args {
		n := 3 // name, type, display_text
		if a.Type == "key" {
			n++
		}
		if a.Token != "" {
			n++
		}
		if len(a.Flags) > 0 {
			n++
		}
		if len(a.Args) > 0 {
			n++
		}
		if a.Type == "pure-token" || a.Type == "oneof" || a.Type == "block" {
			n-- // no display_text
		}
		w.Map(n)
		w.BulkString("name")
		w.BulkString(a.Name)
		w.BulkString("type")
		w.BulkString(a.Type)
		if a.Type == "key" {
			w.BulkString("key_spec_index")
			w.Int(0)
		}
		if !(a.Type == "pure-token" || a.Type == "oneof" || a.Type == "block") {
			w.BulkString("display_text")
			d := a.Display
			if d == "" {
				d = a.Name
			}
			w.BulkString(d)
		}
		if a.Token != "" {
			w.BulkString("token")
			w.BulkString(a.Token)
		}
		if len(a.Flags) > 0 {
			w.BulkString("flags")
			w.Set(len(a.Flags))
			for _, f := range a.Flags {
				w.Simple(f)
			}
		}
		if len(a.Args) > 0 {
			w.BulkString("arguments")
			writeArgs(w, a.Args)
		}
		_ = i
	}
}

// commandGetKeys: COMMAND GETKEYS cmd arg...
func (h *Handler) commandGetKeys(s *resp.Session, args [][]byte) {
	c := lookup(args[2])
	if c == nil {
		s.W.Error("ERR Invalid command specified")
		return
	}
	words := args[2:]
	if !arityOK(c.Arity, len(words)) {
		s.W.Error("ERR Invalid number of arguments specified for command")
		return
	}
	if c.FirstKey == 0 {
		s.W.Error("ERR The command has no key arguments")
		return
	}
	last := c.LastKey
	if last < 0 {
		last = len(words) + last
	}
	var keys [][]byte
	for i := c.FirstKey; i <= last && i < len(words); i += max(c.Step, 1) {
		keys = append(keys, words[i])
	}
	s.W.Array(len(keys))
	for _, k := range keys {
		s.W.Bulk(k)
	}
}
