package e2e

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
)

// rssKB reads a process's resident set size.
func rssKB(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, err := strconv.Atoi(strings.Fields(v)[0])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// TestHugeHeadersDoNotAllocate: many connections announcing huge bulk
// strings and argument counts, then sending a few bytes, cost lockproxy
// little memory, and it keeps serving (REFERENCE.md's fault row 15): on
// goroutines (no upstream) and on the event loop (with one).
func TestHugeHeadersDoNotAllocate(t *testing.T) {
	cl := startCluster(t, 3)
	up := harness.StartRedis(t, harness.RedisOptions{})
	for _, mode := range []struct {
		name  string
		extra []string
	}{{"goroutines", nil}, {"event loop", []string{"--upstream", up.Addr}}} {
		t.Run(mode.name, func(t *testing.T) { hugeHeaders(t, startInstance(t, cl.addrs(), mode.extra...)) })
	}
}

func hugeHeaders(t *testing.T, in *instance) {
	before := rssKB(t, in.proc.PID())
	const conns = 300
	var open []net.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	for i := 0; i < conns; i++ {
		c, err := net.DialTimeout("tcp", in.addr, 5*time.Second)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		open = append(open, c)
		hdr := "*1\r\n$500000000\r\n0123456789"
		if i%2 == 1 {
			hdr = "*1048576\r\n$4\r\nPING\r\n"
		}
		if _, err := c.Write([]byte(hdr)); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	time.Sleep(500 * time.Millisecond)
	after := rssKB(t, in.proc.PID())
	t.Logf("lockproxy RSS: %d KB before, %d KB with %d connections holding huge headers", before, after, conns)
	if after-before > 64*1024 {
		t.Fatalf("RSS grew by %d KB for %d huge headers; want < 64 MB", after-before, conns)
	}
	// Still serving.
	c := lc.NewClient(t, in.addr, 2)
	g := lc.MustLock(t, c, "after-huge", "PX", 5000)
	lc.Unlock(t, c, "after-huge", g.Token)
}
