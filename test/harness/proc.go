//go:build linux

package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	// reapTimeout bounds every wait for a SIGKILLed process to be reaped.
	reapTimeout = 10 * time.Second
	// waitDelay bounds how long cmd.Wait keeps copying output after the
	// process exited (a grandchild may still hold the pipe open).
	waitDelay = 2 * time.Second
	// buildTimeout bounds `go build` of the lockproxy binary.
	buildTimeout = 5 * time.Minute
)

// ---------------------------------------------------------------------------
// Ports

var (
	portsMu sync.Mutex
	ports   = map[int]bool{}
)

// reservedPort reports ports FreePort never returns because other programs
// on the test machines may use them.
func reservedPort(p int) bool {
	return p == 6379 || (p >= 7001 && p <= 7005)
}

// FreePort returns a free TCP port on 127.0.0.1, picked at random below
// the kernel's ephemeral range (see pickRange) and checked by binding it.
// Ports are remembered process-wide, so two calls in one test binary
// never return the same port.
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := freePort()
	if err != nil {
		t.Fatalf("harness: FreePort: %v", err)
	}
	return p
}

// RefusedAddr returns a loopback address whose port the test holds bound but
// not listening until it ends, so every dial to it is refused. A port from
// FreePort is only free when it is picked: another test process may start a
// server on it, and a dial to an unbound port in the ephemeral range can even
// connect to itself (TCP simultaneous open).
func RefusedAddr(t testing.TB) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatalf("harness: RefusedAddr: socket: %v", err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("harness: RefusedAddr: bind: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatalf("harness: RefusedAddr: getsockname: %v", err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}

// pickRange is where FreePort picks ports: from 10000 to just below the
// kernel's ephemeral range (ip_local_port_range). A port is free only when
// it is checked, and the server it is meant for binds it later; in the
// ephemeral range the kernel hands ports to every outgoing connection and
// every listen on port 0 — which the tests, their clients and their
// servers make by the thousand — so one could take it in between (seen:
// lockproxy's bind refused, address already in use, in a CI run). Below
// it, only another test binary's FreePort could, at random. ok is false
// where that range is too small: FreePort then asks the kernel for one.
func pickRange() (lo, hi int, ok bool) {
	lo, hi = 10000, 32767
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if e, err := strconv.Atoi(f[0]); err == nil {
				hi = min(hi, e-1)
			}
		}
	}
	return lo, hi, hi-lo >= 1000
}

