package commands

import (
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// startCPULoad starts n busy loops of the same priority as the test,
// each bounded to limit by its own timeout and stopped by PID at the
// end of the test: an overloaded host, made on purpose.
func startCPULoad(t *testing.T, n int, limit time.Duration) {
	t.Helper()
	secs := itoa(int(limit/time.Second) + 1)
	for range n {
		cmd := exec.Command("timeout", secs, "sh", "-c", "while :; do :; done")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting a CPU load: %v", err)
		}
		pid := cmd.Process.Pid
		t.Cleanup(func() {
			// timeout and its sh share the process group timeout
			// leads: both end here.
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			_ = cmd.Wait()
		})
	}
}

// TestKeepaliveRenewalsSurviveOverload: one connection holds 10,000
// KEEPALIVE locks of PX 2000 over three real redis-server nodes with
// lockproxy's default node configuration (one batching writer per node,
// 250 ms for each node to answer), and then the host is overloaded on
// purpose: one busy loop per vCPU runs at the test's priority for
// three renewal periods. A renewal is not an acquisition: it may take as
// long as the validity last answered allows, so a host too busy to
// answer within the node timeout must slow the renewals down, not lose
// the locks. Before, renewals were cut at the node timeout, the failed
// ones tried again every period/6 on top of the due ones, and most of the
// locks were lost at once.
func TestKeepaliveRenewalsSurviveOverload(t *testing.T) {
	if testing.Short() {
		t.Skip("takes and holds 10,000 locks on an overloaded host, about 15 s")
	}
	if raceDetector {
		t.Skip("a capacity test: not under the race detector")
	}
	if os.Getenv("LOCKPROXY_SOAK") == "" {
		// A capacity figure on a host it overloads itself: its losses
		// depend on what else runs (most locks are lost at load 17-21,
		// before and after), so not in make test beside the other
		// packages; backends/redis TestRenewHoldWaitsInTheQueueUpToItsDeadline
		// checks the mechanism there.
		t.Skip("overloads the host: with LOCKPROXY_SOAK=1 (make soak)")
	}
	const (
		n   = maxKeepalivePerConn
		ttl = 2 * time.Second
	)
	k, logs, c := holdKeepaliveLocks(t, "ovl-", n, ttl)
	const watch = 3 * ttl / 3
	startCPULoad(t, runtime.NumCPU(), watch+2*time.Second)
	time.Sleep(watch)
	lost := counterValue(t, k.lost[lostRenewFailed])
	live := c.ka.live.Load()
	t.Logf("%v of %d KEEPALIVE locks lost to failed renewals on an overloaded host", lost, n)
	// What is measured is the collapse: a host this busy may still cost
	// a few locks (each told), never most of them at once. Before, 46 to
	// 100 % were lost here; since, none to about a fifth at load averages up to
	// 10 from other processes besides this test's own.
	if lost >= n/4 {
		for i, e := range logs.TakeAll() {
			if i < 3 {
				t.Logf("%s %v", e.Message, e.ContextMap())
			}
		}
		t.Fatalf("%v of %d KEEPALIVE locks lost to failed renewals (%d kept) on an overloaded host; want under a quarter, each told",
			lost, n, live)
	}
}
