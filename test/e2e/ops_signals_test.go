package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestSignalDuringDrain: a signal that arrives while SIGTERM's drain runs
// must not end the drain. A SIGHUP is what a certificate renewal hook's
// `kill -HUP` (or `systemctl reload`) sends at any moment, a stop
// included; a second SIGTERM or SIGINT is an impatient operator or a
// supervisor repeating itself. In each case the waiter's LOCK … WAIT is
// still answered, the KEEPALIVE lock is released before the exit, and
// lockproxy exits 0: the drain is bounded by limits.shutdown_timeout, and
// SIGKILL is the way to cut it short.
func TestSignalDuringDrain(t *testing.T) {
	for _, tc := range []struct {
		name string
		sig  syscall.Signal
	}{
		{"SIGHUP", syscall.SIGHUP},
		{"second SIGTERM", syscall.SIGTERM},
		{"SIGINT", syscall.SIGINT},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cl := startCluster(t, 3)
			in := startInstance(t, cl.addrs())

			// A KEEPALIVE lock (no PX: the default lease, renewed while
			// its connection lives), released by the drain.
			kaKey := "sigdrain-ka-" + lockclient.RandID()
			kaHolder := lc.DialRaw(t, in.addr)
			kaTok := rawGrant(t, kaHolder, kaKey)
			if missing := cl.missingNodes(t, kaKey, kaTok); len(missing) > 1 {
				t.Fatalf("LOCK %q: missing on nodes %v", kaKey, missing)
			}

			// A held key and a client waiting for it: the drain waits for
			// the waiter's LOCK, which runs for its WAIT.
			const wait = 3 * time.Second
			key := "sigdrain-" + lockclient.RandID()
			holder := lc.DialRaw(t, in.addr)
			rawGrant(t, holder, key, "PX", "30000")
			waiter := lc.DialRaw(t, in.addr)
			waiter.Write(lockclient.Encode("LOCK", key, "PX", "10000", "WAIT", fmt.Sprint(wait.Milliseconds())))
			time.Sleep(300 * time.Millisecond) // the waiter is waiting now

			if err := in.proc.Signal(syscall.SIGTERM); err != nil {
				t.Fatalf("SIGTERM: %v", err)
			}
			time.Sleep(300 * time.Millisecond) // the drain runs
			if in.proc.Exited() {
				t.Fatal("lockproxy exited before the waiter's LOCK finished; the drain was not tested")
			}
			if err := in.proc.Signal(tc.sig); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if r, err := waiter.ReadWithin(2 * wait); err != nil {
				t.Errorf("the waiter's LOCK after %s during the drain: %v; want a reply", tc.name, err)
			} else {
				t.Logf("the waiter's LOCK = %v", r)
			}
			code, err := in.proc.Wait(15 * time.Second)
			if err != nil || code != 0 {
				t.Errorf("exit after SIGTERM then %s = %d, %v; want 0 (output:\n%s)", tc.name, code, err, lastLines(in.proc.Output(), 5))
			}
			// A release answers once a majority released; a minority may
			// keep its copy until the lease ends.
			if h := cl.holders(t, kaKey, kaTok); h > len(cl.nodes)/2 {
				t.Errorf("KEEPALIVE lock %q still held on %d of %d nodes after SIGTERM then %s; want released on a majority", kaKey, h, len(cl.nodes), tc.name)
			}
		})
	}
}

// lastLines returns the last n lines of s, for a failure message.
func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// TestInfoConfigFile: INFO's config_file names the config file the
// instance read, as an absolute path (the working directory a relative
// one was given against is not in INFO), and is empty without one, as in
// Redis. An operator with several instances or files tells by it which
// file a running instance read.
func TestInfoConfigFile(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	bin := harness.BuildLockproxy(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "lockproxy.yaml"), []byte("log: {level: info}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no file", nil, ""},
		{"relative to the working directory", []string{"--config", "sub/../lockproxy.yaml"}, filepath.Join(dir, "lockproxy.yaml")},
		{"positional", []string{filepath.Join(dir, "lockproxy.yaml")}, filepath.Join(dir, "lockproxy.yaml")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o700); err != nil {
				t.Fatal(err)
			}
			addr := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
			args := append([]string{"--listen", addr, "--admin", "", "--nodes", strings.Join(cl.addrs(), ",")}, tc.args...)
			cmd := exec.Command(bin, args...)
			cmd.Dir = dir
			proc := harness.StartCmd(t, cmd)
			if err := harness.WaitTCP(addr, 15*time.Second); err != nil {
				t.Fatalf("lockproxy %v did not listen on %s: %v\n%s", args, addr, err, proc.Output())
			}
			info, err := lc.NewClient(t, addr, 2).Info(lockclient.CtxFor(t, 10*time.Second), "server").Result()
			if err != nil {
				t.Fatalf("INFO server: %v", err)
			}
			if want := "config_file:" + tc.want + "\r\n"; !strings.Contains(info, want) {
				t.Errorf("INFO server with args %q lacks %q:\n%s", tc.args, want, info)
			}
		})
	}
}
