package e2e

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// Tests of what happens to locks around a connection's (and the server's)
// end: grants that land after the client left, liveness while a command
// blocks, shutdown, and a downgrade's KEEPALIVE read hold.

// TestWaitGrantAfterDisconnect: a client sends LOCK … WAIT and goes away
// while its attempt is on the nodes (the nodes are paused for a moment, so
// the attempt is in flight when the disconnect is seen). The grant that
// lands afterwards goes to nobody: it must be released, not left held for
// its TTL ("A waiting client that disconnects leaves the queue at once").
func TestWaitGrantAfterDisconnect(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []string
	}{
		{"PX", []string{"PX", "20000"}},
		{"PX with TOKEN", []string{"PX", "20000", "TOKEN", "mytoken"}},
		{"KEEPALIVE", []string{"PX", "20000", "KEEPALIVE"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := startCluster(t, 3)
			in := startInstance(t, cl.addrs())
			key := "gone-" + lockclient.RandID()
			// Warm up the node connections (PX 2000: a node timeout of 100 ms,
			// which a loaded host meets).
			warm := lc.DialRaw(t, in.addr)
			if r := warm.Do("LOCK", "warm-"+key, "PX", "2000"); r.Null || r.Kind == '-' {
				t.Fatalf("warm-up LOCK = %v", r)
			}

			for _, nd := range cl.nodes {
				nd.Pause()
			}
			waiter := lc.DialRaw(t, in.addr)
			waiter.Send(append([]string{"LOCK", key}, append(tc.opts, "WAIT", "5000")...)...)
			time.Sleep(40 * time.Millisecond) // the attempt is queued on the paused nodes
			_ = waiter.Conn.Close()
			time.Sleep(40 * time.Millisecond) // lockproxy sees the close (session canceled)
			for _, nd := range cl.nodes {
				nd.Resume()
			}

			// Released within 1.5 s: far below the 20 s TTL.
			var held []string
			for deadline := time.Now().Add(1500 * time.Millisecond); ; time.Sleep(50 * time.Millisecond) {
				held = held[:0]
				for i := range cl.nodes {
					if v, ok := cl.lockValue(t, i, key); ok {
						pttl := cl.clients[i].PTTL(lockclient.CtxFor(t, 2*time.Second), keyPrefix+"lock:"+key).Val()
						held = append(held, fmt.Sprintf("node %d: %q pttl %v", i, v, pttl))
					}
				}
				if len(held) == 0 || time.Now().After(deadline) {
					break
				}
			}
			if len(held) > 0 {
				t.Errorf("1.5 s after the waiter disconnected, its grant is still held: %v; want it released", held)
			}
			// And a new client gets the key at once.
			other := lc.DialRaw(t, in.addr)
			if r := other.Do("LOCK", key, "PX", "1000"); r.Null || r.Kind == '-' {
				t.Errorf("LOCK by another client after the waiter left = %v; want a grant", r)
			}
		})
	}
}

// TestShutdownCancelsLongWait: a LOCK … WAIT longer than
// limits.shutdown_timeout is canceled when the drain time runs out; its
// client is answered with the error lockproxy has for that ("-ERR command
// canceled: connection closing or server shutting down"), not a bare EOF:
// a client must be able to tell a refusal from a network fault.
func TestShutdownCancelsLongWait(t *testing.T) {
	cl := startCluster(t, 3)
	in := startInstanceEnv(t, cl.addrs(), []string{"LOCKPROXY_LIMITS_SHUTDOWN_TIMEOUT=1s"})
	key := "sd-wait-" + lockclient.RandID()
	holder := lc.DialRaw(t, in.addr)
	rawGrant(t, holder, key, "PX", "30000")
	waiter := lc.DialRaw(t, in.addr)
	waiter.Send("LOCK", key, "PX", "10000", "WAIT", "20000")
	// The waiter is waiting (INFO's blocked_clients) before SIGTERM: a
	// LOCK not yet read then is not canceled but never run, its
	// connection closed.
	waitBlocked(t, lc.NewClient(t, in.addr, 2), 1)
	start := time.Now()
	if err := in.proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	r, err := waiter.ReadWithin(10 * time.Second)
	took := time.Since(start)
	if err != nil || r.Kind != '-' || !strings.Contains(r.Str, "canceled") {
		t.Errorf("the waiter's reply %v after SIGTERM = %v, %v; want -ERR command canceled …", took, r, err)
	}
	if code, err := in.proc.Wait(10 * time.Second); err != nil || code != 0 {
		t.Errorf("exit = %d, %v; want 0", code, err)
	}
}

// TestShutdownReleasesDelayedKeepalive: "On shutdown lockproxy releases
// every keepalive lock" (README, Lost locks). A KEEPALIVE lock on a key
// with a lock-delay rule is no exception: its holder did not lose it, the
// server went away, and a lock-delay would keep the key from everyone for
// nothing.
func TestShutdownReleasesDelayedKeepalive(t *testing.T) {
	cl := startCluster(t, 3)
	in := startInstanceEnv(t, cl.addrs(), []string{"LOCKPROXY_LOCKS_LOCK_DELAY=delayed:*=20s"})
	key := "delayed:" + lockclient.RandID()
	holder := lc.DialRaw(t, in.addr)
	tok := rawGrant(t, holder, key, "PX", "30000", "KEEPALIVE")
	if err := in.proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	if code, err := in.proc.Wait(10 * time.Second); err != nil || code != 0 {
		t.Fatalf("exit = %d, %v; want 0", code, err)
	}
	if n := cl.holders(t, key, tok); n > 0 {
		pttl := cl.clients[0].PTTL(lockclient.CtxFor(t, 2*time.Second), keyPrefix+"lock:"+key).Val()
		t.Errorf("after SIGTERM and exit the keepalive lock is still held on %d nodes (pttl %v); want it released", n, pttl)
	}
}

