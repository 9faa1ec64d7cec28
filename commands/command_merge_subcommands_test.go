package commands

import (
	"net"
	"testing"
)

// TestCommandMergesContainerSubcommands: with an upstream, lockproxy
// serves some of CLIENT's and COMMAND's subcommands and relays the others
// (CLIENT TRACKING, CLIENT KILL, COMMAND GETKEYSANDFLAGS, …). The merged
// COMMAND DOCS, COMMAND INFO and COMMAND describe a container with the
// subcommands of both, lockproxy's entries winning for its own, so that
// redis-cli hints every subcommand that works. Before, lockproxy's entry
// replaced the upstream's whole, and the relayed subcommands vanished
// from the docs while they kept working.
func TestCommandMergesContainerSubcommands(t *testing.T) {
	proxy, _ := proxyWithUpstream(t, Options{})
	for _, proto := range []int{2, 3} {
		c, err := net.Dial("tcp", proxy)
		if err != nil {
			t.Fatal(err)
		}
		if proto == 3 {
			do(t, c, "HELLO", "3")
		}
		docs := asMap(t, parseOne(t, do(t, c, "COMMAND", "DOCS", "client", "command"), proto), proto)
		for _, tc := range []struct{ parent, sub, summary string }{
			{"client", "client|tracking", ""},
			{"client", "client|kill", ""},
			{"client", "client|setname", table["client"].Subs["setname"].Summary}, // lockproxy's own wins
			{"command", "command|getkeysandflags", ""},
			{"command", "command|docs", table["command"].Subs["docs"].Summary},
		} {
			doc, ok := docs[tc.parent]
			if !ok {
				t.Fatalf("RESP%d COMMAND DOCS has no %s", proto, tc.parent)
			}
			subs := asMap(t, asMap(t, doc, proto)["subcommands"], proto)
			sd, ok := subs[tc.sub]
			if !ok {
				t.Errorf("RESP%d COMMAND DOCS %s: no %s among its subcommands %v", proto, tc.parent, tc.sub, keys(subs))
				continue
			}
			if tc.summary != "" {
				if got := asMap(t, sd, proto)["summary"].str; got != tc.summary {
					t.Errorf("RESP%d COMMAND DOCS %s: summary %q; want lockproxy's %q", proto, tc.sub, got, tc.summary)
				}
			}
		}
		info := parseOne(t, do(t, c, "COMMAND", "INFO", "client"), proto)
		if info.typ != '*' || len(info.elems) != 1 || len(info.elems[0].elems) != 10 {
			t.Fatalf("RESP%d COMMAND INFO client = %+v; want one entry", proto, info)
		}
		names := map[string]bool{}
		for _, sub := range info.elems[0].elems[9].elems {
			if len(sub.elems) > 0 {
				names[sub.elems[0].str] = true
			}
		}
		for _, want := range []string{"client|tracking", "client|kill", "client|setname", "client|id"} {
			if !names[want] {
				t.Errorf("RESP%d COMMAND INFO client: no %s among its subcommands %v", proto, want, names)
			}
		}
		all := parseOne(t, do(t, c, "COMMAND"), proto)
		found := false
		for _, e := range all.elems {
			if len(e.elems) == 10 && e.elems[0].str == "client" {
				found = true
				n := 0
				for _, sub := range e.elems[9].elems {
					if len(sub.elems) > 0 && (sub.elems[0].str == "client|tracking" || sub.elems[0].str == "client|setname") {
						n++
					}
				}
				if n != 2 {
					t.Errorf("RESP%d COMMAND: client's entry lacks client|tracking or client|setname", proto)
				}
			}
		}
		if !found {
			t.Errorf("RESP%d COMMAND has no client entry", proto)
		}
		_ = c.Close()
	}
}
