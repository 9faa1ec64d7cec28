package commands

import (
	"strings"
	"testing"

	"github.com/lockproxy/lockproxy/resp"
)

// TestHelpSubcommandWithoutUpstream: without an upstream, CLIENT HELP and
// COMMAND HELP answer Redis's help reply (an array of status lines, the
// usage line first and HELP last) listing the subcommands lockproxy
// serves, CLIENT UNBLOCK included. Before, both answered "ERR unknown
// subcommand 'HELP'. Try CLIENT HELP.", sending the user to the command
// that had just failed. HELP with arguments stays an error, as in Redis.
func TestHelpSubcommandWithoutUpstream(t *testing.T) {
	h := NewHandler(Options{Limits: testLimits, Backend: &fakeBackend{}})
	defer h.Close()
	for _, tc := range []struct {
		args      []string
		first     string
		mentions  []string
		wantError string
	}{
		{args: []string{"CLIENT", "HELP"}, first: "+CLIENT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
			mentions: []string{"+ID\r\n", "+SETNAME <connection-name>\r\n", "+GETNAME\r\n", "+LIST [TYPE", "+NO-EVICT (ON|OFF)\r\n", "+UNBLOCK <client-id> [TIMEOUT|ERROR]\r\n"}},
		{args: []string{"client", "help"}, first: "+CLIENT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:"},
		{args: []string{"COMMAND", "HELP"}, first: "+COMMAND <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
			mentions: []string{"+COUNT\r\n", "+DOCS", "+GETKEYS", "+INFO", "+LIST"}},
		{args: []string{"CLIENT", "HELP", "x"}, wantError: "-ERR unknown subcommand 'HELP'. Try CLIENT HELP.\r\n"},
	} {
		name := strings.Join(tc.args, " ")
		for _, proto := range []int{2, 3} {
			s := &resp.Session{W: resp.NewWriter()}
			s.W.SetProto(proto)
			args := make([][]byte, len(tc.args))
			for i, x := range tc.args {
				args[i] = []byte(x)
			}
			h.ServeRESP(s, args)
			got := string(s.W.Bytes())
			if tc.wantError != "" {
				if got != tc.wantError {
					t.Errorf("%s (RESP%d) = %q; want %q", name, proto, got, tc.wantError)
				}
				continue
			}
			lines := strings.Split(strings.TrimSuffix(got, "\r\n"), "\r\n")
			if len(lines) < 4 || !strings.HasPrefix(lines[0], "*") || lines[1] != tc.first {
				t.Errorf("%s (RESP%d) = %q; want an array starting %q", name, proto, got, tc.first)
				continue
			}
			if n := len(lines) - 1; lines[0] != "*"+itoa(n) {
				t.Errorf("%s (RESP%d): header %q for %d lines", name, proto, lines[0], n)
			}
			for _, l := range lines[1:] {
				if !strings.HasPrefix(l, "+") {
					t.Errorf("%s (RESP%d): line %q is not a status line", name, proto, l)
				}
			}
			if tail := lines[len(lines)-2:]; tail[0] != "+HELP" || tail[1] != "+    Print this help." {
				t.Errorf("%s (RESP%d) ends %q; want HELP and its line last", name, proto, tail)
			}
			for _, m := range tc.mentions {
				if !strings.Contains(got, m) {
					t.Errorf("%s (RESP%d) = %q; want it to list %q", name, proto, got, m)
				}
			}
		}
	}
	// Every subcommand of the table has its syntax line written out.
	for _, name := range []string{"client", "command"} {
		for _, sc := range sortedSubs(table[name]) {
			if helpSyntax[name][sc.Name] == "" {
				t.Errorf("%s|%s has no line in helpSyntax", name, sc.Name)
			}
		}
	}
}
