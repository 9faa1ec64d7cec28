package e2e

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestWaitHandOverWithSilentNode: through the lockproxy binary with its
// default node timeouts (5 % of PX 10000, capped at node_timeout_max's
// 250 ms), a LOCK … WAIT without TOKEN on the holder's instance is
// granted soon after the holder's UNLOCK is answered, also while one node
// of three is silent (SIGSTOP: its connections stay open and nothing
// comes back, as behind a blackholed link): the two others are a
// majority. Before, the waiter's refused attempt heard out the silent
// node and waited for its roll-back there, and the grant came about two
// node timeouts after the attempt began (400 ms after the UNLOCK here).
// A waiter that names its TOKEN is granted as soon: its refused attempt's
// roll-back to the silent node is scoped to that attempt (before, it still
// heard the silent node out).
func TestWaitHandOverWithSilentNode(t *testing.T) {
	// bound is well under the 250 ms node timeout, for a shared host.
	const bound = 150 * time.Millisecond
	for _, tc := range []struct{ silent, token bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		name := "all nodes answer"
		if tc.silent {
			name = "one node silent"
		}
		if tc.token {
			name += ", TOKEN"
		}
		t.Run(name, func(t *testing.T) {
			cl := startCluster(t, 3)
			in := startInstance(t, cl.addrs())
			c := lc.NewClient(t, in.addr, 2)
			key := "handover-" + lockclient.RandID()
			g := cl.lockOnAllNodes(t, c, key, "PX", 10000)
			if tc.silent {
				cl.nodes[2].Pause()
				t.Cleanup(cl.nodes[2].Resume)
			}
			waiter := lc.DialRaw(t, in.addr)
			args := []string{"LOCK", key, "PX", "10000", "WAIT", "5000"}
			if tc.token {
				args = append(args, "TOKEN", "waiter-"+lockclient.RandID())
			}
			waiter.Send(args...)
			// The waiter's first attempt is refused and, with a silent
			// node, still waits for it.
			time.Sleep(100 * time.Millisecond)
			if got := lc.Unlock(t, c, key, g.Token); got != 1 {
				t.Fatalf("the holder's UNLOCK = %d; want 1", got)
			}
			unlocked := time.Now()
			r, err := waiter.ReadWithin(10 * time.Second)
			lag := time.Since(unlocked)
			if err != nil || r.Null || r.Kind == '-' {
				t.Fatalf("LOCK … WAIT 5000 = %v, %v after the UNLOCK; want a grant", r, err)
			}
			t.Logf("granted %v after the UNLOCK's answer", lag.Round(100*time.Microsecond))
			if lag > bound {
				t.Errorf("LOCK … WAIT 5000 granted %v after the UNLOCK's answer; want within %v", lag.Round(time.Millisecond), bound)
			}
		})
	}
}
