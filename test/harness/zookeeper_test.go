package harness

import (
	"strings"
	"testing"
	"time"
)

// TestZooKeeperStandaloneLinkKill: a standalone server serves on its port,
// answers through a Link until the link is cut, and is reaped on Kill.
func TestZooKeeperStandaloneLinkKill(t *testing.T) {
	z := StartZooKeeper(t)
	if m, err := z.Mode(); err != nil || m != "standalone" {
		t.Fatalf("Mode = %q, %v; want standalone", m, err)
	}
	l := StartLink(t, z.Addr)
	if out, err := FourLetter(l.Addr(), "ruok", 5*time.Second); err != nil || out != "imok" {
		t.Fatalf("ruok through the link = %q, %v; want imok", out, err)
	}
	l.Cut()
	if out, _ := FourLetter(l.Addr(), "ruok", 500*time.Millisecond); out != "" {
		t.Errorf("ruok through a cut link = %q; want nothing", out)
	}
	l.Heal()
	if out, err := FourLetter(l.Addr(), "ruok", 5*time.Second); err != nil || out != "imok" {
		t.Errorf("ruok through the healed link = %q, %v; want imok", out, err)
	}
	pid := z.PID()
	z.Kill()
	if !gone(pid) {
		t.Errorf("pid %d still exists after Kill", pid)
	}
	if _, err := z.Mode(); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("Mode after Kill = %v; want connection refused", err)
	}
}
