package e2e

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// PROTOCOL.md, reentrancy: LOCK with the TOKEN of the current exclusive
// holder adds one hold and refreshes the TTL, returning the same fence;
// each UNLOCK removes one hold; the lock is free at zero. Hold counts live
// on the nodes, so this works across lockproxy instances and restarts.

// TestReentrantLock takes the same lock three times with one token, through
// one instance and through two instances sharing the nodes, and gives the
// holds back one by one.
func TestReentrantLock(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		instances int
	}{
		{"one instance", 1},
		{"two instances", 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cl := startCluster(t, 3)
			var clients []lockclient.Doer
			for i := 0; i < tc.instances; i++ {
				in := startSemInstance(t, cl)
				clients = append(clients, lc.NewClient(t, in.addr, 2))
			}
			// via(i) is the client of hold i: they alternate between the
			// instances.
			via := func(i int) lockclient.Doer { return clients[i%len(clients)] }
			other := lc.NewClient(t, startSemInstance(t, cl).addr, 3)
			key := "reentrant-" + lockclient.RandID()
			tok := "reentrant-token-" + lockclient.RandID()
			const ttl = 4000

			first := cl.lockOnAllNodes(t, via(0), key, "PX", ttl, "TOKEN", tok)
			checkGrant(t, "first hold", first, ttl)
			for hold := 2; hold <= 3; hold++ {
				// Let the lease run down a little, so that the refresh shows.
				time.Sleep(400 * time.Millisecond)
				before := cl.nodePTTLs(t, key)
				g := lc.MustLock(t, via(hold-1), key, "PX", ttl, "TOKEN", tok)
				after := cl.nodePTTLs(t, key)
				checkGrant(t, "reentrant hold", g, ttl)
				if g.Token != tok || g.Fence != first.Fence {
					t.Errorf("hold %d: token %q fence %d; want the same token %q and fence %d", hold, g.Token, g.Fence, tok, first.Fence)
				}
				// A majority's lease was reset to the full TTL: above what
				// it was just before, and above what is left of it.
				if !majorityAbove(after, maxInt64(before)) || !majorityAbove(after, ttl-400) {
					t.Errorf("hold %d: lock key PTTL on the nodes %v before, %v after; want a majority refreshed to about %d ms",
						hold, before, after, ttl)
				}
				li := mustLockInfo(t, via(hold), key, tok)
				if h, ok := li.holder(tok); li.Mode != "write" || len(li.Holders) != 1 || !ok || h.Holds != int64(hold) || li.Fence != first.Fence {
					t.Errorf("hold %d: LOCKINFO = %+v; want mode write, one holder %q with %d holds, fence %d", hold, li, tok, hold, first.Fence)
				}
				lc.Refused(t, other, "LOCK", key, "PX", ttl)
				lc.Refused(t, other, "RLOCK", key, "PX", ttl)
			}

			// Each UNLOCK removes one hold; the lock stays held until the last.
			for left := 2; left >= 0; left-- {
				if got := lc.Unlock(t, via(left+1), key, tok); got != 1 {
					t.Fatalf("UNLOCK with %d holds left after it = %d; want 1", left, got)
				}
				li, held := lockInfoOf(t, other, key, tok)
				switch {
				case left > 0 && (!held || len(li.Holders) != 1 || li.Holders[0].Holds != int64(left)):
					t.Errorf("after an UNLOCK, LOCKINFO = %+v (held %v); want %d holds left", li, held, left)
				case left > 0:
					lc.Refused(t, other, "LOCK", key, "PX", ttl)
				case held:
					t.Errorf("after the last UNLOCK, LOCKINFO = %+v; want nil (free)", li)
				}
			}
			if got := lc.Unlock(t, via(0), key, tok); got != 0 {
				t.Errorf("UNLOCK after the last hold = %d; want 0", got)
			}
			for i := range cl.nodes {
				if v, ok := cl.lockValue(t, i, key); ok {
					t.Errorf("node %d: lock key holds %q after the last UNLOCK", i, v)
				}
			}
			next := lc.MustLock(t, other, key, "PX", ttl)
			if next.Fence <= first.Fence {
				t.Errorf("next holder's fence %d; want > %d", next.Fence, first.Fence)
			}
			if got := lc.Unlock(t, other, key, next.Token); got != 1 {
				t.Errorf("UNLOCK by the next holder = %d; want 1", got)
			}
		})
	}
}

