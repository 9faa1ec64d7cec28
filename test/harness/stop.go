//go:build linux

package harness

import (
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// StopProcess stops the test's whole process (SIGSTOP, as a VM pause or a
// long stall stops lockproxy) for about d: a child process continues it.
// Every timer and deadline due meanwhile fires, or is found passed, only
// when the process runs again. Call it from a test that does not run in
// parallel with others: every goroutine of the binary stops with it.
func StopProcess(t testing.TB, d time.Duration) {
	t.Helper()
	cont := exec.Command("sh", "-c", "sleep "+strconv.FormatFloat(d.Seconds(), 'f', 3, 64)+"; kill -CONT "+strconv.Itoa(os.Getpid()))
	if err := cont.Start(); err != nil {
		t.Fatalf("start the process that continues this one: %v", err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP: %v", err)
	}
	_ = cont.Wait()
}
