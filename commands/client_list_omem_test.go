package commands

import (
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestClientListShowsOutputBuffer: CLIENT LIST's omem is the bytes of
// replies waiting in a connection's output buffer, as Redis shows it:
// monitoring (redis_exporter, redis-cli --bigkeys users) finds the client
// that does not read by it. A client that read its replies shows 0.
func TestClientListShowsOutputBuffer(t *testing.T) {
	proxy, _ := proxyWithUpstream(t, Options{})
	slow, err := net.Dial("tcp", proxy)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	// Small socket buffers, so that most of the replies wait in
	// lockproxy's output buffer rather than in the sockets.
	_ = slow.(*net.TCPConn).SetReadBuffer(64 << 10)
	_ = slow.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := slow.Write([]byte("CLIENT SETNAME slow\r\n")); err != nil {
		t.Fatal(err)
	}
	cmd := "*2\r\n$4\r\nECHO\r\n$8192\r\n" + strings.Repeat("v", 8192) + "\r\n"
	// 8 MB of replies, not read.
	if _, err := slow.Write([]byte(strings.Repeat(cmd, 1024))); err != nil {
		t.Fatal(err)
	}

	watcher := dialRaw(t, proxy)
	selfID := watcher.do(t, "CLIENT ID")[1:]
	omem := regexp.MustCompile(` omem=(\d+)(?: |$)`)
	field := func(line string) int {
		m := omem.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("no omem field in %q", line)
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	var line string
	for deadline := time.Now().Add(10 * time.Second); ; {
		list := watcher.do(t, "CLIENT LIST")
		for _, l := range strings.Split(list, "\n") {
			if strings.Contains(l, " name=slow ") {
				line = l
			}
		}
		if line != "" && field(line) > 1<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CLIENT LIST's line of a client with 8 MB of replies unread: %q; want omem over 1 MB", line)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if self := watcher.do(t, "CLIENT LIST ID "+selfID); field(self) != 0 {
		t.Errorf("CLIENT LIST of a client that reads its replies = %q; want omem=0", self)
	}
	if info := watcher.do(t, "CLIENT INFO"); field(info) != 0 {
		t.Errorf("CLIENT INFO = %q; want omem=0", info)
	}
}