// TestReentrantAcrossRestart: a hold taken through an instance that is then
// stopped (SIGTERM) counts for the holds taken through its successor: the
// hold count is on the nodes.
func TestReentrantAcrossRestart(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	key := "reentrant-restart-" + lockclient.RandID()
	tok := "restart-token-" + lockclient.RandID()
	const ttl = 20000

	in1 := startSemInstance(t, cl)
	first := cl.lockOnAllNodes(t, lc.NewClient(t, in1.addr, 2), key, "PX", ttl, "TOKEN", tok)
	if err := in1.proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM lockproxy: %v", err)
	}
	if code, err := in1.proc.Wait(15 * time.Second); err != nil || code != 0 {
		t.Fatalf("lockproxy after SIGTERM: exit %d, %v\n%s", code, err, in1.proc.Output())
	}

	in2 := startSemInstance(t, cl)
	c := lc.NewClient(t, in2.addr, 3)
	other := lc.NewClient(t, in2.addr, 2)
	g := lc.MustLock(t, c, key, "PX", ttl, "TOKEN", tok)
	if g.Fence != first.Fence {
		t.Errorf("hold after the restart: fence %d; want %d, the first hold's", g.Fence, first.Fence)
	}
	if li := mustLockInfo(t, c, key, tok); len(li.Holders) != 1 || li.Holders[0].Holds != 2 {
		t.Errorf("LOCKINFO after the restart = %+v; want one holder with 2 holds", li)
	}
	for left := 1; left >= 0; left-- {
		if got := lc.Unlock(t, c, key, tok); got != 1 {
			t.Fatalf("UNLOCK (%d holds left after it) = %d; want 1", left, got)
		}
		if left > 0 {
			lc.Refused(t, other, "LOCK", key, "PX", ttl)
		}
	}
	if li, held := lockInfoOf(t, c, key, ""); held {
		t.Errorf("LOCKINFO after the last UNLOCK = %+v; want nil", li)
	}
	next := lc.MustLock(t, other, key, "PX", ttl)
	if next.Fence <= first.Fence {
		t.Errorf("next holder's fence %d; want > %d", next.Fence, first.Fence)
	}
}

func maxInt64(xs []int64) int64 {
	m := xs[0]
	for _, x := range xs[1:] {
		m = max(m, x)
	}
	return m
}

// TestReentrantFenceWhenANodeMissedTheFirstHold: the first hold is
// granted by nodes 1 and 2 while node 0 refuses it (a key set there by
// hand); contenders' refused attempts then raise node 0's fence counter
// (node 0 grants them, the others refuse, node 0 rolls back).
//
//   - All nodes answer the reentrant LOCK: nodes 1 and 2 (a majority) join
//     the hold, so it keeps the hold's fence, as PROTOCOL.md says, and node
//     0, which grants afresh, is set to that fence too.
//   - Node 1 lost the hold (its key deleted): only node 2 joins the hold,
//     and nodes 0 and 1 grant afresh. The hold is then on no majority, so
//     another holder could have been granted the key on nodes 0 and 1
//     meanwhile; the grant must be a new one, with a fence above every
//     counter it saw (returning the old fence could put it below such a
//     holder's). (Were node 1 paused instead, it might hold it still, on a
//     majority with node 2: that attempt is undecided, backends/redis
//     TestReentryOnMinorityWithFailedNodesKeepsHold.)
func TestReentrantFenceWhenANodeMissedTheFirstHold(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		drop     bool // node 1 loses the hold before the reentrant LOCK
		wantSame bool
	}{
		{"majority joins the hold", false, true},
		{"hold on a minority only", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cl := startCluster(t, 3)
			in := startSemInstance(t, cl)
			c := lc.NewClient(t, in.addr, 2)
			key := "reentrant-minority-" + lockclient.RandID()
			tok := "holder-" + lockclient.RandID()
			lockKey := keyPrefix + "lock:" + key

			if err := cl.clients[0].Set(lockclient.CtxFor(t, 5*time.Second), lockKey, "blocker", 10*time.Second).Err(); err != nil {
				t.Fatalf("node 0: SET blocker: %v", err)
			}
			first := lc.MustLock(t, c, key, "PX", 20000, "TOKEN", tok)
			if v, _ := cl.lockValue(t, 0, key); v != "blocker" {
				t.Fatalf("node 0 has %q; want the blocker (the first hold must miss node 0)", v)
			}
			if n := cl.holders(t, key, tok); n != 2 {
				t.Fatalf("the first hold is on %d nodes; want nodes 1 and 2", n)
			}
			if err := cl.clients[0].Del(lockclient.CtxFor(t, 5*time.Second), lockKey).Err(); err != nil {
				t.Fatalf("node 0: DEL blocker: %v", err)
			}
			for i := 0; i < 3; i++ {
				lc.Refused(t, c, "LOCK", key, "PX", 5000)
			}

			if tc.drop {
				if err := cl.clients[1].Del(lockclient.CtxFor(t, 5*time.Second), lockKey).Err(); err != nil {
					t.Fatalf("node 1: DEL the hold: %v", err)
				}
			}
			again, ok, err := lockclient.TryAcquire(lockclient.CtxFor(t, 20*time.Second), c, "LOCK", key, "PX", 20000, "TOKEN", tok)
			if err != nil || !ok {
				t.Fatalf("reentrant LOCK = %+v, %v, %v; want a grant", again, ok, err)
			}
			switch {
			case tc.wantSame && again.Fence != first.Fence:
				t.Errorf("reentrant LOCK returned fence %d; want %d, the fence of the hold it joins", again.Fence, first.Fence)
			case !tc.wantSame && again.Fence <= first.Fence:
				t.Errorf("reentrant LOCK with the hold on a minority returned fence %d; want a new one above %d", again.Fence, first.Fence)
			}
			t.Logf("first fence %d, reentrant fence %d", first.Fence, again.Fence)
			if tc.wantSame {
				if n := cl.holders(t, key, tok); n != 3 {
					t.Errorf("the hold is on %d nodes after the reentrant LOCK; want all 3", n)
				}
				for i := 0; i < 2; i++ {
					if got := lc.Unlock(t, c, key, tok); got != 1 {
						t.Errorf("UNLOCK %d = %d; want 1", i+1, got)
					}
				}
			} else {
				// The nodes disagree on the hold count (node 2: two, the
				// others one): UNLOCK until the lock is gone.
				for i := 0; lc.Unlock(t, c, key, tok) == 1; i++ {
					if i == 3 {
						t.Fatal("still held after 3 UNLOCKs")
					}
				}
				for i := range cl.nodes {
					_ = cl.clients[i].Del(lockclient.CtxFor(t, 5*time.Second), lockKey, keyPrefix+"lockh:"+key).Err()
				}
			}
			if got := lc.Unlock(t, c, key, tok); got != 0 {
				t.Errorf("UNLOCK after the last hold = %d; want 0", got)
			}
			next := lc.MustLock(t, c, key, "PX", 5000)
			if next.Fence <= max(first.Fence, again.Fence) {
				t.Errorf("next holder's fence %d; want > %d", next.Fence, max(first.Fence, again.Fence))
			}
		})
	}
}

