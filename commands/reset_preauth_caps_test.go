package commands

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/resp"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestResetRestoresPreAuthCapsAsRedis: RESET signs a client out, and what
// it sent after the RESET, in the same read as the RESET, is held to the
// pre-auth caps (10 arguments, 16 KB each) as redis-server holds it: a
// command past them gets Redis's protocol error and the connection is
// closed, byte for byte as redis-server answers. Before, the reader had
// parsed those commands (and the command in progress, as far as it had
// come) while the client was still signed in, and let them through: the
// connection stayed open, and the command after the RESET was answered
// NOAUTH. A 60 KB ECHO signed in first grows the read buffer, so that
// what follows the RESET arrives in the same read as the RESET.
func TestResetRestoresPreAuthCapsAsRedis(t *testing.T) {
	rd := harness.StartRedis(t, harness.RedisOptions{Password: "pw"})
	h := NewHandler(Options{Limits: testLimits, Backend: &fakeBackend{}, Password: "pw"})
	proxy := serveOn(t, &resp.Server{Handler: h, AuthRequired: true})

	big := strings.Repeat("x", resp.PreAuthMaxBulkLen+1)
	arr := func(args ...string) string {
		var b strings.Builder
		b.WriteString("*" + itoa(len(args)) + "\r\n")
		for _, a := range args {
			b.WriteString("$" + itoa(len(a)) + "\r\n" + a + "\r\n")
		}
		return b.String()
	}
	eleven := arr("ECHO", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10")
	const signOut = "AUTH pw\r\nRESET\r\n"
	tests := []struct {
		name, in string
	}{
		{"eleven arguments after RESET", signOut + eleven + "PING\r\n"},
		{"header of eleven arguments after RESET", signOut + "*11\r\n"},
		{"big argument after RESET", signOut + "PING\r\n" + arr("ECHO", big) + "PING\r\n"},
		{"big argument of the command in progress", signOut + "*3\r\n$4\r\nECHO\r\n$" + itoa(len(big)) + "\r\n" + big + "\r\n$1\r\n"},
		{"within the caps after RESET", signOut + arr("ECHO", strings.Repeat("y", resp.PreAuthMaxBulkLen)) + "AUTH pw\r\n" + eleven},
		{"eleven arguments after a second AUTH", signOut + "AUTH pw\r\n" + eleven},
	}
	warm := arr("AUTH", "pw") + arr("ECHO", strings.Repeat("w", 60<<10))
	warmReply := len("+OK\r\n$61440\r\n") + 60<<10 + 2
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want, wantClosed := exchangeRaw(t, rd.Addr, warm, warmReply, tc.in)
			got, gotClosed := exchangeRaw(t, proxy, warm, warmReply, tc.in)
			if !bytes.Equal(got, want) || gotClosed != wantClosed {
				t.Errorf("%.60q… answered %q (closed %v); redis-server answers %q (closed %v)", tc.in, got, gotClosed, want, wantClosed)
			}
		})
	}
}

func itoa(n int) string {
	var b []byte
	for {
		b = append([]byte{byte('0' + n%10)}, b...)
		if n /= 10; n == 0 {
			return string(b)
		}
	}
}

// exchangeRaw sends warm on a new connection to addr and reads its
// reply, warmReply bytes, then sends in and reads what comes back until
// the server closes the connection or sends nothing for 500 ms (at most
// 5 s in all).
func exchangeRaw(t *testing.T, addr, warm string, warmReply int, in string) (out []byte, closed bool) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(warm)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, warmReply)); err != nil {
		t.Fatalf("reading the warm-up replies: %v", err)
	}
	if _, err := c.Write([]byte(in)); err != nil {
		t.Fatal(err)
	}
	end := time.Now().Add(5 * time.Second)
	buf := make([]byte, 64<<10)
	for time.Now().Before(end) {
		_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		n, err := c.Read(buf)
		out = append(out, buf[:n]...)
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			return out, false
		case err == io.EOF, err != nil && n == 0:
			return out, true
		}
	}
	return out, false
}
