package e2e

import (
	"crypto/tls"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
)

// TestSIGTERMWithTLSClientsNotReading: SIGTERM ends lockproxy at its
// shutdown timeout even with TLS (and plain) clients that read none of
// the replies pending for them.
func TestSIGTERMWithTLSClientsNotReading(t *testing.T) {
	cl := startCluster(t, 3)
	ca := harness.NewTestCA(t)
	in := startInstanceEnv(t, cl.addrs(), append(tlsEnv(ca), "LOCKPROXY_LIMITS_SHUTDOWN_TIMEOUT=1s"))
	cmd := "*2\r\n$4\r\nECHO\r\n$8192\r\n" + strings.Repeat("v", 8192) + "\r\n"
	for i := 0; i < 3; i++ {
		raw, err := net.Dial("tcp", in.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		_ = raw.(*net.TCPConn).SetReadBuffer(64 << 10)
		cfg := ca.ClientConfig().Clone()
		cfg.ServerName = "127.0.0.1"
		c := tls.Client(raw, cfg)
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := c.Write([]byte(strings.Repeat(cmd, 1000))); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	if err := in.proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, err := in.proc.Wait(15 * time.Second)
	if err != nil {
		t.Fatalf("lockproxy did not exit within 15 s of SIGTERM: %v\n%s", err, in.proc.Output())
	}
	t.Logf("exited %d after %v", code, time.Since(start))
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("exit took %v; want about the 1 s shutdown timeout", d)
	}
}
