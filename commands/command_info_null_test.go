package commands

import (
	"testing"

	"github.com/lockproxy/lockproxy/resp"
)

// TestCommandInfoUnknownIsNull: COMMAND INFO answers a name it does not
// know with Redis's null, which is a null bulk string in RESP2 ("$-1", as
// redis-server 7 writes it with addReplyNull), not a null array ("*-1").
func TestCommandInfoUnknownIsNull(t *testing.T) {
	h := NewHandler(Options{Limits: testLimits})
	defer h.Close()
	for _, tc := range []struct {
		proto int
		line  string
		want  string
	}{
		{2, "COMMAND INFO nosuch", "*1\r\n$-1\r\n"},
		{3, "COMMAND INFO nosuch", "*1\r\n_\r\n"},
		{2, "COMMAND INFO client|nosuch", "*1\r\n$-1\r\n"},
		{2, "COMMAND INFO nosuch|setname", "*1\r\n$-1\r\n"},
	} {
		s := &resp.Session{W: resp.NewWriter()}
		s.W.SetProto(tc.proto)
		h.ServeRESP(s, words(tc.line))
		if got := string(s.W.Bytes()); got != tc.want {
			t.Errorf("RESP%d %s = %q; want %q", tc.proto, tc.line, got, tc.want)
		}
	}
}
