package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
)

// redisCLI runs redis-cli against the lockproxy at addr and returns its
// output, failing the test unless it exits 0 within 15 s.
func redisCLI(t *testing.T, addr string, args ...string) string {
	t.Helper()
	_, port, _ := strings.Cut(addr, ":")
	p := harness.StartProc(t, "redis-cli", append([]string{"-h", "127.0.0.1", "-p", port}, args...)...)
	code, err := p.Wait(15 * time.Second)
	if err != nil || code != 0 {
		t.Fatalf("redis-cli %q: exit %d, %v; output:\n%s", args, code, err, p.Output())
	}
	return p.Output()
}

func TestRedisCLI(t *testing.T) {
	t.Parallel()
	harness.RequireBinary(t, "redis-cli", "redis-tools")
	eachSize(t, func(t *testing.T, n int) {
		cl := startCluster(t, n)
		addr, _ := startProxy(t, cl.addrs())

		t.Run("LOCK and UNLOCK", func(t *testing.T) {
			out := redisCLI(t, addr, "LOCK", "demo", "PX", "10000")
			lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
			if len(lines) != 6 || lines[0] != "token" || lines[2] != "validity_ms" || lines[4] != "fence" {
				t.Fatalf("redis-cli LOCK demo PX 10000 printed %q; want token, <token>, validity_ms, <n>, fence, <n> lines", out)
			}
			token := lines[1]
			if !hexToken.MatchString(token) {
				t.Errorf("token line %q; want 32 hex digits", token)
			}
			if v, err := strconv.ParseInt(lines[3], 10, 64); err != nil || v <= 0 || v > maxValidityMS(10000) {
				t.Errorf("validity_ms line %q; want an integer in (0, %d]", lines[3], maxValidityMS(10000))
			}
			if f, err := strconv.ParseInt(lines[5], 10, 64); err != nil || f <= 0 {
				t.Errorf("fence line %q; want a positive integer", lines[5])
			}
			if out := redisCLI(t, addr, "LOCK", "demo", "PX", "10000"); strings.TrimSpace(out) != "" {
				t.Errorf("redis-cli second LOCK printed %q; want nothing (nil)", out)
			}
			if out := redisCLI(t, addr, "UNLOCK", "demo", token); strings.TrimSpace(out) != "1" {
				t.Errorf("redis-cli UNLOCK demo <token> printed %q; want 1", out)
			}
		})

		t.Run("LOCK under RESP3", func(t *testing.T) {
			out := redisCLI(t, addr, "-3", "LOCK", "demo3", "PX", "10000")
			lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
			var token, validity, fence string
			if len(lines) == 3 {
				token, _ = strings.CutPrefix(lines[0], "token ")
				validity, _ = strings.CutPrefix(lines[1], "validity_ms ")
				fence, _ = strings.CutPrefix(lines[2], "fence ")
			}
			if !hexToken.MatchString(token) || validity == "" || fence == "" {
				t.Fatalf("redis-cli -3 LOCK demo3 PX 10000 printed %q; want \"token <token>\", \"validity_ms <n>\", \"fence <n>\" lines", out)
			}
			if v, err := strconv.ParseInt(validity, 10, 64); err != nil || v <= 0 || v > maxValidityMS(10000) {
				t.Errorf("validity_ms %q; want an integer in (0, %d]", validity, maxValidityMS(10000))
			}
			if out := redisCLI(t, addr, "-3", "UNLOCK", "demo3", token); strings.TrimSpace(out) != "1" {
				t.Errorf("redis-cli -3 UNLOCK demo3 <token> printed %q; want 1", out)
			}
		})

		t.Run("COMMAND DOCS", func(t *testing.T) {
			out := redisCLI(t, addr, "COMMAND", "DOCS", "lock")
			for _, want := range []string{"lock", "summary", "arguments", "PX", "WAIT", "TOKEN"} {
				if !strings.Contains(out, want) {
					t.Errorf("redis-cli COMMAND DOCS lock lacks %q:\n%s", want, out)
				}
			}
			// All commands at once, as redis-cli fetches them at start.
			out = redisCLI(t, addr, "COMMAND", "DOCS")
			for _, want := range []string{"lock", "unlock", "renew", "ping"} {
				if !strings.Contains(out, "\n"+want+"\n") && !strings.HasPrefix(out, want+"\n") {
					t.Errorf("redis-cli COMMAND DOCS lacks the entry %q", want)
				}
			}
		})

		for _, proto := range []string{"2", "3"} {
			t.Run("interactive RESP"+proto, func(t *testing.T) {
				harness.RequireBinary(t, "python3", "python3")
				script := filepath.Join(t.TempDir(), "drive_redis_cli.py")
				if err := os.WriteFile(script, []byte(ptyScript), 0o644); err != nil {
					t.Fatal(err)
				}
				_, port, _ := strings.Cut(addr, ":")
				p := harness.StartProc(t, "python3", script, port, proto, "help LOCK", "PING", "quit")
				code, err := p.Wait(30 * time.Second)
				out := p.Output()
				if err != nil || code != 0 {
					t.Fatalf("pty driver: exit %d, %v; output:\n%s", code, err, out)
				}
				plain := ansi.ReplaceAllString(out, "")
				for _, want := range []string{"LOCK key [PX milliseconds|EX seconds]", "summary:", "group: lock", "PONG", "REDIS-CLI EXIT 0"} {
					if !strings.Contains(plain, want) {
						t.Errorf("interactive redis-cli -%s output lacks %q:\n%s", proto, want, plain)
					}
				}
				for _, bad := range []string{"Assertion", "Aborted", "Segmentation", "core dumped", "REDIS-CLI SIGNAL"} {
					if strings.Contains(plain, bad) {
						t.Errorf("interactive redis-cli -%s output contains %q:\n%s", proto, bad, plain)
					}
				}
			})
		}
	})
}

