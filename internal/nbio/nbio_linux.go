//go:build linux

// Package nbio makes the system calls of the relay's hot path on
// non-blocking descriptors without telling Go's scheduler that the thread
// may block.
//
// A system call made through syscall.Syscall hands its processor (P) to
// the scheduler's monitor, which takes it away when the call lasts longer
// than its 20 µs tick and starts another thread to run goroutines. A write
// to a loopback socket runs the receiver's TCP stack inline and often takes
// that long, so on the relay's hot path a good share of writes cost a
// thread hand-off and, later, a wake-up. Calls on non-blocking descriptors
// never wait for anything, so they can run as raw calls that keep the P.
package nbio

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// errno boxes the common errors once, as package syscall does.
func errno(e unix.Errno) error {
	switch e {
	case 0:
		return nil
	case unix.EAGAIN:
		return unix.EAGAIN
	case unix.EINTR:
		return unix.EINTR
	}
	return e
}

// EpollPoll is epoll_wait(2) with a zero timeout: it reports what is ready
// and never waits.
func EpollPoll(epfd int, events []unix.EpollEvent) (int, error) {
	var p unsafe.Pointer
	if len(events) > 0 {
		p = unsafe.Pointer(&events[0])
	}
	n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(p), uintptr(len(events)), 0, 0, 0)
	if e != 0 {
		return 0, errno(e)
	}
	return int(n), nil
}
