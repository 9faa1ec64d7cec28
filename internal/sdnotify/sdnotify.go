// Package sdnotify tells systemd how the service is doing, by the
// sd_notify protocol: datagrams of "KEY=value" lines sent to the unix
// socket named by $NOTIFY_SOCKET. With Type=notify, systemd considers
// lockproxy started when it says READY=1 (its listener is up), not when
// the process exists; dependents and `systemctl start` wait for that.
// Without $NOTIFY_SOCKET every call does nothing.
package sdnotify

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// States, as systemd reads them.
const (
	Ready    = "READY=1"
	Stopping = "STOPPING=1"
	Watchdog = "WATCHDOG=1"
)

// Status is a free-form line `systemctl status` shows.
func Status(s string) string {
	return "STATUS=" + strings.ReplaceAll(s, "\n", " ")
}

// Notify sends the states, one per line, to $NOTIFY_SOCKET. It reports
// whether there was a socket to send to; an error means there was and
// the datagram could not be sent.
func Notify(states ...string) (bool, error) {
	addr := os.Getenv("NOTIFY_SOCKET")
	if addr == "" || !supported {
		return false, nil
	}
	if addr[0] == '@' {
		addr = "\x00" + addr[1:] // an abstract socket
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return true, fmt.Errorf("sd_notify: dial %s: %w", os.Getenv("NOTIFY_SOCKET"), err)
	}
	defer conn.Close()
	_ = conn.SetWriteDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte(strings.Join(states, "\n"))); err != nil {
		return true, fmt.Errorf("sd_notify: send to %s: %w", os.Getenv("NOTIFY_SOCKET"), err)
	}
	return true, nil
}

// WatchdogInterval is how often systemd wants WATCHDOG=1 (WatchdogSec=):
// half its timeout, so one late tick is not a restart. Zero when no
// watchdog is set for this process.
func WatchdogInterval() time.Duration {
	usec, err := strconv.ParseInt(os.Getenv("WATCHDOG_USEC"), 10, 64)
	if err != nil || usec <= 0 {
		return 0
	}
	if pid := os.Getenv("WATCHDOG_PID"); pid != "" && pid != strconv.Itoa(os.Getpid()) {
		return 0 // meant for another process
	}
	return time.Duration(usec) * time.Microsecond / 2
}
