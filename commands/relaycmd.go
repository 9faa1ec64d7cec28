package commands

import (
	"bytes"
	"sort"
	"strings"

	"github.com/lockproxy/lockproxy/relay"
	"github.com/lockproxy/lockproxy/resp"
)

// COMMAND with an upstream: the upstream's table merged with lockproxy's,
// lockproxy's entries winning for the commands it serves itself, so that
// redis-cli's hints and client libraries see every command that works.
// Without an upstream, or when it cannot answer, lockproxy's table alone.

// upstreamReply relays args on its own and returns the reply, taking it
// back out of s.W; false when it is an error.
func (h *Handler) upstreamReply(s *resp.Session, args ...string) ([]byte, bool) {
	rs := h.relayState(s)
	h.relayCollect(s, rs, true)
	b := make([][]byte, len(args))
	for i, a := range args {
		b[i] = []byte(a)
	}
	h.relayAdd(s, rs, b)
	at := rs.at
	h.relayCollect(s, rs, true)
	all := s.W.Bytes()
	reply := bytes.Clone(all[at:])
	head := bytes.Clone(all[:at])
	s.W.Reset()
	s.W.Raw(head)
	return reply, len(reply) > 0 && reply[0] != '-' && reply[0] != '!'
}

// entryName is the lower-case name of a COMMAND INFO entry.
func entryName(e []byte) string {
	if _, el, ok := relay.Split(e); ok && len(el) > 0 {
		if n, ok := relay.Text(el[0]); ok {
			return strings.ToLower(string(n))
		}
	}
	return ""
}

func (h *Handler) commandAll(s *resp.Session, args [][]byte) {
	if h.up == nil {
		h.command(s, args)
		return
	}
	up, ok := h.upstreamReply(s, "COMMAND")
	_, el, ok2 := relay.Split(up)
	if !ok || !ok2 {
		h.command(s, args)
		return
	}
	var kept [][]byte
	extra := map[string][][]byte{} // the upstream's subcommands of lockproxy's containers
	for _, e := range el {
		if c := table[entryName(e)]; c == nil {
			kept = append(kept, e)
		} else if c.Subs != nil {
			extra[c.Name] = upstreamInfoSubs(c, e)
		}
	}
	names := sortedNames()
	s.W.Array(len(kept) + len(names))
	for _, e := range kept {
		s.W.Raw(e)
	}
	for _, n := range names {
		writeInfoWith(s.W, nil, table[n], extra[n])
	}
}

// servesSub tells whether full ("client|id") names a subcommand of c that
// lockproxy serves itself.
func servesSub(c *Command, full []byte) bool {
	_, sub, ok := strings.Cut(strings.ToLower(string(full)), "|")
	return ok && c.Subs[sub] != nil
}

// upstreamInfoSubs returns the subcommand entries of entry, the upstream's
// COMMAND INFO entry for the container c, that lockproxy does not serve
// (they are relayed): merged into lockproxy's entry for c.
func upstreamInfoSubs(c *Command, entry []byte) [][]byte {
	_, el, ok := relay.Split(entry)
	if !ok || len(el) < 10 {
		return nil
	}
	_, subs, ok := relay.Split(el[9])
	if !ok {
		return nil
	}
	var out [][]byte
	for _, sub := range subs {
		if _, sel, ok := relay.Split(sub); ok && len(sel) > 0 {
			if n, ok := relay.Text(sel[0]); ok && !servesSub(c, n) {
				out = append(out, sub)
			}
		}
	}
	return out
}

// upstreamDocSubs returns the subcommand docs (name and doc frames in
// turn) of doc, the upstream's COMMAND DOCS doc of the container c, that
// lockproxy does not serve: merged into lockproxy's doc for c.
func upstreamDocSubs(c *Command, doc []byte) [][]byte {
	_, el, ok := relay.Split(doc)
	if !ok {
		return nil
	}
	for i := 0; i+1 < len(el); i += 2 {
		if k, _ := relay.Text(el[i]); string(k) != "subcommands" {
			continue
		}
		_, subs, ok := relay.Split(el[i+1])
		if !ok {
			return nil
		}
		var out [][]byte
		for j := 0; j+1 < len(subs); j += 2 {
			if n, ok := relay.Text(subs[j]); ok && !servesSub(c, n) {
				out = append(out, subs[j], subs[j+1])
			}
		}
		return out
	}
	return nil
}

