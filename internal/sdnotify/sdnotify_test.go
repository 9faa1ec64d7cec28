package sdnotify

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// listen makes a unixgram socket like systemd's and points NOTIFY_SOCKET
// at it (abstract when abstract is true).
func listen(t *testing.T, abstract bool) *net.UnixConn {
	t.Helper()
	name := filepath.Join(t.TempDir(), "notify")
	env := name
	if abstract {
		name = "\x00lockproxy-sdnotify-test-" + strconv.Itoa(os.Getpid())
		env = "@" + name[1:]
	}
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	t.Setenv("NOTIFY_SOCKET", env)
	return c
}

func receive(t *testing.T, c *net.UnixConn) string {
	t.Helper()
	buf := make([]byte, 4096)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	return string(buf[:n])
}

func TestNotify(t *testing.T) {
	for _, abstract := range []bool{false, true} {
		t.Run("abstract="+strconv.FormatBool(abstract), func(t *testing.T) {
			c := listen(t, abstract)
			if ok, err := Notify(Ready, Status("listening on 127.0.0.1:7380\nsecond line")); !ok || err != nil {
				t.Fatalf("Notify = %v, %v", ok, err)
			}
			if got, want := receive(t, c), "READY=1\nSTATUS=listening on 127.0.0.1:7380 second line"; got != want {
				t.Errorf("got %q; want %q", got, want)
			}
			if _, err := Notify(Reloading()); err != nil {
				t.Fatal(err)
			}
			got := receive(t, c)
			usec, err := strconv.ParseInt(strings.TrimPrefix(got, "RELOADING=1\nMONOTONIC_USEC="), 10, 64)
			if !strings.HasPrefix(got, "RELOADING=1\nMONOTONIC_USEC=") || err != nil || usec <= 0 {
				t.Errorf("reloading message %q", got)
			}
		})
	}
}

func TestNotifyWithoutSocket(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	if ok, err := Notify(Ready); ok || err != nil {
		t.Errorf("Notify without NOTIFY_SOCKET = %v, %v; want false, nil", ok, err)
	}
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "gone"))
	if ok, err := Notify(Ready); !ok || err == nil {
		t.Errorf("Notify to a missing socket = %v, %v; want true and an error", ok, err)
	}
}

func TestWatchdogInterval(t *testing.T) {
	pid := strconv.Itoa(os.Getpid())
	for _, tc := range []struct {
		usec, pid string
		want      time.Duration
	}{
		{"", "", 0},
		{"garbage", "", 0},
		{"-5", "", 0},
		{"10000000", "", 5 * time.Second},
		{"10000000", pid, 5 * time.Second},
		{"10000000", "1", 0}, // another process's
	} {
		t.Setenv("WATCHDOG_USEC", tc.usec)
		t.Setenv("WATCHDOG_PID", tc.pid)
		if got := WatchdogInterval(); got != tc.want {
			t.Errorf("WATCHDOG_USEC=%q WATCHDOG_PID=%q: %v; want %v", tc.usec, tc.pid, got, tc.want)
		}
	}
}