// ansi matches terminal escape sequences.
var ansi = regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]`)

// ptyScript runs redis-cli (-2 or -3) on a pseudo-terminal, answers linenoise's
// cursor-position queries, types the given lines, and reports how
// redis-cli ended. Every wait is bounded; redis-cli is killed if it does
// not exit by itself.
const ptyScript = `
import os, pty, select, signal, struct, sys, time, fcntl, termios

port, proto, lines = sys.argv[1], sys.argv[2], sys.argv[3:]
signal.alarm(25)  # the whole script

pid, fd = pty.fork()
if pid == 0:
    try:
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
    except OSError:
        pass
    os.environ["TERM"] = "xterm"
    os.execvp("redis-cli", ["redis-cli", "-" + proto, "-h", "127.0.0.1", "-p", port])

out = bytearray()

def pump(seconds, until=None):
    end = time.time() + seconds
    while time.time() < end:
        r, _, _ = select.select([fd], [], [], 0.05)
        if fd not in r:
            if until is not None and until in out:
                return True
            continue
        try:
            data = os.read(fd, 65536)
        except OSError:
            return False
        if not data:
            return False
        out.extend(data)
        for _ in range(data.count(b"\x1b[6n")):
            os.write(fd, b"\x1b[1;1R")
    return until is None

status = None
try:
    prompt = ("127.0.0.1:%s> " % port).encode()
    pump(5, prompt)
    for line in lines:
        start = len(out)
        os.write(fd, line.encode() + b"\r")
        # Done when the output, past the echo of the line, ends with a
        # fresh prompt (or redis-cli is gone).
        end = time.time() + 5
        while time.time() < end:
            if not pump(0.1):
                break
            if len(out) > start + len(line) and b"\n" in out[start:] and out.endswith(prompt):
                pump(0.2)
                break
    pump(3)
    for _ in range(50):
        wpid, st = os.waitpid(pid, os.WNOHANG)
        if wpid == pid:
            status = st
            break
        time.sleep(0.1)
finally:
    if status is None:
        try:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
        except OSError:
            pass

sys.stdout.write(out.decode("utf-8", "replace"))
if status is None:
    sys.stdout.write("\nREDIS-CLI UNKNOWN\n")
elif os.WIFSIGNALED(status):
    sys.stdout.write("\nREDIS-CLI SIGNAL %d\n" % os.WTERMSIG(status))
else:
    sys.stdout.write("\nREDIS-CLI EXIT %d\n" % os.WEXITSTATUS(status))
`
