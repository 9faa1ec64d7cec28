package commands

import (
	"regexp"
	"testing"
)

// feedLine matches the start of a MONITOR feed line, which names the time
// and the connection a command came on: they differ between redis-server
// and lockproxy's upstream connection, the rest of the line does not.
var feedLine = regexp.MustCompile(`\+\d+\.\d+ \[\d+ [^\]]*\]`)

// TestMonitorRepliesBeforeQuitOrReset: on a connection in MONITOR mode
// (allowed once upstream.deny_commands lets it through), the replies to
// the commands sent before a QUIT or RESET, MONITOR's own +OK among them,
// reach the client before QUIT's or RESET's, as on Redis. Before, lockproxy
// answered QUIT or RESET at once and dropped the upstream connection with
// those replies still on their way: a client pipelining MONITOR and RESET
// got +RESET without MONITOR's +OK, one pipelining PING and QUIT got
// neither +PONG nor its own command in the feed. The marker PING that
// finds the replies' end must not show in the client's feed either.
func TestMonitorRepliesBeforeQuitOrReset(t *testing.T) {
	proxy, upstream := proxyWithUpstream(t, Options{})
	for _, tc := range []struct{ name, in string }{
		{"MONITOR then RESET", "MONITOR\r\nRESET\r\n"},
		{"MONITOR then QUIT", "MONITOR\r\nQUIT\r\n"},
		{"commands then QUIT", "MONITOR\r\nPING\r\nECHO a\r\nQUIT\r\n"},
		{"commands then RESET then more", "MONITOR\r\nPING\r\nGET x\r\nRESET\r\nPING\r\n"},
		{"RESP3", "HELLO 3\r\nMONITOR\r\nPING\r\nRESET\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, wantClosed := exchangeRaw(t, upstream, "PING\r\n", 7, tc.in)
			got, gotClosed := exchangeRaw(t, proxy, "PING\r\n", 7, tc.in)
			// HELLO's reply differs in the server's version and the id.
			w := helloReply.ReplaceAllString(feedLine.ReplaceAllString(string(want), "+<feed>"), "<hello>")
			g := helloReply.ReplaceAllString(feedLine.ReplaceAllString(string(got), "+<feed>"), "<hello>")
			if g != w || gotClosed != wantClosed {
				t.Errorf("%q answered %q (closed %v); redis-server answers %q (closed %v)", tc.in, g, gotClosed, w, wantClosed)
			}
		})
	}
}

// helloReply matches HELLO 3's map, up to its last pair (modules, empty).
var helloReply = regexp.MustCompile(`(?s)^%7\r\n.*?\$7\r\nmodules\r\n\*0\r\n`)