// mergedNames is the union of the upstream's command names and lockproxy's.
func (h *Handler) mergedNames(s *resp.Session) []string {
	set := map[string]bool{}
	for n := range table {
		set[n] = true
	}
	if up, ok := h.upstreamReply(s, "COMMAND", "LIST"); ok {
		if _, el, ok := relay.Split(up); ok {
			for _, e := range el {
				if n, ok := relay.Text(e); ok && !bytes.ContainsRune(n, '|') {
					set[strings.ToLower(string(n))] = true
				}
			}
		}
	}
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func (h *Handler) commandCountMerged(s *resp.Session, args [][]byte) {
	if h.up == nil {
		h.commandCount(s, args)
		return
	}
	s.W.Int(int64(len(h.mergedNames(s))))
}

func (h *Handler) commandListMerged(s *resp.Session, args [][]byte) {
	if h.up == nil {
		h.commandList(s, args)
		return
	}
	if len(args) > 2 {
		h.commandListFiltered(s, args)
		return
	}
	names := h.mergedNames(s)
	s.W.Array(len(names))
	for _, n := range names {
		s.W.BulkString(n)
	}
}

// commandListFiltered is COMMAND LIST FILTERBY with an upstream: what the
// upstream's filter lists (commands and subcommands), with lockproxy's own
// matches; lockproxy's alone when the upstream cannot answer.
func (h *Handler) commandListFiltered(s *resp.Session, args [][]byte) {
	f, ok := parseListFilter(args)
	if !ok {
		s.W.Error(errSyntax.Error())
		return
	}
	set := map[string]bool{}
	for _, n := range f.local() {
		set[n] = true
	}
	req := make([]string, len(args))
	for i, a := range args {
		req[i] = string(a)
	}
	if up, ok := h.upstreamReply(s, req...); ok {
		if _, el, ok := relay.Split(up); ok {
			for _, e := range el {
				if n, ok := relay.Text(e); ok {
					set[strings.ToLower(string(n))] = true
				}
			}
		}
	}
	names := make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	sort.Strings(names)
	s.W.Array(len(names))
	for _, n := range names {
		s.W.BulkString(n)
	}
}

// localOnly tells whether every name asked for is lockproxy's own.
func localOnly(names [][]byte) bool {
	for _, a := range names {
		// A container's entry merges in the upstream's subcommands.
		if p, c := find(string(a)); c == nil || p == nil && c.Subs != nil {
			return false
		}
	}
	return true
}

func (h *Handler) commandInfoMerged(s *resp.Session, args [][]byte) {
	if h.up != nil && len(args) == 2 {
		h.commandAll(s, args)
		return
	}
	if h.up == nil || localOnly(args[2:]) {
		h.commandInfo(s, args)
		return
	}
	req := []string{"COMMAND", "INFO"}
	for _, a := range args[2:] {
		req = append(req, string(a))
	}
	up, ok := h.upstreamReply(s, req...)
	_, el, ok2 := relay.Split(up)
	if !ok || !ok2 || len(el) != len(args)-2 {
		h.commandInfo(s, args)
		return
	}
	s.W.Array(len(el))
	for i, a := range args[2:] {
		switch p, c := find(string(a)); {
		case c == nil:
			s.W.Raw(el[i])
		case p == nil && c.Subs != nil:
			writeInfoWith(s.W, nil, c, upstreamInfoSubs(c, el[i]))
		default:
			writeInfo(s.W, p, c)
		}
	}
}

func (h *Handler) commandDocsMerged(s *resp.Session, args [][]byte) {
	if h.up == nil || len(args) > 2 && localOnly(args[2:]) {
		h.commandDocs(s, args)
		return
	}
	req := []string{"COMMAND", "DOCS"}
	for _, a := range args[2:] {
		req = append(req, string(a))
	}
	up, ok := h.upstreamReply(s, req...)
	_, el, ok2 := relay.Split(up)
	if !ok || !ok2 || len(el)%2 != 0 {
		h.commandDocs(s, args)
		return
	}
	var kept [][]byte
	extra := map[*Command][][]byte{} // the upstream's subcommands of lockproxy's containers
	for i := 0; i+1 < len(el); i += 2 {
		n, _ := relay.Text(el[i])
		if p, c := find(string(n)); c == nil {
			kept = append(kept, el[i], el[i+1])
		} else if p == nil && c.Subs != nil {
			extra[c] = upstreamDocSubs(c, el[i+1])
		}
	}
	type entry struct{ parent, c *Command }
	var local []entry
	if len(args) == 2 {
		for _, n := range sortedNames() {
			local = append(local, entry{nil, table[n]})
		}
	} else {
		for _, a := range args[2:] {
			if p, c := find(string(a)); c != nil {
				local = append(local, entry{p, c})
			}
		}
	}
	s.W.Map(len(kept)/2 + len(local))
	for _, e := range kept {
		s.W.Raw(e)
	}
	for _, e := range local {
		s.W.BulkString(fullName(e.parent, e.c))
		if e.parent == nil {
			writeDocWith(s.W, e.c, extra[e.c])
		} else {
			writeDoc(s.W, e.c)
		}
	}
}

func (h *Handler) commandGetKeysMerged(s *resp.Session, args [][]byte) {
	if h.up == nil || lookup(args[2]) != nil {
		h.commandGetKeys(s, args)
		return
	}
	h.relay(s, args)
}
