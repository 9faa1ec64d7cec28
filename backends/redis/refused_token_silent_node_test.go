package redis

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestRefusedTokenLockWithSilentNodeAnswersAtOnce: a LOCK … TOKEN without
// WAIT on a held key, while one node of three is silent, is answered nil
// as soon as the two healthy nodes refused it, and a refused upgrade (the
// token holds the key for reading) its error as soon; the roll-back sent
// to the silent node, scoped to the attempt, still removes the hold the
// attempt made there once it runs again (the key was free there). Before,
// both heard the silent node out and waited for the roll-back there:
// about two node timeouts.
func TestRefusedTokenLockWithSilentNodeAnswersAtOnce(t *testing.T) {
	const (
		ttl     = 10 * time.Second
		timeout = 500 * time.Millisecond
		bound   = 250 * time.Millisecond
	)
	for _, upgrade := range []bool{false, true} {
		t.Run(fmt.Sprint("upgrade=", upgrade), func(t *testing.T) {
			b, rs := newRealBackend(t, 3, nodeTimeouts(timeout))
			ctx := ctxTimeout(t, 30*time.Second)
			const key = "try-token-silent"
			WarmUp(ctx, t, b, rs, "tts-warm", ttl)
			want := backends.ErrNotAcquired
			if upgrade {
				// A and B read; B's LOCK is an upgrade, refused.
				lockOrFatal(t, b, backends.LockRequest{Key: key, Token: "A", TTL: ttl, Mode: backends.Read})
				lockOrFatal(t, b, backends.LockRequest{Key: key, Token: "B", TTL: ttl, Mode: backends.Read})
				want = backends.ErrUpgrade
			} else {
				lockOrFatal(t, b, backends.LockRequest{Key: key, Token: "A", TTL: ttl})
			}
			c2 := rs[2].Client(t)
			if !upgrade {
				waitFor(t, "the hold on the third node", func() bool { return c2.Get(ctx, "lp:lock:"+key).Val() == "A" })
				// Free on the third node only: granted there once it
				// runs again, so the roll-back has something to remove.
				if err := c2.Del(ctx, "lp:lock:"+key).Err(); err != nil {
					t.Fatal(err)
				}
			} else {
				waitFor(t, "B's read hold on the third node", func() bool { return c2.ZScore(ctx, "lp:lockr:"+key, "B").Err() == nil })
			}
			rs[2].Pause()
			t.Cleanup(rs[2].Resume)
			start := time.Now()
			_, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "B", TTL: ttl})
			took := time.Since(start)
			if !errors.Is(err, want) {
				t.Fatalf("LOCK … TOKEN = %v after %v; want %v", err, took, want)
			}
			t.Logf("answered after %v", took.Round(100*time.Microsecond))
			if took > bound {
				t.Errorf("LOCK … TOKEN answered after %v; want within %v", took.Round(time.Millisecond), bound)
			}
			rs[2].Resume()
			if upgrade {
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

// NewBackendOn is newBackendOn, with every node timeout set to timeout
// (nodeTimeouts), for the tests outside the package.
func NewBackendOn(t *testing.T, rs []*harness.Redis, timeout time.Duration, tune ...func(*Config)) *Backend {
	t.Helper()
	return newBackendOn(t, rs, append([]func(*Config){nodeTimeouts(timeout)}, tune...)...)
}
