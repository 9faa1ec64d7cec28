//go:build unix

package sdnotify

import (
	"strconv"

	"golang.org/x/sys/unix"
)

// supported: systemd runs on unix (Linux) only, but $NOTIFY_SOCKET is
// honoured wherever unix sockets are.
const supported = true

// Reloading is the message for the start of a reload (SIGHUP): systemd
// 253's Type=notify-reload wants the monotonic time with it; READY=1 ends
// the reload.
func Reloading() string {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return "RELOADING=1\nMONOTONIC_USEC=" + strconv.FormatInt(ts.Nano()/1000, 10)
}
