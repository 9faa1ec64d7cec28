package zk

import (
	"fmt"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/suite"
)

// TestProxyKilledRepeatedly is the fault matrix's repeated "lockproxy
// kill -9" row on ZooKeeper, judged by test/fault's checker: clients of
// two instances loop LOCK … PX … WAIT (half with KEEPALIVE, half holding
// to 50–90 % of their validity) → fenced-ledger read-modify-write →
// UNLOCK over a few keys while instance A is SIGKILLed at random points
// and started again on the same address, five times. The locks of each
// dead incarnation live in its session until ZooKeeper expires it (or
// until their holder's UNLOCK reaches the next incarnation), so a key a
// client of A held goes to another client at most about one session
// timeout after the kill (asserted generously: within 4 × the session +
// 3 s, as a waiter node of the next incarnation, killed in turn, can be
// queued ahead of the rivals and hold the key until its own session
// ends, and so on). The history must show no overlap within validity, fences
// increasing, no live write rejected and no lost update, and both
// instances must grant after the last kill. The run is
// suite.RunProxyKilledRepeatedly.
func TestProxyKilledRepeatedly(t *testing.T) {
	// Parallel: it leaves the ensemble alone (a root and instances of
	// its own). Parallel tests start once every serial one has ended, so
	// never beside those that stop, kill or cut off servers.
	t.Parallel()
	const (
		sessMS = 3000
		ttlMS  = 2000
		waitMS = 4000
	)
	root := newRoot(t)
	env := fmt.Sprintf("LOCKPROXY_ZOOKEEPER_SESSION_TIMEOUT=%dms", sessMS)
	a := startInstance(t, zkServers(), root, env) // killed and restarted
	b := startInstance(t, zkServers(), root, env)
	suite.RunProxyKilledRepeatedly(t, suite.ProxyKillRepeated{
		Backend: "ZooKeeper",
		Client:  lc,
		A:       a.addr, B: b.addr, ProcA: a.proc, ProcB: b.proc,
		RestartA: func() *harness.Proc {
			a.start(t)
			return a.proc
		},
		TTLMS: ttlMS, WaitMS: waitMS,
		RivalBound: 4*sessMS*time.Millisecond + 3*time.Second,
		BoundNote:  fmt.Sprintf("session %d ms", sessMS),
	})
}
