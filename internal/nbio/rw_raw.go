//go:build linux && !race

package nbio

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Read is read(2) on a non-blocking descriptor.
func Read(fd int, b []byte) (int, error) {
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(p), uintptr(len(b)))
	if e != 0 {
		return -1, errno(e)
	}
	return int(n), nil
}

// Write is write(2) on a non-blocking descriptor.
func Write(fd int, b []byte) (int, error) {
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	n, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(p), uintptr(len(b)))
	if e != 0 {
		return -1, errno(e)
	}
	return int(n), nil
}
