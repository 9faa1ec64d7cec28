package redis

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
)

// TestNoReentryRefusesOwnToken: an acquire that refuses reentry (SET NX's
// rule: a transparent SET NX, a LOCK without TOKEN) is refused where its
// own token holds the key, also when it will wait (WriterWait, which
// takes it past the plain SET NX to acquireScript): it must not add a
// hold, or one release would leave the key held for a hold nobody knows
// of.
func TestNoReentryRefusesOwnToken(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 10*time.Second)
	for _, wait := range []time.Duration{0, time.Second} {
		key := "noreentry-" + wait.String()
		req := quorum.Request{Key: key, Token: "a", TTL: 10 * time.Second, NoReentry: true, WriterWait: wait}
		if g, err := n.Acquire(ctx, req); err != nil || !g.Acquired {
			t.Fatalf("wait %v: grant = %+v, %v", wait, g, err)
		}
		if g, err := n.Acquire(ctx, req); err != nil || g.Acquired {
			t.Errorf("wait %v: second SET NX of the holder's token = %+v, %v; want it refused", wait, g, err)
		}
		st, err := n.LockState(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if got := describeState(st); got != "w:a:1" {
			t.Errorf("wait %v: state %q; want w:a:1", wait, got)
		}
		if ok, err := n.Release(ctx, key, "a", quorum.AnyHold); !ok || err != nil {
			t.Fatalf("wait %v: release = %v, %v", wait, ok, err)
		}
		if direct.Exists(ctx, "lp:lock:"+key).Val() != 0 {
			t.Errorf("wait %v: lock key left after the one hold's release", wait)
		}
	}
}
