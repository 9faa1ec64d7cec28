package redis

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestWaitEndsOnTimeWithSilentNode: a LOCK … WAIT whose attempt is still
// running when its WAIT ends, because a node does not answer (paused:
// its connections stay open and nothing comes back, as behind a
// blackholed link), is answered nil at the WAIT's end (or when its client
// goes away), not when the attempt's hear-out and roll-back are over, and
// the attempt still leaves nothing behind: its roll-back goes out, and a
// grant it makes after the WAIT ended is given back. Before, the answer
// came when the attempt ended, about two node timeouts (500 ms each here)
// after it started (one after the client left), or was a grant told after
// the WAIT had run out.
func TestWaitEndsOnTimeWithSilentNode(t *testing.T) {
	const (
		ttl     = 10 * time.Second // node timeout: 5 %, 500 ms
		timeout = 500 * time.Millisecond
		wait    = 100 * time.Millisecond
		// slack is what the answer may come after the WAIT's end: far
		// below the node timeout that a late answer costs.
		slack = 250 * time.Millisecond
	)
	tests := []struct {
		name string
		// setup holds key as the case needs, with the third node's help
		// if it needs it, and returns the nodes to pause for the WAIT.
		setup func(ctx context.Context, t *testing.T, b *Backend, rs []*harness.Redis, key string) (paused []int)
		// resumeAfter, if set, resumes the paused nodes that long after
		// the LOCK was sent: after the WAIT's end, within the node
		// timeout, so that the attempt is granted late.
		resumeAfter time.Duration
		// goneAfter, if set, cancels the LOCK's context that long after
		// it was sent (its client went away, CLIENT UNBLOCK), within a
		// WAIT of a minute: it is answered then.
		goneAfter time.Duration
	}{
		{"held on a majority, the third node silent", func(ctx context.Context, t *testing.T, b *Backend, _ []*harness.Redis, key string) []int {
			lockOrFatal(t, b, backends.LockRequest{Key: key, Token: "A", TTL: time.Minute})
			return []int{2}
		}, 0, 0},
		{"granted on one node, refused on one, the third silent: rolled back", func(ctx context.Context, t *testing.T, b *Backend, rs []*harness.Redis, key string) []int {
			lockOrFatal(t, b, backends.LockRequest{Key: key, Token: "A", TTL: time.Minute})
			if err := rs[0].Client(t).Del(ctx, "lp:lock:"+key).Err(); err != nil {
				t.Fatal(err)
			}
			return []int{2}
		}, 0, 0},
		{"free, two nodes silent until after the WAIT: the late grant given back", func(ctx context.Context, t *testing.T, b *Backend, _ []*harness.Redis, _ string) []int {
			// Connected to every node first: a connection made while
			// its node is paused fails its set-up instead.
			l := lockOrFatal(t, b, backends.LockRequest{Key: "warm-up", Token: "W", TTL: time.Minute})
			if ok, err := b.Unlock(ctx, "warm-up", l.Token); !ok || err != nil {
				t.Fatalf("UNLOCK warm-up = %v, %v; want released", ok, err)
			}
			return []int{1, 2}
		}, 150 * time.Millisecond, 0},
		{"held on a majority, the third node silent, the client gone", func(ctx context.Context, t *testing.T, b *Backend, _ []*harness.Redis, key string) []int {
			lockOrFatal(t, b, backends.LockRequest{Key: key, Token: "A", TTL: time.Minute})
			return []int{2}
		}, 0, wait},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, rs := newRealBackend(t, 3, func(c *Config) { c.Quorum.TimeoutMax = timeout })
			ctx := ctxTimeout(t, 30*time.Second)
			key := "silent"
			paused := tc.setup(ctx, t, b, rs, key)
			for _, i := range paused {
				rs[i].Pause()
			}
			resume := func() {
				for _, i := range paused {
					rs[i].Resume()
				}
			}
			t.Cleanup(resume)
			if tc.resumeAfter > 0 {
				time.AfterFunc(tc.resumeAfter, resume)
			}
			lockCtx, w := ctx, wait
			if tc.goneAfter > 0 {
				var gone context.CancelFunc
				lockCtx, gone = context.WithCancel(ctx)
				defer gone()
				time.AfterFunc(tc.goneAfter, gone)
				w = time.Minute
			}
			start := time.Now()
			_, err := b.Lock(lockCtx, backends.LockRequest{Key: key, Token: "B", TTL: ttl, Wait: w})
			took := time.Since(start)
			if !errors.Is(err, backends.ErrNotAcquired) {
				t.Fatalf("LOCK %q WAIT %v = %v after %v; want not acquired", key, w, err, took)
			}
			if took > wait+slack {
				t.Fatalf("LOCK %q WAIT %v answered after %v; want within %v of %v", key, w, took, slack, wait)
			}
			resume()
			// B's grants on the nodes are rolled back or given back
			// within the node timeouts, and stay gone once the attempt
			// is over (a node that answers late answers within them).
			bOn := func() []int {
				var on []int
				for i, r := range rs {
					if r.Client(t).Get(ctx, "lp:lock:"+key).Val() == "B" {
						on = append(on, i)
					}
				}
				return on
			}
			waitFor(t, "B's holds gone from every node", func() bool { return len(bOn()) == 0 })
			for end := time.Now().Add(2 * timeout); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
				if on := bOn(); len(on) > 0 {
					t.Fatalf("B holds %q on nodes %v %v after its LOCK answered nil", key, on, time.Since(start).Round(time.Millisecond))
				}
			}
			if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "C", TTL: ttl}); err != nil && tc.resumeAfter > 0 {
				t.Fatalf("LOCK %q after B's late grant was given back = %v; want a grant", key, err)
			}
		})
	}
}
