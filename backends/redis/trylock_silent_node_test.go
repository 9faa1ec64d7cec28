package redis

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestRefusedLockWithSilentNodeAnswersAtOnce: a LOCK without WAIT on a
// held key, while one node of three is silent (paused: connections open,
// nothing comes back), is answered nil as soon as the two healthy nodes
// refused it when its token is lockproxy's own (no TOKEN: OwnToken), and
// its roll-back still reaches the silent node once it runs again. Before,
// the refusal heard the silent node out and waited for its roll-back
// there: about two node timeouts (500 ms each here) for a nil that two
// nodes had already decided. With transparent mode's SET NX value as the
// token (NoReentry, not OwnToken) the attempt is still heard out: that
// value may hold the key elsewhere, its attempt has no mark to scope a
// roll-back to, and a roll-back not waited for could reach a node after a
// later request of the same value. (A LOCK with TOKEN is answered as
// promptly: TestRefusedTokenLockWithSilentNodeAnswersAtOnce.)
func TestRefusedLockWithSilentNodeAnswersAtOnce(t *testing.T) {
	const (
		ttl     = 10 * time.Second
		timeout = 500 * time.Millisecond // the node timeout at this TTL
		// bound: well under one node timeout, on a shared, loaded host.
		bound = 250 * time.Millisecond
	)
	for _, own := range []bool{true, false} {
		t.Run(fmt.Sprintf("own token %v", own), func(t *testing.T) {
			b, rs := newRealBackend(t, 3, nodeTimeouts(timeout))
			ctx := ctxTimeout(t, 30*time.Second)
			const key = "try-silent"
			WarmUp(ctx, t, b, rs, "ts-warm", ttl)
			lockOrFatal(t, b, backends.LockRequest{Key: key, Token: "A", TTL: ttl})
			c2 := rs[2].Client(t)
			waitFor(t, "the hold on the third node", func() bool { return c2.Get(ctx, "lp:lock:"+key).Val() == "A" })
			// Free on the third node only: B's attempt is refused by the
			// other two, and granted there once it runs again, so its
			// roll-back has something to remove.
			if err := c2.Del(ctx, "lp:lock:"+key).Err(); err != nil {
				t.Fatal(err)
			}
			rs[2].Pause()
			t.Cleanup(rs[2].Resume)
			start := time.Now()
			_, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "B", TTL: ttl, NoReentry: true, OwnToken: own})
			took := time.Since(start)
			if !errors.Is(err, backends.ErrNotAcquired) {
				t.Fatalf("LOCK = %v after %v; want not acquired", err, took)
			}
			t.Logf("answered after %v", took.Round(100*time.Microsecond))
			if own && took > bound {
				t.Errorf("LOCK answered nil after %v; want within %v", took.Round(time.Millisecond), bound)
			}
			if !own && took < timeout {
				t.Errorf("LOCK with the client's token answered after %v; want the silent node heard out (%v at least)", took, timeout)
			}
			rs[2].Resume()
			staysGone(t, fmt.Sprintf("B's hold of %q gone from the third node", key), 2*timeout, func() string {
				if v := c2.Get(ctx, "lp:lock:"+key).Val(); v == "B" {
					return "held by B"
				}
				return ""
			})
		})
	}
}
