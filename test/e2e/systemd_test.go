package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
)

// notifySocket is a unixgram socket standing in for systemd's.
type notifySocket struct {
	path string
	conn *net.UnixConn
}

func newNotifySocket(t *testing.T) *notifySocket {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &notifySocket{path: path, conn: c}
}

// next returns the next message that starts with prefix, skipping others
// (watchdog pings arrive in between), or fails the test after timeout.
func (n *notifySocket) next(t *testing.T, prefix string, timeout time.Duration, out func() string) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 4096)
	for {
		_ = n.conn.SetReadDeadline(deadline)
		k, err := n.conn.Read(buf)
		if err != nil {
			t.Fatalf("no %q from lockproxy within %v: %v\noutput:\n%s", prefix, timeout, err, out())
		}
		if msg := string(buf[:k]); strings.HasPrefix(msg, prefix) {
			return msg
		}
	}
}

// TestSystemdNotify: under systemd's Type=notify lockproxy says READY=1
// once its listener takes connections, pings the watchdog, brackets a
// SIGHUP reload with RELOADING=1 and READY=1, and says STOPPING=1 as it
// drains on SIGTERM.
func TestSystemdNotify(t *testing.T) {
	t.Parallel()
	sock := newNotifySocket(t)
	addr := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	cmd := exec.Command(harness.BuildLockproxy(t), "--dev", "--listen", addr, "--admin", "")
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock.path, "WATCHDOG_USEC=200000")
	proc := harness.StartCmd(t, cmd)

	ready := sock.next(t, "READY=1", 20*time.Second, proc.Output)
	if want := "READY=1\nSTATUS=listening on " + addr; ready != want {
		t.Errorf("ready message %q; want %q", ready, want)
	}
	// Ready means serving: a command answers at once, with no wait for
	// the port.
	if r := lc.DialRaw(t, addr).Do("LOCK", "systemd", "PX", "10000"); r.Pairs()["token"].Str == "" {
		t.Fatalf("LOCK right after READY=1 = %v", r)
	}
	sock.next(t, "WATCHDOG=1", 5*time.Second, proc.Output)

	if err := proc.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if msg := sock.next(t, "RELOADING=1", 5*time.Second, proc.Output); !strings.Contains(msg, "\nMONOTONIC_USEC=") {
		t.Errorf("reloading message %q has no MONOTONIC_USEC", msg)
	}
	sock.next(t, "READY=1", 5*time.Second, proc.Output)

	if err := proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if msg := sock.next(t, "STOPPING=1", 10*time.Second, proc.Output); msg != "STOPPING=1\nSTATUS=draining connections" {
		t.Errorf("stopping message %q", msg)
	}
	if code, err := proc.Wait(15 * time.Second); err != nil || code != 0 {
		t.Fatalf("exit %d, %v\noutput:\n%s", code, err, proc.Output())
	}
}

// TestSystemdUnit: deploy/systemd/lockproxy.service is a unit systemd
// takes without a complaint (systemd-analyze verify prints every
// directive it would ignore), its commands pointed at a built lockproxy.
func TestSystemdUnit(t *testing.T) {
	t.Parallel()
	harness.RequireBinary(t, "systemd-analyze", "systemd")
	unit, err := os.ReadFile("../../deploy/systemd/lockproxy.service")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(unit), "/usr/local/bin/lockproxy", harness.BuildLockproxy(t))
	for _, want := range []string{"Type=notify", "ExecReload=/bin/kill -HUP $MAINPID", "WatchdogSec="} {
		if !strings.Contains(text, want) {
			t.Errorf("the unit lacks %q", want)
		}
	}
	path := filepath.Join(t.TempDir(), "lockproxy.service")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("systemd-analyze", "verify", path).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// TestSystemdWatchdogTLS: behind a TLS listener that requires client
// certificates, the watchdog's self-check (a handshake without one) still
// finds the server alive, so WATCHDOG=1 keeps coming.
func TestSystemdWatchdogTLS(t *testing.T) {
	t.Parallel()
	ca := harness.NewTestCA(t)
	srv := ca.Server()
	sock := newNotifySocket(t)
	addr := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	admin := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	cmd := exec.Command(harness.BuildLockproxy(t), "--dev", "--listen", addr, "--admin", admin)
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock.path, "WATCHDOG_USEC=200000",
		"LOCKPROXY_TLS_ENABLED=true", "LOCKPROXY_TLS_CERT_FILE="+srv.Cert, "LOCKPROXY_TLS_KEY_FILE="+srv.Key,
		"LOCKPROXY_TLS_CLIENT_CA_FILE="+ca.CAFile)
	proc := harness.StartCmd(t, cmd)
	sock.next(t, "READY=1", 20*time.Second, proc.Output)
	for i := 0; i < 3; i++ {
		sock.next(t, "WATCHDOG=1", 5*time.Second, proc.Output)
	}
	if strings.Contains(proc.Output(), "watchdog:") {
		t.Errorf("the self-check failed:\n%s", proc.Output())
	}
	// The self-checks are no failed handshakes: nothing counted.
	if v := metricValue(t, &instance{admin: admin}, "lockproxy_tls_handshake_failures_total"); v != "0" {
		t.Errorf("lockproxy_tls_handshake_failures_total = %q after the self-checks; want 0", v)
	}
}
