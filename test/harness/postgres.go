//go:build linux

package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	// pgRoot holds Debian's PostgreSQL versions, one directory each.
	pgRoot = "/usr/lib/postgresql"
	// pgUser is the superuser initdb makes; it logs in without a
	// password (trust) on 127.0.0.1 only.
	pgUser = "lockproxy"
	// pgStartupWait bounds a server's start (crash recovery included).
	pgStartupWait = 60 * time.Second
	// pgRunAs is who runs initdb and postgres when the tests run as root:
	// postgres refuses to.
	pgRunAs, pgRunAsGroup = "nobody", "nogroup"
)

// Postgres is one PostgreSQL server child process on 127.0.0.1, its data
// in a directory of its own.
type Postgres struct {
	Port int
	Addr string // "127.0.0.1:port"

	bin  string // the version's bin directory
	dir  string
	data string

	mu  sync.Mutex
	cur *child
}

// StartPostgres initdbs a cluster in t.TempDir(), starts postgres on a free
// loopback port (fsync off: the tests run on a loaded machine and need no
// durability against an OS crash), waits until it accepts a connection, and
// registers a cleanup that kills and reaps it.
func StartPostgres(t testing.TB) *Postgres {
	t.Helper()
	p, err := LaunchPostgres(t.TempDir())
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			if out := tailLines(p.Output(), 30); out != "" {
				t.Logf("harness: postgres output, last lines:\n%s", out)
			}
		}
	})
	return p
}

// LaunchPostgres is StartPostgres for servers shared by a package's tests
// (started in TestMain): dir must exist, and the caller must Kill it.
func LaunchPostgres(dir string) (*Postgres, error) {
	bin, err := postgresBin()
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	p := &Postgres{
		Port: port, Addr: fmt.Sprintf("127.0.0.1:%d", port), bin: bin, dir: dir,
		data: filepath.Join(dir, "pgdata"),
	}
	if err := os.MkdirAll(p.data, 0o700); err != nil {
		return nil, err
	}
	if err := giveToRunAs(p.data); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), pgStartupWait)
	defer cancel()
	name, args := runAs(filepath.Join(bin, "initdb"),
		"-D", p.data, "-U", pgUser, "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions")
	initdb := exec.CommandContext(ctx, name, args...)
	initdb.WaitDelay = waitDelay
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("postgres: initdb %s: %v\n%s", p.data, err, tailLines(string(out), 20))
	}
	if err := p.launch(); err != nil {
		return nil, err
	}
	if err := p.waitServing(pgStartupWait); err != nil {
		p.Kill()
		return nil, err
	}
	return p, nil
}

// postgresBin finds the newest version's bin directory.
func postgresBin() (string, error) {
	ents, err := os.ReadDir(pgRoot)
	if err != nil {
		return "", fmt.Errorf("postgres: %s: %v; install Debian's postgresql package (scripts/install-test-deps.sh)", pgRoot, err)
	}
	var vers []int
	for _, e := range ents {
		if v, err := strconv.Atoi(e.Name()); err == nil {
			if _, err := os.Stat(filepath.Join(pgRoot, e.Name(), "bin", "postgres")); err == nil {
				vers = append(vers, v)
			}
		}
	}
	if len(vers) == 0 {
		return "", fmt.Errorf("postgres: no server under %s; install Debian's postgresql package (scripts/install-test-deps.sh)", pgRoot)
	}
	sort.Ints(vers)
	return filepath.Join(pgRoot, strconv.Itoa(vers[len(vers)-1]), "bin"), nil
}

// giveToRunAs hands d to pgRunAs when running as root, and lets that user
// reach it through the test's temporary directories (0700 by default).
func giveToRunAs(d string) error {
	if os.Getuid() != 0 {
		return nil
	}
	if out, err := exec.Command("chown", pgRunAs+":"+pgRunAsGroup, d).CombinedOutput(); err != nil {
		return fmt.Errorf("postgres: chown %s: %v: %s", d, err, out)
	}
	tmp := filepath.Clean(os.TempDir())
	for p := filepath.Dir(d); strings.HasPrefix(p, tmp+"/"); p = filepath.Dir(p) {
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		if err := os.Chmod(p, st.Mode().Perm()|0o011); err != nil {
			return err
		}
	}
	return nil
}

// runAs is the program and arguments that run name as pgRunAs when the
// tests run as root. setpriv execs the program, so the PID started is
// postgres's own.
func runAs(name string, args ...string) (string, []string) {
	if os.Getuid() != 0 {
		return name, args
	}
	return "setpriv", append([]string{"--reuid=" + pgRunAs, "--regid=" + pgRunAsGroup, "--clear-groups", name}, args...)
}

