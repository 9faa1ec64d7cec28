package procs

import (
	"syscall"
	"time"
)

// processCPU is the user and system CPU time of the whole process so far:
// Windows has no getrusage, GetProcessTimes says the same.
func processCPU() time.Duration {
	h, err := syscall.GetCurrentProcess()
	if err != nil {
		return 0
	}
	var created, exited, kernel, user syscall.Filetime
	if err := syscall.GetProcessTimes(h, &created, &exited, &kernel, &user); err != nil {
		return 0
	}
	return filetimeSpan(kernel) + filetimeSpan(user)
}

// filetimeSpan is a FILETIME that holds a span (100 ns ticks), not a date:
// Filetime.Nanoseconds would subtract the 1601 epoch from it.
func filetimeSpan(ft syscall.Filetime) time.Duration {
	return time.Duration(int64(ft.HighDateTime)<<32|int64(ft.LowDateTime)) * 100
}
