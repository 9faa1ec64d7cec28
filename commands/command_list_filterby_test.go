package commands

import (
	"net"
	"slices"
	"testing"

	"github.com/lockproxy/lockproxy/resp"
)

// TestCommandListFilterBy: COMMAND LIST FILTERBY MODULE|ACLCAT|PATTERN
// lists what Redis 7's commandListWithFilter lists: the commands and
// subcommands (by full name, "client|id") in that category, or whose name
// matches the glob, case-insensitively; no module commands; and a syntax
// error for anything else after LIST. Before, every argument after LIST
// was ignored and the whole table listed, so that "COMMAND LIST FILTERBY
// ACLCAT lock" named PING and AUTH among the lock commands.
func TestCommandListFilterBy(t *testing.T) {
	h := NewHandler(Options{Limits: testLimits})
	defer h.Close()
	for _, tc := range []struct {
		line string
		want []string // nil with err
		err  string
	}{
		{line: "COMMAND LIST FILTERBY ACLCAT lock", want: []string{"lock", "lockinfo", "renew", "rlock", "unlock"}},
		{line: "command list filterby aclcat LOCK", want: []string{"lock", "lockinfo", "renew", "rlock", "unlock"}},
		{line: "COMMAND LIST FILTERBY ACLCAT @lock", want: []string{}}, // Redis's category names have no '@' here
		{line: "COMMAND LIST FILTERBY ACLCAT nosuch", want: []string{}},
		{line: "COMMAND LIST FILTERBY ACLCAT dangerous", want: []string{"client|list", "client|no-evict", "info"}},
		{line: "COMMAND LIST FILTERBY PATTERN *lock*", want: []string{"lock", "lockinfo", "rlock", "unlock"}},
		{line: "COMMAND LIST FILTERBY PATTERN UN*", want: []string{"unlock"}},
		{line: "COMMAND LIST FILTERBY PATTERN client|set*", want: []string{"client|setinfo", "client|setname"}},
		{line: "COMMAND LIST FILTERBY MODULE lockproxy", want: []string{}},
		{line: "COMMAND LIST FILTERBY PATTERN nosuch", want: []string{}},
		{line: "COMMAND LIST FILTERBY ACLCAT nosuch FILTERBY PATTERN renew", err: "ERR syntax error"}, // one filter, as Redis takes
		{line: "COMMAND LIST foo", err: "ERR syntax error"},
		{line: "COMMAND LIST FILTERBY", err: "ERR syntax error"},
		{line: "COMMAND LIST FILTERBY ACLCAT", err: "ERR syntax error"},
		{line: "COMMAND LIST FILTERBY NAME lock", err: "ERR syntax error"},
		{line: "COMMAND LIST FILTERBY ACLCAT lock extra", err: "ERR syntax error"},
	} {
		for _, proto := range []int{2, 3} {
			s := &resp.Session{W: resp.NewWriter()}
			s.W.SetProto(proto)
			h.ServeRESP(s, words(tc.line))
			v := parseOne(t, s.W.Bytes(), proto)
			if tc.err != "" {
				if v.typ != '-' || v.str != tc.err {
					t.Errorf("RESP%d %s = %c%q; want -%s", proto, tc.line, v.typ, v.str, tc.err)
				}
				continue
			}
			if v.typ != '*' {
				t.Errorf("RESP%d %s = %c%q; want an array", proto, tc.line, v.typ, v.str)
				continue
			}
			got := []string{}
			for _, e := range v.elems {
				got = append(got, e.str)
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("RESP%d %s = %q; want %q", proto, tc.line, got, tc.want)
			}
		}
	}
}

// TestCommandListFilterByWithUpstream: with an upstream, COMMAND LIST
// FILTERBY lists what the upstream's filter lists together with
// lockproxy's own matches, as COMMAND LIST without a filter merges both
// tables. Before, a filter got lockproxy's whole table alone: no GET for
// "FILTERBY PATTERN get", and every lockproxy command for any filter.
func TestCommandListFilterByWithUpstream(t *testing.T) {
	proxy, _ := proxyWithUpstream(t, Options{})
	c, err := net.Dial("tcp", proxy)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"COMMAND", "LIST", "FILTERBY", "PATTERN", "get"}, []string{"get"}},
		{[]string{"COMMAND", "LIST", "FILTERBY", "PATTERN", "*lock"}, []string{"client|unblock", "lock", "rlock", "unlock"}}, // the upstream's subcommand too
		{[]string{"COMMAND", "LIST", "FILTERBY", "PATTERN", "hello"}, []string{"hello"}},                                     // both have it: once
		{[]string{"COMMAND", "LIST", "FILTERBY", "MODULE", "nosuch"}, []string{}},
	} {
		frame := do(t, c, tc.args...)
		v := parseOne(t, frame, 2)
		if v.typ != '*' {
			t.Errorf("%q = %q; want an array", tc.args, frame)
			continue
		}
		got := []string{}
		for _, e := range v.elems {
			got = append(got, e.str)
		}
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%q = %q; want %q", tc.args, got, tc.want)
		}
	}
	if got := string(do(t, c, "COMMAND", "LIST", "FILTERBY")); got != "-ERR syntax error\r\n" {
		t.Errorf("COMMAND LIST FILTERBY = %q; want -ERR syntax error", got)
	}
}
