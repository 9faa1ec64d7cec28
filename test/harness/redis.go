//go:build linux

package harness

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
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

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

const (
	redisServerBin   = "redis-server"
	redisStartupWait = 10 * time.Second
	redisStopWait    = 5 * time.Second
	// startAttempts is how often StartRedis tries fresh ports when the
	// chosen one was taken by someone else between FreePort and bind.
	startAttempts = 3
)

// RedisOptions configures StartRedis.
type RedisOptions struct {
	// Args are extra redis-server command-line arguments, appended after the
	// harness defaults (so they can override them), e.g.
	// []string{"--maxmemory", "10mb"}.
	Args []string
	// Password, if set, is passed as --requirepass and used by the
	// readiness check and by Client.
	Password string
	// TLS, if set, makes the server speak only TLS on its port, with the
	// server certificate TLS.Server (signed by TLS.CA), and ask clients
	// for a certificate without requiring one; the readiness check and
	// Client trust TLS.CA.
	TLS *TestCA
}

// Redis is one redis-server child process on 127.0.0.1.
type Redis struct {
	Port int
	Addr string // "127.0.0.1:port"

	t       testing.TB
	opts    RedisOptions
	dir     string
	logfile string

	mu  sync.Mutex
	cur *child // current (or last) process; nil before the first start

	tlsFiles TLSFiles // the server certificate, with opts.TLS
}

// clientTLS is the TLS configuration clients of r use: nil without TLS.
func (r *Redis) clientTLS() *tls.Config {
	if r.opts.TLS == nil {
		return nil
	}
	return r.opts.TLS.ClientConfig()
}

// StartRedis starts
//
//	redis-server --port P --bind 127.0.0.1 --save "" --appendonly no
//	  --daemonize no --protected-mode no --dir <t.TempDir()>
//	  --logfile <dir>/redis.log [--requirepass pw] opts.Args...
//
// in its own process group, waits (up to 10s) until PING answers PONG, and
// registers a cleanup that kills and reaps it. The test fails with the log
// tail if the server exits early or never answers.
func StartRedis(t testing.TB, opts RedisOptions) *Redis {
	t.Helper()
	return StartRedisN(t, 1, opts)[0]
}

