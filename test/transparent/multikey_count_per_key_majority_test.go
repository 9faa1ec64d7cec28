package transparent

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestMultiKeyExistsAndDelCountPerKeyMajority: EXISTS and DEL with several
// lock keys must count the keys held on a majority, as a single Redis
// counts the keys it has. A RedLock grant that reached only 2 of 3 nodes is
// a valid grant, so two locks held on different majorities (lock:ma on
// nodes 1 and 2, lock:mb on nodes 1 and 3, lock:mc on node 1 only, a
// rolled-back leftover) are an ordinary state. Agreeing on the per-node
// totals instead answers 1 (shared by nodes 2 and 3) for EXISTS lock:ma
// lock:mb, where both locks are held, and "no majority" for EXISTS lock:ma
// lock:mc, where the nodes' totals 2, 1, 0 all differ though the answer
// (1: lock:ma is held, lock:mc is not) is well defined.
func TestMultiKeyExistsAndDelCountPerKeyMajority(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := e.client(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)

	place := func(key string, nodes ...int) {
		for _, i := range nodes {
			if err := e.direct[i].Set(ctx, keyPrefix+"lock:"+key, "tok-"+key, 20*time.Second).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	place("lock:ma", 0, 1)
	place("lock:mb", 0, 2)
	place("lock:mc", 0)

	for _, k := range []string{"lock:ma", "lock:mb"} {
		if v, err := c.Get(ctx, k).Result(); err != nil || v != "tok-"+k {
			t.Fatalf("GET %s = %q, %v; want it held", k, v, err)
		}
	}
	if n, err := c.Exists(ctx, "lock:ma", "lock:mb").Result(); err != nil || n != 2 {
		t.Errorf("EXISTS lock:ma lock:mb = %d, %v; want 2 (each is held on a majority)", n, err)
	}
	if n, err := c.Exists(ctx, "lock:ma", "lock:mc").Result(); err != nil || n != 1 {
		t.Errorf("EXISTS lock:ma lock:mc = %d, %v; want 1 (lock:ma held, lock:mc on one node only)", n, err)
	}
	if n, err := c.Del(ctx, "lock:ma", "lock:mb").Result(); err != nil || n != 2 {
		t.Errorf("DEL lock:ma lock:mb = %d, %v; want 2 (two held locks released)", n, err)
	}
}
