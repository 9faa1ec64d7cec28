package postgres

import (
	"fmt"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/suite"
)

// TestProxyKilledRepeatedly is the fault matrix's repeated "lockproxy
// kill -9" row on PostgreSQL, judged by test/fault's checker: clients of
// two instances on one database loop LOCK … PX … WAIT (half with
// KEEPALIVE, half holding to 50–90 % of their validity) → fenced-ledger
// read-modify-write → UNLOCK over a few keys while instance A is
// SIGKILLed at random points and started again on the same address, five
// times. A dead incarnation's locks are rows that end with their lease on
// the database's clock, so a key a client of A held goes to another
// client once its lease ends, or sooner when its holder's UNLOCK reaches
// the next incarnation (asserted generously: within the TTL + 3 s of the
// kill). The history must show no overlap within validity, fences
// increasing, no live write rejected and no lost update, and both
// instances must grant after the last kill. The run is
// suite.RunProxyKilledRepeatedly.
func TestProxyKilledRepeatedly(t *testing.T) {
	// Mostly waiting on leases, on tables of its own: it runs beside the
	// package's other long tests (see Makefile: make test's last slot).
	t.Parallel()
	const (
		ttlMS  = 2000
		waitMS = 3000
	)
	a := startInstance(t, shared.DSN(), newPrefix()) // killed and restarted
	b := startInstance(t, shared.DSN(), a.prefix)
	suite.RunProxyKilledRepeatedly(t, suite.ProxyKillRepeated{
		Backend: "PostgreSQL",
		Client:  lc,
		A:       a.addr, B: b.addr, ProcA: a.proc, ProcB: b.proc,
		RestartA: func() *harness.Proc {
			a.start(t)
			return a.proc
		},
		TTLMS: ttlMS, WaitMS: waitMS,
		RivalBound: ttlMS*time.Millisecond + 3*time.Second,
		BoundNote:  fmt.Sprintf("lease %d ms", ttlMS),
	})
}