// StartRedisN starts n redis-server nodes concurrently (see StartRedis).
func StartRedisN(t testing.TB, n int, opts RedisOptions) []*Redis {
	t.Helper()
	RequireBinary(t, redisServerBin, "redis-server")
	for _, a := range opts.Args {
		switch strings.ToLower(a) {
		case "--port", "--bind", "--daemonize", "--dir", "--logfile", "--requirepass":
			t.Fatalf("harness: StartRedis: RedisOptions.Args must not contain %s (the harness sets it; use RedisOptions.Password for --requirepass)", a)
		}
	}
	nodes := make([]*Redis, n)
	for i := range nodes {
		dir := t.TempDir()
		r := &Redis{
			t:       t,
			opts:    RedisOptions{Args: append([]string(nil), opts.Args...), Password: opts.Password, TLS: opts.TLS},
			dir:     dir,
			logfile: filepath.Join(dir, "redis.log"),
		}
		r.setPort(FreePort(t))
		nodes[i] = r
		// Registered after t.TempDir, so it runs before the directory is
		// removed.
		t.Cleanup(r.cleanup)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, r := range nodes {
		wg.Go(func() {
			for attempt := 1; ; attempt++ {
				errs[i] = r.launch()
				if errs[i] == nil || attempt >= startAttempts || !isAddrInUse(errs[i]) {
					return
				}
				p, err := freePort()
				if err != nil {
					return
				}
				r.setPort(p)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("harness: StartRedis: %v", err)
	}
	return nodes
}

// Addrs returns the "127.0.0.1:port" addresses of nodes.
func Addrs(nodes []*Redis) []string {
	out := make([]string, len(nodes))
	for i, r := range nodes {
		out[i] = r.Addr
	}
	return out
}

func (r *Redis) setPort(p int) {
	r.Port = p
	r.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
}

func (r *Redis) args() []string {
	args := []string{
		"--port", strconv.Itoa(r.Port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--protected-mode", "no",
		"--dir", r.dir,
		"--logfile", r.logfile,
	}
	if r.opts.Password != "" {
		args = append(args, "--requirepass", r.opts.Password)
	}
	if r.opts.TLS != nil {
		if r.tlsFiles.Cert == "" {
			r.tlsFiles = r.opts.TLS.Server()
		}
		args[1] = "0" // no plain port
		args = append(args, "--tls-port", strconv.Itoa(r.Port),
			"--tls-cert-file", r.tlsFiles.Cert, "--tls-key-file", r.tlsFiles.Key,
			"--tls-ca-cert-file", r.tlsFiles.CA, "--tls-auth-clients", "optional")
	}
	return append(args, r.opts.Args...)
}

// launch starts a new redis-server process (the previous one, if any, must
// have exited) and waits until it answers PING. On failure the new process
// is killed and reaped and the error carries the log tail.
func (r *Redis) launch() error {
	var logOffset int64
	if fi, err := os.Stat(r.logfile); err == nil {
		logOffset = fi.Size()
	}
	cmd := exec.Command(redisServerBin, r.args()...)
	cmd.Dir = r.dir
	c, err := startChild(cmd)
	if err != nil {
		return fmt.Errorf("start %s: %w", cmd.String(), err)
	}
	r.mu.Lock()
	r.cur = c
	r.mu.Unlock()

	deadline := time.Now().Add(redisStartupWait)
	var pingErr error
	for {
		if c.exited() {
			return &startError{
				addrInUse: strings.Contains(r.logSince(logOffset)+c.out.String(), "Address already in use"),
				err: fmt.Errorf("redis-server on %s (pid %d) exited during startup (%v); log tail:\n%s",
					r.Addr, c.pid(), c.err, r.failureTail(c)),
			}
		}
		if pingErr = r.ping(); pingErr == nil {
			return nil
		}
		if time.Now().After(deadline) {
			c.kill()
			return fmt.Errorf("redis-server on %s (pid %d) did not answer PING within %v (last error: %v); log tail:\n%s",
				r.Addr, c.pid(), redisStartupWait, pingErr, r.failureTail(c))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startError is a failed launch; addrInUse reports that the port was taken.
type startError struct {
	addrInUse bool
	err       error
}

func (e *startError) Error() string { return e.err.Error() }
func (e *startError) Unwrap() error { return e.err }

func isAddrInUse(err error) bool {
	var se *startError
	return errors.As(err, &se) && se.addrInUse
}

// logSince returns the log file content after byte offset off.
func (r *Redis) logSince(off int64) string {
	b, err := os.ReadFile(r.logfile)
	if err != nil || int64(len(b)) < off {
		return ""
	}
	return string(b[off:])
}

// failureTail is the log file tail plus anything the process wrote to
// stdout/stderr (config errors are printed there before the log is opened).
func (r *Redis) failureTail(c *child) string {
	s := r.LogTail(20)
	if out := tailLines(c.out.String(), 20); out != "" {
		s += "\n--- stdout/stderr ---\n" + out
	}
	return s
}

// ping sends (AUTH and) PING over a fresh connection and expects +PONG.
func (r *Redis) ping() error {
	var conn net.Conn
	var err error
	d := &net.Dialer{Timeout: 200 * time.Millisecond}
	if r.opts.TLS != nil {
		conn, err = tls.DialWithDialer(d, "tcp", r.Addr, r.opts.TLS.ClientConfig())
	} else {
		conn, err = d.Dial("tcp", r.Addr)
	}
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(500 * time.Millisecond))
	br := bufio.NewReader(conn)
	roundTrip := func(args ...string) (string, error) {
		var b strings.Builder
		fmt.Fprintf(&b, "*%d\r\n", len(args))
		for _, a := range args {
			fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
		}
		if _, err := conn.Write([]byte(b.String())); err != nil {
			return "", err
		}
		line, err := br.ReadString('\n')
		return strings.TrimRight(line, "\r\n"), err
	}
	if r.opts.Password != "" {
		reply, err := roundTrip("AUTH", r.opts.Password)
		if err != nil {
			return err
		}
		if reply != "+OK" {
			return fmt.Errorf("AUTH replied %q", reply)
		}
	}
	reply, err := roundTrip("PING")
	if err != nil {
		return err
	}
	if reply != "+PONG" {
		return fmt.Errorf("PING replied %q", reply)
	}
	return nil
}

func (r *Redis) current() *child {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur
}

func (r *Redis) cleanup() {
	c := r.current()
	if c == nil {
		return
	}
	if !c.kill() {
		r.t.Errorf("harness: redis-server on %s (pid %d) not reaped within %v of SIGKILL", r.Addr, c.pid(), reapTimeout)
	}
	if r.t.Failed() {
		if tail := r.LogTail(10); tail != "" {
			r.t.Logf("harness: redis-server on %s, last log lines:\n%s", r.Addr, tail)
		}
	}
}

// Kill SIGKILLs the server by PID and waits (bounded) until it has been
// reaped. It is idempotent.
func (r *Redis) Kill() {
	c := r.current()
	if c == nil {
		return
	}
	if !c.kill() {
		r.t.Errorf("harness: redis-server on %s (pid %d) not reaped within %v of SIGKILL", r.Addr, c.pid(), reapTimeout)
	}
}

// Stop sends SIGTERM (and SIGCONT, in case it is paused), waits up to 5s for
// the server to exit, then falls back to Kill.
func (r *Redis) Stop() {
	c := r.current()
	if c == nil || c.exited() {
		return
	}
	_ = c.signal(syscall.SIGTERM)
	_ = c.signal(syscall.SIGCONT)
	if !c.wait(redisStopWait) {
		r.Kill()
	}
}

// Restart kills the server if it is running and starts it again on the same
// port with the same arguments (the dataset is empty: there is no
// persistence), waiting until it answers PING. It fails the test (t.Fatalf,
// so call it from the test goroutine) if the server does not come back; use
// TryRestart from other goroutines.
func (r *Redis) Restart() {
	r.t.Helper()
	if err := r.TryRestart(); err != nil {
		r.t.Fatalf("harness: Restart: %v", err)
	}
}

// RestartWithArgs is Restart with args in place of RedisOptions.Args from
// now on: the same port, another configuration (say, a command renamed
// away, so that the server's COMMAND table differs).
func (r *Redis) RestartWithArgs(args ...string) {
	r.t.Helper()
	r.opts.Args = args
	r.Restart()
}

// TryRestart is Restart returning an error instead of failing the test. If
// the port is briefly unavailable it retries for up to 10s.
func (r *Redis) TryRestart() error {
	r.Kill()
	if c := r.current(); c != nil && !c.exited() {
		return fmt.Errorf("redis-server on %s (pid %d) is still running", r.Addr, c.pid())
	}
	deadline := time.Now().Add(redisStartupWait)
	for {
		err := r.launch()
		if err == nil || time.Now().After(deadline) || !isAddrInUse(err) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Pause sends SIGSTOP: the server keeps its port and accepts TCP
// connections (kernel backlog) but answers nothing until Resume.
func (r *Redis) Pause() { r.sig(syscall.SIGSTOP) }

// Resume sends SIGCONT.
func (r *Redis) Resume() { r.sig(syscall.SIGCONT) }

func (r *Redis) sig(s syscall.Signal) {
	c := r.current()
	if c == nil {
		r.t.Errorf("harness: redis-server on %s was never started", r.Addr)
		return
	}
	if err := c.signal(s); err != nil {
		r.t.Errorf("harness: signal %v to redis-server on %s (pid %d): %v", s, r.Addr, c.pid(), err)
	}
}

// Running reports whether the server process is alive (a paused server is
// running).
func (r *Redis) Running() bool {
	c := r.current()
	return c != nil && !c.exited()
}

// PID returns the PID of the current (or last) server process, 0 if none
// was started.
func (r *Redis) PID() int {
	c := r.current()
	if c == nil {
		return 0
	}
	return c.pid()
}

// Client returns a go-redis client connected directly to this node (closed
// at cleanup), for checking keys on the node. Context deadlines are honoured
// for socket I/O.
func (r *Redis) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:                  r.Addr,
		Password:              r.opts.Password,
		DialTimeout:           time.Second,
		DialerRetries:         1, // a killed node should fail fast
		ReadTimeout:           3 * time.Second,
		WriteTimeout:          3 * time.Second,
		ContextTimeoutEnabled: true,
		DisableIdentity:       true,
		MaintNotificationsConfig: &maintnotifications.Config{
			Mode: maintnotifications.ModeDisabled,
		},
		TLSConfig: r.clientTLS(),
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// LogTail returns the last n lines of the server's log file (all of it if
// n <= 0). The log is kept across Restart.
func (r *Redis) LogTail(n int) string {
	b, err := os.ReadFile(r.logfile)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	return tailLines(string(b), n)
}

// LogPath returns the path of the server's log file.
func (r *Redis) LogPath() string { return r.logfile }
