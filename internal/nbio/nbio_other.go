//go:build (!linux || race) && !windows

// Under the race detector the calls go through package syscall, which
// tells the detector what the kernel read and wrote (the raw calls do
// not), so that races on I/O buffers are still found.

package nbio

import "syscall"

// Read is read(2) on a non-blocking descriptor.
func Read(fd int, b []byte) (int, error) { return syscall.Read(fd, b) }

// Write is write(2) on a non-blocking descriptor.
func Write(fd int, b []byte) (int, error) { return syscall.Write(fd, b) }
