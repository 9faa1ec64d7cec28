package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
)

// TestCommandLine covers the command-line contract of PROTOCOL.md that opens
// no lock: --version, check-config, and refusing bad configuration.
func TestCommandLine(t *testing.T) {
	bin := harness.BuildLockproxy(t)
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.yaml", "listen: 127.0.0.1:7380\nredlock:\n  nodes: [127.0.0.1:7001, 127.0.0.1:7002, 127.0.0.1:7003]\n")
	bad := write("bad.yaml", "listen: nowhere\nredlock:\n  nodez: [a]\n  drift_factor: 0.7\n")
	// Nodes and the password only in the environment, as a systemd unit's
	// EnvironmentFile gives them: check-config sees what lockproxy would.
	envOnly := write("env-only.yaml", "listen: 127.0.0.1:7380\nauth:\n  permissions: [\"default +@all\"]\n")
	envOK := []string{"LOCKPROXY_REDLOCK_NODES=127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003", "LOCKPROXY_AUTH_PASSWORD=pw"}
	for _, tc := range []struct {
		name     string
		args     []string
		wantCode int
		want     []string // in the output
		env      []string
	}{
		{"version", []string{"--version"}, 0, []string{"lockproxy ", "commit "}, nil},
		{"check-config ok", []string{"check-config", good}, 0, []string{"ok"}, nil},
		{"check-config lists every problem", []string{"check-config", bad}, 1,
			[]string{"redlock.nodez", "unknown key"}, nil},
		{"check-config missing file", []string{"check-config", filepath.Join(dir, "none.yaml")}, 1, []string{"none.yaml"}, nil},
		{"check-config applies the environment", []string{"check-config", envOnly}, 0, []string{"ok"}, envOK},
		{"check-config without the environment", []string{"check-config", envOnly}, 1, []string{"redlock.nodes", `user "default"`}, nil},
		{"check-config checks the environment too", []string{"check-config", good}, 1, []string{"drift_factor"}, []string{"LOCKPROXY_REDLOCK_DRIFT_FACTOR=0.9"}},
		{"invalid flags refused", []string{"--listen", "nowhere", "--nodes", "127.0.0.1:1"}, 2, []string{"listen"}, nil},
		{"no nodes without --dev", []string{"--listen", "127.0.0.1:0"}, 2, []string{"redlock.nodes"}, nil},
		{"bad lock pattern refused", []string{"--dev", "--lock-pattern", "lock:["}, 2, []string{"lock_patterns"}, nil},
		{"bad procs refused", []string{"--dev", "--procs", "0"}, 2, []string{"procs: must be auto or a number"}, nil},
		{"bad procs in the environment refused", []string{"--dev"}, 2, []string{"procs: must be auto"}, []string{"LOCKPROXY_PROCS=all"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(bin, tc.args...)
			cmd.Env = append(os.Environ(), tc.env...)
			p := harness.StartCmd(t, cmd)
			code, err := p.Wait(30 * time.Second)
			if err != nil {
				t.Fatalf("lockproxy %s: %v", strings.Join(tc.args, " "), err)
			}
			out := p.Output()
			if code != tc.wantCode {
				t.Fatalf("lockproxy %s exited %d; want %d\n%s", strings.Join(tc.args, " "), code, tc.wantCode, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("lockproxy %s output lacks %q:\n%s", strings.Join(tc.args, " "), w, out)
				}
			}
		})
	}
}

// TestDevMode: `lockproxy --dev` (what `make run` starts) serves locks from
// its embedded nodes, and their leases run out on time.
func TestDevMode(t *testing.T) {
	bin := harness.BuildLockproxy(t)
	addr := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	p := harness.StartProc(t, bin, "--dev", "--listen", addr, "--admin", "")
	if err := harness.WaitTCP(addr, 15*time.Second); err != nil {
		t.Fatalf("lockproxy --dev did not listen: %v\n%s", err, p.Output())
	}
	c := lc.NewClient(t, addr, 2)
	g := lc.MustLock(t, c, "demo", "PX", 10000)
	if g.ValidityMS <= 0 || g.ValidityMS > maxValidityMS(10000) {
		t.Fatalf("LOCK demo PX 10000 validity %d; want in (0, %d]", g.ValidityMS, maxValidityMS(10000))
	}
	if _, ok := lc.Lock(t, c, "demo", "PX", 10000); ok {
		t.Fatal("second LOCK demo granted; want nil")
	}
	if n := lc.Unlock(t, c, "demo", g.Token); n != 1 {
		t.Fatalf("UNLOCK = %d; want 1", n)
	}
	if n := lc.Unlock(t, c, "demo", g.Token); n != 0 {
		t.Fatalf("second UNLOCK = %d; want 0", n)
	}
	// Leases expire on the embedded nodes too.
	lc.MustLock(t, c, "short", "PX", 200)
	err := eventually(40, 50*time.Millisecond, func() error {
		if _, ok := lc.Lock(t, c, "short", "PX", 200); !ok {
			return fmt.Errorf("still held")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("a PX 200 lock on --dev nodes never expired: %v", err)
	}
	if !strings.Contains(p.Output(), "redis-cli -p") {
		t.Errorf("--dev banner does not say how to connect:\n%s", p.Output())
	}
}
