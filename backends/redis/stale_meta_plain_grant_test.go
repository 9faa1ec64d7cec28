package redis

import (
	"strconv"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
)

// TestStaleMetaIgnoredByPlainGrant: TestStaleMetaIgnored for a grant made
// by the plain SET NX PX and HINCRBY (NoReentry: a LOCK without TOKEN),
// which leaves lockm as it finds it. A lockm of another token (left by an
// earlier hold) must count as none: not as extra holds of the new holder,
// whose one release must then free the key.
func TestStaleMetaIgnoredByPlainGrant(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 10*time.Second)
	direct.Set(ctx, "lp:lockm:k", "3,r,old", time.Minute)
	g, err := n.Acquire(ctx, quorum.Request{Key: "k", Token: "new", TTL: time.Minute, NoReentry: true})
	if err != nil || !g.Acquired || g.Holds != 1 {
		t.Fatalf("grant: %+v, %v", g, err)
	}
	want := strconv.FormatUint(g.Fence, 10) + ",new"
	waitFor(t, "the fence write", func() bool { return direct.Get(ctx, "lp:lockf:k").Val() == want })
	if got := direct.Get(ctx, "lp:lockm:k").Val(); got != "3,r,old" {
		t.Fatalf("lockm %q; want the old hold's, left by the plain grant", got)
	}
	st, err := n.LockState(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if got := describeState(st); got != "w:new:1" {
		t.Errorf("state %q; want w:new:1 (not the old hold's extra holds)", got)
	}
	if ok, err := n.Release(ctx, "k", "new", quorum.AnyHold); !ok || err != nil {
		t.Fatalf("release: %v, %v", ok, err)
	}
	if direct.Exists(ctx, "lp:lock:k").Val() != 0 {
		t.Errorf("lock key left after the single hold's release")
	}
	if ok, err := n.Release(ctx, "k", "new", quorum.AnyHold); ok || err != nil {
		t.Errorf("second release: %v, %v; want false (no hold left)", ok, err)
	}
}
