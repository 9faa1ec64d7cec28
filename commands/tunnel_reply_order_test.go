package commands

import (
	"bufio"
	"net"
	"strings"
	"testing"
	"time"
)

// TestTunnelRepliesBeforeQuitOrReset: on a subscribed connection (a
// pub/sub tunnel, whose replies come from the upstream as they arrive),
// QUIT, RESET and lockproxy's own refusals come after the replies to the
// commands the client sent before them, as on redis-server: a client that
// pipelines "PING, QUIT" or "UNSUBSCRIBE, RESET" gets every reply, in
// order, and its library does not take +RESET or a refusal for the reply
// to an earlier command. Each exchange is run against the upstream
// redis-server itself and through lockproxy, and the byte streams must
// match.
func TestTunnelRepliesBeforeQuitOrReset(t *testing.T) {
	proxy, up := proxyWithUpstream(t, Options{})
	for _, tc := range []struct {
		name  string
		hello string // sent first, its reply read
		then  string // sent in one write once subscribed
		// When set, lockproxy's answer must start with it (a refusal
		// whose text is lockproxy's own); else it must be redis-server's.
		wantPrefix string
	}{
		{"PING then QUIT", "", "PING\r\nQUIT\r\n", ""},
		{"UNSUBSCRIBE then QUIT", "", "UNSUBSCRIBE ch\r\nQUIT\r\n", ""},
		{"PING then RESET", "", "PING\r\nRESET\r\nPING\r\n", ""},
		{"RESP3 PING then QUIT", "HELLO 3\r\n", "PING\r\nQUIT\r\n", ""},
		{"RESP3 UNSUBSCRIBE then RESET", "HELLO 3\r\n", "UNSUBSCRIBE ch\r\nRESET\r\nPING\r\n", ""},
		{"many PINGs then QUIT", "", strings.Repeat("PING\r\n", 40) + "QUIT\r\n", ""},
		{"PING then a refused LOCK", "", "PING\r\nLOCK k\r\n", "*2\r\n$4\r\npong\r\n$0\r\n\r\n-ERR"},
		{"PING then a refused MULTI then PING", "", "PING a\r\nMULTI\r\nPING b\r\n",
			"*2\r\n$4\r\npong\r\n$1\r\na\r\n-ERR 'multi' is not allowed in pub/sub mode through lockproxy; unsubscribe first\r\n*2\r\n$4\r\npong\r\n$1\r\nb\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := subscribedExchange(t, proxy, tc.hello, tc.then)
			if tc.wantPrefix != "" {
				if !strings.HasPrefix(got, tc.wantPrefix) {
					t.Errorf("after SUBSCRIBE ch, %q: lockproxy answers %q; want it to start with %q", tc.then, got, tc.wantPrefix)
				}
				return
			}
			want := subscribedExchange(t, up, tc.hello, tc.then)
			if got != want {
				t.Errorf("after SUBSCRIBE ch, %q:\n redis-server: %q\n lockproxy:    %q", tc.then, want, got)
			}
		})
	}
}

// TestTunnelQuitWithUpstreamHung: QUIT on a subscribed connection waits
// for the replies to the commands before it, but not for ever: when the
// upstream stops answering, the client's connection is closed within the
// relay's bound (the marker PING's wait, 5 s at least), as when its
// pinned upstream connection is lost, instead of hanging or answering
// +OK where the PING's reply should be.
func TestTunnelQuitWithUpstreamHung(t *testing.T) {
	proxy, up := proxyWithRedis(t, Options{})
	t.Cleanup(up.Resume) // before the harness stops it
	c, err := net.Dial("tcp", proxy)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	rd := bufio.NewReader(c)
	if _, err := c.Write([]byte("SUBSCRIBE ch\r\n")); err != nil {
		t.Fatal(err)
	}
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, ":1") {
			break
		}
	}
	up.Pause()
	start := time.Now()
	if _, err := c.Write([]byte("PING\r\nQUIT\r\n")); err != nil {
		t.Fatal(err)
	}
	var out []byte
	buf := make([]byte, 512)
	for {
		n, err := rd.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			if !strings.Contains(err.Error(), "EOF") && !strings.Contains(err.Error(), "reset") {
				t.Fatalf("after %v: %v, with %q read; want the connection closed", time.Since(start), err, out)
			}
			break
		}
	}
	if took := time.Since(start); took > 12*time.Second {
		t.Errorf("the connection closed after %v; want within the relay's bound", took)
	}
	if len(out) != 0 {
		t.Errorf("read %q before the connection closed; want nothing: the PING's reply never came", out)
	}
}