func freePort() (int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	lo, hi, ok := pickRange()
	var lastErr error
	for range 200 {
		addr := "127.0.0.1:0"
		if ok {
			addr = "127.0.0.1:" + strconv.Itoa(lo+rand.IntN(hi-lo+1))
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			lastErr = err
			if !ok {
				time.Sleep(5 * time.Millisecond)
			}
			continue
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if ports[p] || reservedPort(p) {
			continue
		}
		ports[p] = true
		return p, nil
	}
	if lastErr == nil {
		lastErr = errors.New("no unused port after 200 attempts")
	}
	return 0, lastErr
}

// WaitTCP polls until addr accepts a TCP connection or the timeout passes.
func WaitTCP(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var err error
	for {
		var c net.Conn
		c, err = net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("harness: %s did not accept TCP connections within %v: %w", addr, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ---------------------------------------------------------------------------
// Output buffer

// syncBuffer is an io.Writer whose contents can be read concurrently.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// tailLines returns the last n lines of s (all of s if n <= 0).
func tailLines(s string, n int) string {
	s = strings.TrimRight(s, "\n")
	if n <= 0 || s == "" {
		return s
	}
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ---------------------------------------------------------------------------
// child: one started process, reaped exactly once.

type child struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{} // closed after cmd.Wait returned
	err  error         // cmd.Wait's result; read only after done is closed

	mu          sync.Mutex
	groupKilled bool // the group has been SIGKILLed once already
}

var subreaperOnce sync.Once

// becomeSubreaper makes this test process the child subreaper of its
// descendants (PR_SET_CHILD_SUBREAPER), so that members of a child's
// process group orphaned by the death of their parent are reparented to us
// instead of to PID 1 (which on the test machines never reaps them) and can
// be reaped by reapGroup. Failure is harmless: orphans then go to PID 1.
func becomeSubreaper() {
	subreaperOnce.Do(func() {
		const prSetChildSubreaper = 36
		_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
	})
}

// reapGroup reaps the dead members of process group pgid that have become
// our children, until none is left or timeout passes. It must only be
// called after the group leader has been reaped by its cmd.Wait (otherwise
// it could steal the leader's exit status).
func reapGroup(pgid int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-pgid, &ws, syscall.WNOHANG, nil)
		switch {
		case err == syscall.EINTR || pid > 0:
			continue
		case err != nil: // ECHILD: no children left in the group
			return
		}
		// pid == 0: members remain that have not died yet.
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startChild starts cmd (which must not have been started) in its own
// process group with stdout and stderr captured, and starts the single
// goroutine that reaps it.
func startChild(cmd *exec.Cmd) (*child, error) {
	out := &syncBuffer{}
	if cmd.Stdout == nil {
		cmd.Stdout = out
	}
	if cmd.Stderr == nil {
		cmd.Stderr = out
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if cmd.WaitDelay == 0 {
		cmd.WaitDelay = waitDelay
	}
	becomeSubreaper()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, out: out, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

func (c *child) pid() int { return c.cmd.Process.Pid }

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// wait waits up to timeout for the process to have been reaped.
func (c *child) wait(timeout time.Duration) bool {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-c.done:
		return true
	case <-t.C:
		return false
	}
}

// signal sends sig to the process itself (not its group) unless it has
// already been reaped (its PID may then belong to someone else).
func (c *child) signal(sig syscall.Signal) error {
	if c.exited() {
		return os.ErrProcessDone
	}
	return syscall.Kill(c.pid(), sig)
}

// kill SIGKILLs the process group (at most once, so a recycled PGID is never
// hit later) and the process, waits for the reaper, then reaps the other
// group members that were orphaned to us. It reports whether the process
// was reaped within reapTimeout.
func (c *child) kill() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	first := !c.groupKilled
	if first {
		c.groupKilled = true
		// The group exists while the leader is unreaped or any member lives;
		// the leader's PID cannot be recycled while the group exists.
		_ = syscall.Kill(-c.pid(), syscall.SIGKILL)
	}
	_ = c.signal(syscall.SIGKILL)
	if !c.wait(reapTimeout) {
		return false
	}
	if first {
		reapGroup(c.pid(), 2*time.Second)
	}
	return true
}

// exitCode returns the exit code after done is closed: the process's exit
// status, or -1 if it was terminated by a signal.
func (c *child) exitCode() int {
	if c.cmd.ProcessState == nil {
		return -1
	}
	return c.cmd.ProcessState.ExitCode()
}

// ---------------------------------------------------------------------------
// Proc

// Proc is a generic child process started by a test (used to run the
// lockproxy binary, redis-cli, python, node, ...).
type Proc struct {
	// Cmd is the underlying command; it has already been started. Do not
	// call Cmd.Wait: the harness reaps the process itself.
	Cmd *exec.Cmd

	c *child
}

// StartProc starts name with args in its own process group with stdout and
// stderr captured into a buffer (safe for concurrent reads; see Output), and
// registers a cleanup that SIGKILLs the group (by -PID) and reaps the
// process.
func StartProc(t testing.TB, name string, args ...string) *Proc {
	t.Helper()
	return StartCmd(t, exec.Command(name, args...))
}

// StartCmd is StartProc for a prepared, not yet started command (e.g. with
// Dir, Env or Stdin set). If cmd.Stdout or cmd.Stderr is nil it is captured
// into the Proc's output buffer.
func StartCmd(t testing.TB, cmd *exec.Cmd) *Proc {
	t.Helper()
	c, err := startChild(cmd)
	if err != nil {
		t.Fatalf("harness: start %s: %v", cmd.String(), err)
	}
	p := &Proc{Cmd: cmd, c: c}
	t.Cleanup(func() {
		if !p.c.kill() {
			t.Errorf("harness: %s (pid %d) not reaped within %v of SIGKILL", cmd.Path, p.c.pid(), reapTimeout)
		}
		if t.Failed() {
			if out := tailLines(p.Output(), 30); out != "" {
				t.Logf("harness: output of %s (pid %d), last lines:\n%s", cmd.String(), p.c.pid(), out)
			}
		}
	})
	return p
}

// PID returns the process ID (also its process group ID).
func (p *Proc) PID() int { return p.c.pid() }

// Output returns everything the process has written to stdout and stderr
// so far.
func (p *Proc) Output() string { return p.c.out.String() }

// Kill SIGKILLs the process group and waits (bounded) until the process has
// been reaped. It is idempotent.
func (p *Proc) Kill() { p.c.kill() }

// Signal sends sig to the process (not its group). It returns
// os.ErrProcessDone if the process has already exited.
func (p *Proc) Signal(sig syscall.Signal) error { return p.c.signal(sig) }

// Exited reports whether the process has exited and been reaped.
func (p *Proc) Exited() bool { return p.c.exited() }

// Wait waits up to timeout for the process to exit. exitCode is its exit
// status, or -1 if it was killed by a signal. err is non-nil only if the
// process did not exit within the timeout (exitCode is then -1) or if
// waiting failed for a reason other than a non-zero exit status.
func (p *Proc) Wait(timeout time.Duration) (exitCode int, err error) {
	if !p.c.wait(timeout) {
		return -1, fmt.Errorf("harness: %s (pid %d) did not exit within %v", p.Cmd.Path, p.c.pid(), timeout)
	}
	err = p.c.err
	var ee *exec.ExitError
	if errors.As(err, &ee) || errors.Is(err, exec.ErrWaitDelay) {
		err = nil
	}
	return p.c.exitCode(), err
}

// ---------------------------------------------------------------------------
// Binaries

// RequireBinary fails the test (it does not skip) with a message naming the
// Debian package to install if bin is not on PATH.
func RequireBinary(t testing.TB, bin, debianPackage string) {
	t.Helper()
	if _, err := exec.LookPath(bin); err != nil {
		t.Fatalf("harness: required binary %q not found on PATH (%v); install the Debian package %q (apt-get install %s)",
			bin, err, debianPackage, debianPackage)
	}
}

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// BuildLockproxy builds ./cmd/lockproxy once per test binary run and returns
// the path of the binary. The module root is found by walking up from the
// working directory to go.mod. The binary is written to a temporary file and
// renamed to bin/lockproxy-test in the checkout (ignored by git, and gone
// with the checkout, where a directory under os.TempDir outlived every
// clone), so concurrently running test binaries never see a half-written file.
func BuildLockproxy(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() { buildPath, buildErr = buildLockproxy() })
	if buildErr != nil {
		t.Fatalf("harness: BuildLockproxy: %v", buildErr)
	}
	return buildPath
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found in the working directory or any parent")
		}
		dir = parent
	}
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	if root := os.Getenv("GOROOT"); root != "" {
		p := filepath.Join(root, "bin", "go")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "go"
}

func buildLockproxy() (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	final := filepath.Join(dir, "lockproxy-test")
	tmp := fmt.Sprintf("%s.%d.tmp", final, os.Getpid())

	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	// LOCKPROXY_TEST_BUILDFLAGS adds go build flags, such as -race (make
	// test-race), to the binary the end-to-end tests run.
	args := append([]string{"build"}, strings.Fields(os.Getenv("LOCKPROXY_TEST_BUILDFLAGS"))...)
	args = append(args, "-o", tmp, "./cmd/lockproxy")
	cmd := exec.CommandContext(ctx, goTool(), args...)
	cmd.Dir = root
	cmd.WaitDelay = waitDelay
	out, err := cmd.CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("go build -o %s ./cmd/lockproxy (in %s): %v\n%s", tmp, root, err, out)
	}
	if err := os.Rename(tmp, final); err != nil {
		os.Remove(tmp)
		return "", err
	}
	return final, nil
}
