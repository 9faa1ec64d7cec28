package commands

import (
	"strings"
	"testing"

	"github.com/lockproxy/lockproxy/resp"
)

// TestHelloAuthWithoutPasswordsKnowsOnlyDefault: with neither
// auth.password nor auth.users, HELLO … AUTH takes credentials as AUTH
// does, as Redis's nopass default user: any password for "default", and
// WRONGPASS for any other user, who does not exist. The refused HELLO
// changes nothing (protocol, name). Before, HELLO accepted any user while
// AUTH refused the same credentials.
func TestHelloAuthWithoutPasswordsKnowsOnlyDefault(t *testing.T) {
	h := NewHandler(Options{Limits: testLimits, Backend: &fakeBackend{}})
	defer h.Close()
	const wrongPass = "-WRONGPASS invalid username-password pair or user is disabled.\r\n"
	for _, tc := range []struct {
		lines []string
		want  []string // each reply, or its prefix for HELLO's map
	}{
		{[]string{"AUTH foo bar"}, []string{wrongPass}},
		{[]string{"HELLO 3 AUTH foo bar SETNAME x", "CLIENT GETNAME", "PING"}, []string{wrongPass, "$-1\r\n", "+PONG\r\n"}},
		{[]string{"HELLO 3 AUTH default bar", "PING"}, []string{"%7\r\n", "+PONG\r\n"}},
		{[]string{"HELLO 2 AUTH DEFAULT bar"}, []string{wrongPass}}, // user names are case-sensitive
	} {
		s := &resp.Session{W: resp.NewWriter()}
		for i, line := range tc.lines {
			s.W.Reset()
			h.ServeRESP(s, words(line))
			if got := string(s.W.Bytes()); !strings.HasPrefix(got, tc.want[i]) {
				t.Errorf("%q: %s = %q; want %q", tc.lines, line, got, tc.want[i])
			}
		}
	}
}
