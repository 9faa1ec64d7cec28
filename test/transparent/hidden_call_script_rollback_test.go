package transparent

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestScriptWithHiddenCallRolledBackOnMinority: a script that reaches
// redis.call by an index (redis['c' .. 'all']) was taken for one that
// cannot acquire and run as a plain EVAL per node: its SET NX on the one
// node where the key was free stayed there, a lock of one node that no
// one holds, while the client was told 0. It gets the acquisition rule,
// which rolls the minority's write back.
func TestScriptWithHiddenCallRolledBackOnMinority(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := e.client(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)
	for _, i := range []int{1, 2} {
		if err := e.direct[i].Set(ctx, keyPrefix+"lock:lock:hidden", "other", 10*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
	}
	script := `local f = redis['c' .. 'all'] if f('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end return 0`
	n, err := c.Eval(ctx, script, []string{"lock:hidden"}, "mine", 10000).Int64()
	if err != nil || n != 0 {
		t.Fatalf("script acquisition with the key held on 2 of 3 nodes = %d, %v; want 0", n, err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for e.holding(t, "lock:hidden", "mine") != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the script's write on the node where the key was free is still there; want it rolled back")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
