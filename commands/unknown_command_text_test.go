package commands

import (
	"strings"
	"testing"

	"github.com/lockproxy/lockproxy/resp"
)

// TestUnknownCommandText: without an upstream, an unknown command (or
// subcommand) is answered with redis-server 7's text, byte for byte: the
// name cut at 128 bytes, and the arguments quoted one after the other
// while the list is under 128 bytes, the last cut to what is left, as
// processCommand's "'%.*s' " loop writes them. The expected replies are
// redis-server 7.0's. Before, each argument was cut on its own (with
// "..."), at most 8 were shown, and bytes that are not UTF-8 were
// replaced with U+FFFD.
func TestUnknownCommandText(t *testing.T) {
	h := NewHandler(Options{Limits: testLimits, Backend: &fakeBackend{}})
	defer h.Close()
	a, b := strings.Repeat("a", 100), strings.Repeat("b", 100)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"long args", []string{"FOO", a, b, "c"},
			"-ERR unknown command 'FOO', with args beginning with: '" + a + "' '" + strings.Repeat("b", 25) + "' \r\n"},
		{"long name", []string{strings.Repeat("F", 200)},
			"-ERR unknown command '" + strings.Repeat("F", 128) + "', with args beginning with: \r\n"},
		{"many args", []string{"FOO", "x", "x", "x", "x", "x", "x", "x", "x", "x", "x", "x", "x"},
			"-ERR unknown command 'FOO', with args beginning with: " + strings.Repeat("'x' ", 12) + "\r\n"},
		{"line breaks", []string{"FOO", "a\r\nb"}, "-ERR unknown command 'FOO', with args beginning with: 'a  b' \r\n"},
		{"binary", []string{"FOO", "\xff\xfe"}, "-ERR unknown command 'FOO', with args beginning with: '\xff\xfe' \r\n"},
		{"subcommand", []string{"CLIENT", strings.Repeat("s", 200)},
			"-ERR unknown subcommand '" + strings.Repeat("s", 128) + "'. Try CLIENT HELP.\r\n"},
	} {
		s := &resp.Session{W: resp.NewWriter()}
		args := make([][]byte, len(tc.args))
		for i, x := range tc.args {
			args[i] = []byte(x)
		}
		h.ServeRESP(s, args)
		if got := string(s.W.Bytes()); got != tc.want {
			t.Errorf("%s: reply %q; want %q", tc.name, got, tc.want)
		}
	}
}
