package commands

import (
	"net"
	"testing"

	"github.com/lockproxy/lockproxy/resp"
)

// serveWithPassword serves a handler whose clients must AUTH with pw, and
// returns its address.
func serveWithPassword(t *testing.T, pw string) string {
	t.Helper()
	h := NewHandler(Options{Limits: testLimits, Backend: &fakeBackend{}, Password: pw})
	return serveOn(t, &resp.Server{Handler: h, AuthRequired: true})
}

// TestHelloChecksArgumentsBeforeNoAuth: an unauthenticated HELLO without
// AUTH is checked as Redis's helloCommand checks it: the protocol version
// (NOPROTO, or not an integer) and the options (syntax, a bad SETNAME)
// first, and NOAUTH only for a HELLO that is otherwise right. A client
// probing for RESP3 with a version the server lacks is told NOPROTO, the
// answer it falls back on. Before, every such HELLO got NOAUTH. A refused
// HELLO names nobody: the SETNAME of one answered NOAUTH is not kept.
func TestHelloChecksArgumentsBeforeNoAuth(t *testing.T) {
	addr := serveWithPassword(t, "pw")
	const noAuth = "-NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option " +
		"can be used to authenticate the client and select the RESP protocol version at the same time\r\n"
	for _, tc := range []struct {
		hello []string
		want  string
	}{
		{[]string{"HELLO", "4"}, "-NOPROTO unsupported protocol version\r\n"},
		{[]string{"HELLO", "1"}, "-NOPROTO unsupported protocol version\r\n"},
		{[]string{"HELLO", "three"}, "-ERR Protocol version is not an integer or out of range\r\n"},
		{[]string{"HELLO", "3", "FOO"}, "-ERR Syntax error in HELLO option 'FOO'\r\n"},
		{[]string{"HELLO", "3", "SETNAME", "a b"}, "-ERR Client names cannot contain spaces, newlines or special characters.\r\n"},
		{[]string{"HELLO", "3"}, noAuth},
		{[]string{"HELLO"}, noAuth},
		{[]string{"HELLO", "3", "SETNAME", "x"}, noAuth},
		{[]string{"HELLO", "3", "AUTH", "default", "nope"}, "-WRONGPASS invalid username-password pair or user is disabled.\r\n"},
	} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := string(do(t, conn, tc.hello...)); got != tc.want {
			t.Errorf("unauthenticated %q = %q; want %q", tc.hello, got, tc.want)
		}
		if got := string(do(t, conn, "AUTH", "pw")); got != "+OK\r\n" {
			t.Fatalf("AUTH after %q = %q", tc.hello, got)
		}
		if got := string(do(t, conn, "CLIENT", "GETNAME")); got != "$-1\r\n" {
			t.Errorf("CLIENT GETNAME after the refused %q = %q; want no name", tc.hello, got)
		}
		_ = conn.Close()
	}
}

// TestHelloWithBadOptionSignsNobodyIn: a HELLO with right credentials but
// an option in error answers the error and leaves the connection
// unauthenticated, as Redis 7.2 (whose version lockproxy reports) checks
// every option before the credentials. Before, the AUTH part signed the
// client in as it was read, and the error came after.
func TestHelloWithBadOptionSignsNobodyIn(t *testing.T) {
	addr := serveWithPassword(t, "pw")
	for _, tc := range []struct {
		hello []string
		want  string
	}{
		{[]string{"HELLO", "3", "AUTH", "default", "pw", "FOO"}, "-ERR Syntax error in HELLO option 'FOO'\r\n"},
		{[]string{"HELLO", "3", "AUTH", "default", "pw", "SETNAME", "a b"}, "-ERR Client names cannot contain spaces, newlines or special characters.\r\n"},
	} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := string(do(t, conn, tc.hello...)); got != tc.want {
			t.Errorf("%q = %q; want %q", tc.hello, got, tc.want)
		}
		if got := string(do(t, conn, "PING")); got != "-NOAUTH Authentication required.\r\n" {
			t.Errorf("PING after the refused %q = %q; want NOAUTH", tc.hello, got)
		}
		_ = conn.Close()
	}
}
