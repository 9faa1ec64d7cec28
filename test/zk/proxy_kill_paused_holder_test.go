package zk

import (
	"fmt"
	"testing"
	"time"

	gozk "github.com/go-zookeeper/zk"

	"github.com/lockproxy/lockproxy/test/suite"
)

// TestProxyKilledWhileHolding is the fault matrix's "lockproxy kill -9"
// row on ZooKeeper, judged by test/fault's checker: clients of two
// instances loop LOCK → fenced-ledger read-modify-write → UNLOCK over a
// few keys while, on instance A, a PX holder and a KEEPALIVE holder hold
// keys of their own and a LOCK … WAIT is queued (a grant in flight) behind
// a holder on instance B; a client of B waits for each of those keys. A is
// then SIGKILLed (by PID). A's holders keep acting on the validity they
// were told (each writes at 90 % of it); B's holder of the queued key
// releases it. The locks of the dead instance live in its session, so B's
// rivals must get them no sooner than the holders' validity and, as the
// README documents, about one session timeout after the kill (asserted
// generously: within 2 × the session + 3 s). The history must show no
// overlap within validity, fences increasing, no live write rejected and
// no lost update. The run is suite.RunProxyKilledWhileHolding.
func TestProxyKilledWhileHolding(t *testing.T) {
	// Parallel: it leaves the ensemble alone (a root and instances of
	// its own). Parallel tests start once every serial one has ended, so
	// never beside those that stop, kill or cut off servers.
	t.Parallel()
	const (
		sessMS = 3000
		ttlMS  = 2000
		waitMS = 4000
		// holdMS: the PX holder's lease, longer than the session, so its
		// validity is the session's.
		holdMS     = 8000
		rivalBound = 2*sessMS*time.Millisecond + 3*time.Second
	)
	root := newRoot(t)
	env := fmt.Sprintf("LOCKPROXY_ZOOKEEPER_SESSION_TIMEOUT=%dms", sessMS)
	a := startInstance(t, zkServers(), root, env) // killed
	b := startInstance(t, zkServers(), root, env) // serves the rivals
	zc := zkConn(t)
	suite.RunProxyKilledWhileHolding(t, suite.ProxyKill{
		Client: lc,
		A:      a.addr, B: b.addr, ProcA: a.proc,
		TTLMS: ttlMS, WaitMS: waitMS, HoldMS: holdMS,
		// A key's holder and each waiter have a lock node.
		WaitQueued: func(key string, waiters int) {
			waitLockNodes(t, zc, root, key, waiters+1)
		},
		PXHolderBound:        rivalBound,
		KeepaliveHolderBound: rivalBound,
		WaiterBound:          rivalBound,
		BoundNote:            fmt.Sprintf("session %d ms", sessMS),
	})
}

// TestPausedHolderFenced: a holder on instance A stops past its validity
// (Kleppmann's GC pause: its goroutine sleeps past the deadline it was
// told, then waits until the rival is done) while a client of instance B
// takes the lock and does its read-modify-write; then the stale holder
// writes. The fenced ledger must refuse the stale write; the same writes
// to an unfenced ledger (the negative control) are all accepted and lose
// the rival's update, so the test fails if the fence is not what saved
// the update. The rounds are suite.RunPausedHolderFenced.
func TestPausedHolderFenced(t *testing.T) {
	// Not parallel: its first round's PX 300 lock must be granted within
	// its 300 ms, which a test beside it on the loaded host made it miss.
	root := newRoot(t)
	ins := []*instance{startInstance(t, zkServers(), root), startInstance(t, zkServers(), root)}
	suite.RunPausedHolderFenced(t, lc, ins[0].addr, ins[1].addr)
}

// waitLockNodes waits up to 10 s for key to have n lock nodes under root.
func waitLockNodes(t *testing.T, c *gozk.Conn, root, key string, n int) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); lockNodes(t, c, root, key) != n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%s: %d lock nodes after 10 s; want %d", key, lockNodes(t, c, root, key), n)
		}
	}
}