func (p *Postgres) launch() error {
	name, args := runAs(filepath.Join(p.bin, "postgres"), "-D", p.data, "-p", strconv.Itoa(p.Port),
		// No Unix-domain socket: the tests connect over TCP, and a socket
		// directory outside dir (its path must be short) would outlive the server.
		"-k", "",
		"-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=off", "-c", "full_page_writes=off",
		"-c", "max_connections=200", "-c", "shared_buffers=32MB",
		"-c", "log_min_messages=warning", "-c", "log_connections=off")
	cmd := exec.Command(name, args...)
	cmd.Dir = p.dir
	c, err := startChild(cmd)
	if err != nil {
		return fmt.Errorf("postgres: start: %w", err)
	}
	p.mu.Lock()
	p.cur = c
	p.mu.Unlock()
	return nil
}

// DSN is a URL for the superuser on the server's port.
func (p *Postgres) DSN() string {
	return fmt.Sprintf("postgres://%s@%s/postgres?sslmode=disable", pgUser, p.Addr)
}

// Conn is a direct connection for a test to look at the tables, closed at
// the end of t.
func (p *Postgres) Conn(t testing.TB) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, p.DSN())
	if err != nil {
		t.Fatalf("harness: postgres connect: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	})
	return c
}

// waitServing waits until a connection succeeds and answers SELECT 1.
func (p *Postgres) waitServing(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		c := p.current()
		if c != nil && c.exited() {
			return fmt.Errorf("postgres on %s exited early: %s", p.Addr, tailLines(c.out.String(), 20))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, p.DSN())
		if err == nil {
			var one int
			err = conn.QueryRow(ctx, "SELECT 1").Scan(&one)
			_ = conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	if last == nil {
		last = errors.New("no attempt")
	}
	return fmt.Errorf("postgres on %s not serving after %v: %v", p.Addr, timeout, last)
}

func (p *Postgres) current() *child {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur
}

// Kill SIGKILLs the server, the postmaster and every process it forked,
// as a crash of the machine's server would end them, and reaps them.
// postgres's children call setsid(), so killing the postmaster's process
// group does not reach them: the postmaster is stopped first (it can fork
// no more, nor see its children die), its children are listed from /proc
// and killed, then the postmaster: no process says goodbye to a client.
func (p *Postgres) Kill() {
	c := p.current()
	if c == nil || c.exited() {
		return
	}
	_ = c.signal(syscall.SIGSTOP)
	kids := childPIDs(c.pid())
	for _, k := range kids {
		_ = syscall.Kill(k, syscall.SIGKILL)
	}
	c.kill()
	// Orphans are ours to reap (the test process is their subreaper).
	for _, k := range kids {
		reapPID(k, reapTimeout)
	}
}

// Pause stops the postmaster and every process it forked with SIGSTOP: a
// server that hangs, its connections open. Resume continues them.
func (p *Postgres) Pause() { p.signalAll(syscall.SIGSTOP) }

// Resume continues a paused server with SIGCONT.
func (p *Postgres) Resume() { p.signalAll(syscall.SIGCONT) }

func (p *Postgres) signalAll(sig syscall.Signal) {
	c := p.current()
	if c == nil || c.exited() {
		return
	}
	if sig == syscall.SIGSTOP {
		_ = c.signal(sig) // first, so it forks no child unstopped
	}
	for _, k := range childPIDs(c.pid()) {
		_ = syscall.Kill(k, sig)
	}
	_ = c.signal(sig)
}

// childPIDs lists the processes whose parent is ppid.
func childPIDs(ppid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(ppid) {
			out = append(out, pid)
		}
	}
	return out
}

// reapPID waits up to timeout for pid to be gone: reaped by us when it is
// our child, or reaped by another.
func reapPID(pid int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		switch {
		case got == pid:
			return
		case err == syscall.ECHILD:
			if syscall.Kill(pid, 0) == syscall.ESRCH {
				return
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Restart starts the server again on the same data directory and port
// after Kill (it runs crash recovery) and waits until it serves.
func (p *Postgres) Restart() error {
	p.Kill()
	if err := p.launch(); err != nil {
		return err
	}
	return p.waitServing(pgStartupWait)
}

// PID is the postmaster's process ID (0 before it started).
func (p *Postgres) PID() int {
	if c := p.current(); c != nil {
		return c.pid()
	}
	return 0
}

// Output is what the server printed (its log goes to stderr).
func (p *Postgres) Output() string {
	if c := p.current(); c != nil {
		return c.out.String()
	}
	return ""
}
