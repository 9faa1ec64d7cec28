package e2e

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestClientUnblockOfLockWait: go-redis's ClientUnblock and
// ClientUnblockWithError end a LOCK … WAIT of another connection as they
// end a BLPOP on Redis: they return 1, and the LOCK returns at once, nil
// (redis.Nil) or the UNBLOCKED error. The unblocked LOCK holds nothing on
// any node once the holder it waited for unlocks.
func TestClientUnblockOfLockWait(t *testing.T) {
	cl := startCluster(t, 3)
	up := harness.StartRedis(t, harness.RedisOptions{})
	addr := startInstance(t, cl.addrs(), "--upstream", up.Addr).addr
	c := lc.NewClient(t, addr, 3)
	for _, tc := range []struct {
		name    string
		unblock func(id int64) *redis.IntCmd
		want    error
	}{
		{"ClientUnblock", func(id int64) *redis.IntCmd { return c.ClientUnblock(lockclient.CtxFor(t, 5*time.Second), id) }, redis.Nil},
		{"ClientUnblockWithError", func(id int64) *redis.IntCmd {
			return c.ClientUnblockWithError(lockclient.CtxFor(t, 5*time.Second), id)
		}, errors.New("UNBLOCKED client unblocked via CLIENT UNBLOCK")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "unblock-" + lockclient.RandID()
			g := cl.lockOnAllNodes(t, c, key, "PX", 10000)
			waiter := c.Conn()
			defer waiter.Close()
			id, err := waiter.ClientID(lockclient.CtxFor(t, 5*time.Second)).Result()
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				done <- waiter.Do(lockclient.CtxFor(t, 15*time.Second), "LOCK", key, "PX", 10000, "WAIT", 8000).Err()
			}()
			time.Sleep(300 * time.Millisecond) // the LOCK waits by now
			start := time.Now()
			if n, err := tc.unblock(id).Result(); err != nil || n != 1 {
				t.Errorf("%s(%d) = %d, %v; want 1", tc.name, id, n, err)
			}
			select {
			case err := <-done:
				if err == nil || err.Error() != tc.want.Error() {
					t.Errorf("LOCK … WAIT 8000 after %s = %v after %v; want %v", tc.name, err, time.Since(start).Round(time.Millisecond), tc.want)
				}
			case <-time.After(2 * time.Second):
				t.Fatalf("LOCK … WAIT 8000 still waits 2 s after %s", tc.name)
			}
			if got := lc.Unlock(t, c, key, g.Token); got != 1 {
				t.Fatalf("the holder's UNLOCK = %d", got)
			}
			if err := eventually(20, 50*time.Millisecond, func() error {
				for i := range cl.nodes {
					if v, ok := cl.lockValue(t, i, key); ok {
						return errors.New("node " + cl.nodes[i].Addr + " still holds " + key + " for " + v)
					}
				}
				return nil
			}); err != nil {
				t.Error(err)
			}
		})
	}
}