// TestReentrantKeepalive: the watchdog of a KEEPALIVE lock counts holds:
// after one UNLOCK of two it keeps renewing the last hold while the
// connection talks, and the connection's close releases it.
func TestReentrantKeepalive(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	in := startSemInstance(t, cl)
	c := lc.NewClient(t, in.addr, 3)
	key := "reentrant-keepalive-" + lockclient.RandID()
	tok := "ka-" + lockclient.RandID()
	const ttl = 600

	rc := lc.DialRaw(t, in.addr)
	for i := 0; i < 2; i++ {
		rawGrant(t, rc, key, "PX", fmt.Sprint(ttl), "KEEPALIVE", "TOKEN", tok)
	}
	if r := rc.Do("UNLOCK", key, tok); r.Kind != ':' || r.Int != 1 {
		t.Fatalf("first UNLOCK = %v; want :1", r)
	}
	for end := time.Now().Add(4 * ttl * time.Millisecond); time.Now().Before(end); {
		if p := rc.Do("PING"); p.Str != "PONG" {
			t.Fatalf("PING = %v", p)
		}
		time.Sleep(100 * time.Millisecond)
	}
	li, held := lockInfoOf(t, c, key, tok)
	if !held || len(li.Holders) != 1 || li.Holders[0].Holds != 1 {
		t.Fatalf("LOCKINFO four leases after one UNLOCK of two keepalive holds = %+v (held %v); want the last hold kept alive", li, held)
	}
	lc.Refused(t, c, "LOCK", key, "PX", 5000)
	_ = rc.Conn.Close()
	if err := eventually(200, 25*time.Millisecond, func() error {
		if li, held := lockInfoOf(t, c, key, ""); held {
			return fmt.Errorf("LOCKINFO after the holder's connection closed = %+v; want nil", li)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	lc.MustLock(t, c, key, "PX", 5000)
}

// TestKeepaliveSharedToken: two connections take the same KEEPALIVE lock
// with one token (a client's pool). When the first closes, only its hold is
// released: the lock stays held, renewed for the second, past several
// leases; the second's close releases it.
func TestKeepaliveSharedToken(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	in := startSemInstance(t, cl)
	c := lc.NewClient(t, in.addr, 3)
	key := "shared-keepalive-" + lockclient.RandID()
	tok := "ka-" + lockclient.RandID()
	const ttl = 600

	first, second := lc.DialRaw(t, in.addr), lc.DialRaw(t, in.addr)
	rawGrant(t, first, key, "PX", fmt.Sprint(ttl), "KEEPALIVE", "TOKEN", tok)
	rawGrant(t, second, key, "PX", fmt.Sprint(ttl), "KEEPALIVE", "TOKEN", tok)
	_ = first.Conn.Close()
	if err := eventually(200, 25*time.Millisecond, func() error {
		if li, held := lockInfoOf(t, c, key, tok); !held || len(li.Holders) != 1 || li.Holders[0].Holds != 1 {
			return fmt.Errorf("LOCKINFO after the first connection closed = %+v (held %v); want one hold left", li, held)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(4 * ttl * time.Millisecond); time.Now().Before(end); {
		if p := second.Do("PING"); p.Str != "PONG" {
			t.Fatalf("PING = %v", p)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if li, held := lockInfoOf(t, c, key, tok); !held || li.Holders[0].Holds != 1 {
		t.Fatalf("LOCKINFO four leases on = %+v (held %v); want the second connection's hold kept alive", li, held)
	}
	lc.Refused(t, c, "LOCK", key, "PX", 5000)
	_ = second.Conn.Close()
	if err := eventually(200, 25*time.Millisecond, func() error {
		if li, held := lockInfoOf(t, c, key, ""); held {
			return fmt.Errorf("LOCKINFO after both closed = %+v; want nil", li)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
