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
// refused it, and its roll-back still reaches the silent node once it runs
// again: when its token is lockproxy's own (no TOKEN: OwnToken), and with
// TOKEN, whose roll-back there is scoped to the attempt; a refused upgrade
// with TOKEN (the token holds the key for reading) answers its error as
// soon and keeps the token's read hold. Before, the refusal heard the
// silent node out and waited for its roll-back there: about two node
// timeouts (500 ms each here) for an answer two nodes had already decided.
// With transparent mode's SET NX value as the token (NoReentry, not
// OwnToken) the attempt is still heard out: that value may hold the key
// elsewhere, its attempt has no mark to scope a roll-back to, and a
// roll-back not waited for could reach a node after a later request of
// the same value.
func TestRefusedLockWithSilentNodeAnswersAtOnce(t *testing.T) {
	const (
		ttl     = 10 * time.Second
		timeout = 500 * time.Millisecond // the node timeout at this TTL
		// bound: well under one node timeout, on a shared, loaded host.
		bound = 250 * time.Millisecond
	)
	for _, tc := range []struct {
		name    string
		req     backends.LockRequest // B's LOCK, Key and TTL aside
		upgrade bool                 // A and B read first: B's LOCK is an upgrade
		prompt  bool                 // answered within bound, else heard out
	}{
		{"own token", backends.LockRequest{Token: "B", NoReentry: true, OwnToken: true}, false, true},
		{"client's value (SET NX)", backends.LockRequest{Token: "B", NoReentry: true}, false, false},
		{"TOKEN", backends.LockRequest{Token: "B"}, false, true},
		{"TOKEN, upgrade", backends.LockRequest{Token: "B"}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, rs := newRealBackend(t, 3, nodeTimeouts(timeout))
			ctx := ctxTimeout(t, 30*time.Second)
			const key = "try-silent"
			WarmUp(ctx, t, b, rs, "ts-warm", ttl)
			want := backends.ErrNotAcquired
			c2 := rs[2].Client(t)
			if tc.upgrade {
				lockOrFatal(t, b, backends.LockRequest{Key: key, Token: "A", TTL: ttl, Mode: backends.Read})
				lockOrFatal(t, b, backends.LockRequest{Key: key, Token: "B", TTL: ttl, Mode: backends.Read})
				want = backends.ErrUpgrade
				waitFor(t, "B's read hold on the third node", func() bool { return c2.ZScore(ctx, "lp:lockr:"+key, "B").Err() == nil })
			} else {
				lockOrFatal(t, b, backends.LockRequest{Key: key, Token: "A", TTL: ttl})
				waitFor(t, "the hold on the third node", func() bool { return c2.Get(ctx, "lp:lock:"+key).Val() == "A" })
				// Free on the third node only: B's attempt is refused by
				// the other two, and granted there once it runs again, so
				// its roll-back has something to remove.
				if err := c2.Del(ctx, "lp:lock:"+key).Err(); err != nil {
					t.Fatal(err)
				}
			}
			rs[2].Pause()
			t.Cleanup(rs[2].Resume)
			req := tc.req
			req.Key, req.TTL = key, ttl
			start := time.Now()
			_, err := b.Lock(ctx, req)
			took := time.Since(start)
			if !errors.Is(err, want) {
				t.Fatalf("LOCK = %v after %v; want %v", err, took, want)
			}
			t.Logf("answered after %v", took.Round(100*time.Microsecond))
			if tc.prompt && took > bound {
				t.Errorf("LOCK answered after %v; want within %v", took.Round(time.Millisecond), bound)
			}
			if !tc.prompt && took < timeout {
				t.Errorf("LOCK with the client's token answered after %v; want the silent node heard out (%v at least)", took, timeout)
			}
			rs[2].Resume()
			if tc.upgrade {
				// The third node refused the upgrade too: B's read hold
				// is kept there.
				waitFor(t, "the third node answering", func() bool { return c2.Ping(ctx).Err() == nil })
				for end := time.Now().Add(2 * timeout); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
					if c2.ZScore(ctx, "lp:lockr:"+key, "B").Err() != nil {
						t.Fatal("B's read hold gone from the third node")
					}
				}
				return
			}
			staysGone(t, fmt.Sprintf("B's hold of %q gone from the third node", key), 2*timeout, func() string {
				if v := c2.Get(ctx, "lp:lock:"+key).Val(); v == "B" {
					return "held by B"
				}
				return ""
			})
		})
	}
}
