package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

func TestNodeFailures(t *testing.T) {
	t.Parallel()
	eachSize(t, func(t *testing.T, n int) {
		cl := startCluster(t, n)
		// The nodes come back empty below: with the restart quarantine a
		// majority of them would stay out for the max TTL (10 min), as
		// RedLock requires. This test is about reconnecting; restart_test.go
		// covers the quarantine.
		in := startInstanceEnv(t, cl.addrs(), []string{"LOCKPROXY_REDLOCK_QUARANTINE=false"})
		c := lc.NewClient(t, in.addr, 2)
		majority := n/2 + 1

		// One node down: a majority still grants, renews and releases.
		cl.nodes[0].Kill()
		for i := 0; i < 3; i++ {
			key := fmt.Sprintf("onedown-%d-%s", i, lockclient.RandID())
			start := time.Now()
			g := lc.MustLock(t, c, key, "PX", 10000)
			lockTook := time.Since(start)
			checkGrant(t, "LOCK with one node down", g, 10000)
			if got := lc.IntCmd(t, c, "RENEW", key, g.Token, "PX", 10000); got <= 0 {
				t.Errorf("RENEW with one node down = %d; want > 0", got)
			}
			start = time.Now()
			if got := lc.Unlock(t, c, key, g.Token); got != 1 {
				t.Errorf("UNLOCK with one node down = %d; want 1", got)
			}
			unlockTook := time.Since(start)
			t.Logf("one node down, round %d: LOCK took %v, UNLOCK took %v", i, lockTook, unlockTook)
			if lockTook > 2*time.Second || unlockTook > 2*time.Second {
				t.Errorf("with one node down LOCK took %v and UNLOCK %v; want < 2s each", lockTook, unlockTook)
			}
		}

		// A majority down: NOQUORUM naming the dead nodes, promptly.
		dead := cl.nodes[:majority]
		for _, nd := range dead[1:] {
			nd.Kill()
		}
		for i := 0; i < 3; i++ {
			key := "nomajority-" + lockclient.RandID()
			start := time.Now()
			g, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 10*time.Second), c, key, "PX", 10000)
			took := time.Since(start)
			if err == nil {
				t.Fatalf("LOCK %q with %d/%d nodes down = %+v, %v; want a NOQUORUM error", key, majority, n, g, ok)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "NOQUORUM") {
				t.Errorf("LOCK %q with %d/%d nodes down: error %q; want it to start with NOQUORUM", key, majority, n, msg)
			}
			for _, nd := range dead {
				if !strings.Contains(msg, nd.Addr) {
					t.Errorf("LOCK %q: error %q does not name the dead node %s", key, msg, nd.Addr)
				}
			}
			if took > 2*time.Second {
				t.Errorf("LOCK %q: NOQUORUM after %v; want < 2s", key, took)
			}
			if i == 0 {
				t.Logf("NOQUORUM reply after %v: %s", took, msg)
			}
			// UNLOCK and RENEW cannot decide either.
			for _, args := range [][]any{{"UNLOCK", key, "tok"}, {"RENEW", key, "tok", "PX", 10000}} {
				err := c.Do(lockclient.CtxFor(t, 10*time.Second), args...).Err()
				if err == nil || !strings.HasPrefix(err.Error(), "NOQUORUM") {
					t.Errorf("%v with a majority down: %v; want a NOQUORUM error", args, err)
				}
			}
		}

		// Back up (empty): LOCK works again, allowing for reconnects.
		for _, nd := range dead {
			nd.Restart()
		}
		key := "backup-" + lockclient.RandID()
		var g lockclient.Grant
		err := eventually(50, 100*time.Millisecond, func() error {
			var ok bool
			var err error
			g, ok, err = lockclient.TryLock(lockclient.CtxFor(t, 10*time.Second), c, key, "PX", 10000)
			if err == nil && !ok {
				return fmt.Errorf("LOCK %q = nil", key)
			}
			return err
		})
		if err != nil {
			t.Fatalf("LOCK after restarting the nodes never succeeded: %v", err)
		}
		checkGrant(t, "LOCK after restart", g, 10000)
		if got := lc.Unlock(t, c, key, g.Token); got != 1 {
			t.Errorf("UNLOCK after restart = %d; want 1", got)
		}

		// Within a few seconds every node takes part again (go-redis probes
		// a node whose dials kept failing about once a second).
		err = eventually(50, 100*time.Millisecond, func() error {
			key := "allback-" + lockclient.RandID()
			g, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 10*time.Second), c, key, "PX", 10000)
			if err != nil || !ok {
				return fmt.Errorf("LOCK %q = %v, %v", key, ok, err)
			}
			defer lc.Unlock(t, c, key, g.Token)
			for i := range cl.nodes {
				if v, ok := cl.lockValue(t, i, key); !ok || v != g.Token {
					return fmt.Errorf("node %d (%s): GET lock key = %q, %v; want %q", i, cl.nodes[i].Addr, v, ok, g.Token)
				}
			}
			return nil
		})
		if err != nil {
			t.Errorf("5 s after the restart a LOCK still misses a node: %v", err)
		}
	})
}

// A grant that only a minority of nodes made must be rolled back on those
// nodes before the reply: no key with the attempted token may stay behind.
func TestMinorityGrantLeavesNoKey(t *testing.T) {
	t.Parallel()
	const rounds = 100
	eachSize(t, func(t *testing.T, n int) {
		cl := startCluster(t, n)
		addr, _ := startProxy(t, cl.addrs())
		c := lc.NewClient(t, addr, 2)

		// Nodes [0, n/2) hold the key for someone else, node n/2 is dead,
		// the rest (a minority) grant.
		holders := n / 2
		down := holders
		cl.nodes[down].Kill()
		for round := 0; round < rounds; round++ {
			key := fmt.Sprintf("minority-%d-%s", round, lockclient.RandID())
			other := "other-holder-" + lockclient.RandID()
			for i := 0; i < holders; i++ {
				if err := cl.clients[i].Set(lockclient.CtxFor(t, 5*time.Second), keyPrefix+"lock:"+key, other, 60*time.Second).Err(); err != nil {
					t.Fatalf("node %d: SET: %v", i, err)
				}
			}
			tok := "attempt-" + lockclient.RandID()
			g, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 10*time.Second), c, key, "PX", 10000, "TOKEN", tok)
			switch {
			case ok:
				t.Fatalf("round %d: LOCK %q with %d holders of another token and 1 node down = %+v; want nil or NOQUORUM", round, key, holders, g)
			case err != nil && !strings.HasPrefix(err.Error(), "NOQUORUM"):
				t.Fatalf("round %d: LOCK %q: %v; want nil or NOQUORUM", round, key, err)
			}
			for i := holders + 1; i < n; i++ {
				if v, ok := cl.lockValue(t, i, key); ok {
					t.Errorf("round %d: node %d (%s) still has %slock:%s = %q after the failed LOCK (attempted token %q)",
						round, i, cl.nodes[i].Addr, keyPrefix, key, v, tok)
				}
			}
			for i := 0; i < holders; i++ {
				if v, ok := cl.lockValue(t, i, key); !ok || v != other {
					t.Errorf("round %d: node %d: the other holder's key = %q, %v; want %q untouched", round, i, v, ok, other)
				}
			}
			if t.Failed() {
				return
			}
		}
	})
}
