package transparent

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestScriptAcquisitionWithoutTTLRefused: tSet refuses a SET on a lock key
// without PX/EX ("a lock key without a TTL would never expire") and caps
// PEXPIRE at locks.max_ttl (the restart quarantine counts on no lock
// outliving it). A script that acquires a lock key without a TTL must not
// stand either, nor may the line-up after it (syncHoldsScript's PERSIST
// branch) make the key's lockf, which may name an earlier holder, persist.
func TestScriptAcquisitionWithoutTTLRefused(t *testing.T) {
	e := start(t)
	c := e.client(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)
	const key = "lock:no-ttl"
	// An earlier holder leaves its fence record behind.
	if ok, err := c.SetNX(ctx, key, "old", 5*time.Second).Result(); err != nil || !ok {
		t.Fatalf("SET NX PX = %v, %v", ok, err)
	}
	if err := c.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	for _, script := range []string{
		`return redis.call("set", KEYS[1], ARGV[1], "NX")`,
	} {
		reply, err := c.Eval(ctx, script, []string{key}, "forever").Result()
		if n := e.holding(t, key, "forever"); n > 0 {
			t.Errorf("script SET without PX = %v, %v: held on %d of 3 nodes; want refused and rolled back", reply, err, n)
			for i, d := range e.direct {
				v, _ := d.Get(ctx, keyPrefix+"lock:"+key).Result()
				p, _ := d.PTTL(ctx, keyPrefix+"lock:"+key).Result()
				f, _ := d.Get(ctx, keyPrefix+"lockf:"+key).Result()
				pf, _ := d.PTTL(ctx, keyPrefix+"lockf:"+key).Result()
				t.Logf("node %d: lock key %q PTTL %v; lockf %q PTTL %v", i, v, p, f, pf)
			}
		}
	}
}
