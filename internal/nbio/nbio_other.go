//go:build !linux

package nbio

import "syscall"

// Read is read(2) on a non-blocking descriptor.
func Read(fd int, b []byte) (int, error) { return syscall.Read(fd, b) }

// Write is write(2) on a non-blocking descriptor.
func Write(fd int, b []byte) (int, error) { return syscall.Write(fd, b) }