// TestKeepaliveAliveDuringRelayedBlockingCommand: "Alive means the
// connection sent a command … within locks.keepalive_idle, or is running
// one" (README). A KEEPALIVE holder blocked in a relayed BLPOP or XREAD
// BLOCK (upstream mode) is running one: its lock must be kept, as it is
// during LOCK … WAIT, and no lock-lost push may come.
func TestKeepaliveAliveDuringRelayedBlockingCommand(t *testing.T) {
	for _, tc := range []struct {
		name string
		cmd  []string
	}{
		{"relayed BLPOP", []string{"BLPOP", "nolist", "2"}},
		{"relayed XREAD BLOCK", []string{"XREAD", "BLOCK", "2000", "STREAMS", "nostream", "$"}},
		{"LOCK … WAIT (control)", []string{"LOCK", "other-held", "PX", "5000", "WAIT", "2000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := startCluster(t, 3)
			up := harness.StartRedis(t, harness.RedisOptions{})
			in := startInstanceEnv(t, cl.addrs(), []string{
				"LOCKPROXY_UPSTREAM_ADDRESS=" + up.Addr, "LOCKPROXY_LOCKS_KEEPALIVE_IDLE=500ms",
				slowHostNodeTimeout})
			other := lc.DialRaw(t, in.addr)
			rawGrant(t, other, "other-held", "PX", "30000")
			holder := lc.DialRaw(t, in.addr)
			if r := holder.Do("HELLO", "3"); r.Kind != '%' {
				t.Fatalf("HELLO 3 = %v", r)
			}
			key := "busy-" + lockclient.RandID()
			tok := rawGrant(t, holder, key, "PX", "600", "KEEPALIVE")
			holder.Send(tc.cmd...)
			time.Sleep(1600 * time.Millisecond) // the idle window (500 ms) and a lease (600 ms) pass while it blocks
			if n := cl.holders(t, key, tok); n < 2 {
				t.Errorf("while %v blocks, the KEEPALIVE lock is held on %d of 3 nodes; want it kept", tc.cmd, n)
			}
			r, err := holder.ReadWithin(5 * time.Second)
			if err == nil && r.Kind == '>' {
				t.Errorf("push %v while %v blocked; want none", r, tc.cmd)
			}
		})
	}
}

// TestUnlockOfWriteHoldKeepsKeepaliveReadHold: a client holds a write lock
// and downgrades (RLOCK with its own token), one of the two holds with
// KEEPALIVE, then UNLOCKs once, which releases the write hold (README:
// "UNLOCK releases the write hold first"). It never sent RENEW. The read
// hold must keep other writers out for the whole read validity RLOCK
// answered ("the read hold keeps others' writes out for its whole
// lease, also when it outlives the write lease"), and a KEEPALIVE read
// hold for as long as the connection lives: the UNLOCK of the write hold
// must not stop the read hold's watchdog.
func TestUnlockOfWriteHoldKeepsKeepaliveReadHold(t *testing.T) {
	cl := startCluster(t, 3)
	inA := startSemInstance(t, cl)
	inB := startSemInstance(t, cl)
	for _, tc := range []struct {
		name        string
		lock, rlock []any
		after       time.Duration // wait after the UNLOCK, then try a writer
	}{
		// The watchdog renews both holds with the write TTL (600 ms), and
		// the read hold must keep its own 10 s lease once the UNLOCK
		// stops it (backends/redis's extend script).
		{"KEEPALIVE write, long read", []any{"PX", 600, "KEEPALIVE"}, []any{"PX", 10000}, 900 * time.Millisecond},
		// The UNLOCK releases the write hold, which the read hold's
		// watchdog does not count: the watchdog must go on.
		{"long write, KEEPALIVE read", []any{"PX", 10000}, []any{"PX", 600, "KEEPALIVE"}, 1500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			one := lc
			one.PoolSize = 1 // the KEEPALIVE and the UNLOCK on one connection
			a := one.NewClient(t, inA.addr, 3)
			b := lc.NewClient(t, inB.addr, 3)
			key := "dg-ka-" + lockclient.RandID()
			tok := "a-" + lockclient.RandID()

			lc.MustLock(t, a, key, append(tc.lock, "TOKEN", tok)...)
			r := lc.MustRLock(t, a, key, append(tc.rlock, "TOKEN", tok)...)
			readGranted := time.Now()
			time.Sleep(400 * time.Millisecond) // the watchdog renews (every 200 ms)
			if got := lc.Unlock(t, a, key, tok); got != 1 {
				t.Fatalf("UNLOCK of the write hold = %d; want 1", got)
			}
			time.Sleep(tc.after)
			if g, ok := lc.Lock(t, b, key, "PX", 5000); ok {
				t.Errorf("writer granted (fence %d) through the other instance %v after the read grant (validity %d ms, %v), while a's connection is open",
					g.Fence, time.Since(readGranted).Round(time.Millisecond), r.ValidityMS, tc.rlock)
			}
		})
	}
}
