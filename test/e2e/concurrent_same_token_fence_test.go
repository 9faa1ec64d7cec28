package e2e

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestConcurrentSameTokenGrantsShareOneFence: PROTOCOL.md says a LOCK with
// the TOKEN of the current exclusive holder "adds one hold and refreshes the
// TTL, returning the same fence", and the README that several connections
// may hold one lock with one token (a client's pool). When the pool's
// connections LOCK a free key with the same TOKEN at the same moment, every
// one is granted (the lock ends with one hold per connection), so they all
// hold one lock and must all be told its one fence — the fence LOCKINFO
// shows for it. Before, the grants of one round came back with different
// fences (1, 1, 2; 3, 1, 3) while LOCKINFO showed the largest, so a holder
// told the smaller one has its writes refused by a fenced resource that
// already saw the other. The connections share one instance, which runs
// a token's overlapping attempts on a key one after another (quorum
// TestOverlappingSameTokenAttemptsRunInTurn); across instances the first
// grants may still differ (README, Reentrancy).
func TestConcurrentSameTokenGrantsShareOneFence(t *testing.T) {
	cl := startCluster(t, 3)
	addr, _ := startProxy(t, cl.addrs())
	const conns = 3
	clients := make([]lockclient.Doer, conns)
	for i := range clients {
		clients[i] = lc.NewClient(t, addr, 2)
	}
	for round := 0; round < 40; round++ {
		key := fmt.Sprintf("same-token-%d-%s", round, lockclient.RandID())
		grants := make([]lockclient.Grant, conns)
		oks := make([]bool, conns)
		errs := make([]error, conns)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range clients {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				<-start
				grants[i], oks[i], errs[i] = lockclient.TryLock(lockclient.CtxFor(t, 10*time.Second), clients[i], key,
					"PX", 10000, "TOKEN", "pool-token")
			}(i)
		}
		close(start)
		wg.Wait()
		for i := range grants {
			if errs[i] != nil {
				t.Fatalf("round %d: LOCK on connection %d: %v", round, i, errs[i])
			}
			if !oks[i] {
				t.Fatalf("round %d: LOCK %s TOKEN pool-token on connection %d: nil, though the token holds the key", round, key, i)
			}
		}
		info := clients[0].Do(lockclient.CtxFor(t, 10*time.Second), "LOCKINFO", key, "TOKEN", "pool-token")
		v, err := info.Result()
		if err != nil {
			t.Fatalf("round %d: LOCKINFO: %v", round, err)
		}
		arr, _ := v.([]any)
		var infoFence int64 = -1
		for j := 0; j+1 < len(arr); j += 2 {
			if arr[j] == "fence" {
				infoFence, _ = arr[j+1].(int64)
			}
		}
		for i, g := range grants {
			if g.Fence != infoFence {
				t.Fatalf("round %d: %d concurrent LOCK %s PX 10000 TOKEN pool-token were all granted (one lock, %d holds) "+
					"with fences %v; LOCKINFO shows fence %d; connection %d was told %d: a reentrant grant must return the hold's one fence",
					round, conns, key, conns, fences(grants), infoFence, i, g.Fence)
			}
		}
	}
}

func fences(gs []lockclient.Grant) []int64 {
	out := make([]int64, len(gs))
	for i, g := range gs {
		out[i] = g.Fence
	}
	return out
}
