package redis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/backends/redis"
)

// TestRefusedSetNXKeepsSameValueHold: a transparent SET NX (NoReentry)
// whose value is that of the key's current holder is refused by every
// node. Two refusals decide it (ErrNotAcquired); n2's refusal comes later
// (a slow link). The failed attempt's roll-back must not reach n2 as a
// release of that value: it would delete the holder's hold there, which
// the attempt never made, and the holder would be left on a bare
// majority (two such refusals, heard in another order, leave it on a
// minority, and another client is granted the key within its validity).
func TestRefusedSetNXKeepsSameValueHold(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delay time.Duration // n2's link, both ways
	}{
		{"n2 answers 40 ms late", 20 * time.Millisecond},
		{"n2 answers 120 ms late", 60 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, rs, _, p := backendWithN2Link(t, redis.DefaultUser)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			const key = "same-value"
			const ttl = 10 * time.Second // node timeout 250 ms
			redis.WarmUp(ctx, t, b, rs, key, ttl)
			if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "v", TTL: ttl, NoReentry: true}); err != nil {
				t.Fatalf("SET %s v NX = %v; want a grant", key, err)
			}
			c2 := rs[2].Client(t)
			for i := 0; c2.Get(ctx, "lp:lock:"+key).Val() != "v"; i++ {
				if i == 200 {
					t.Fatal("n2 has not the holder's key 2 s after its grant")
				}
				time.Sleep(10 * time.Millisecond)
			}
			p.SetLatency(tc.delay, 0)
			_, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "v", TTL: ttl, NoReentry: true})
			if !errors.Is(err, backends.ErrNotAcquired) {
				t.Fatalf("second SET %s v NX = %v; want not acquired", key, err)
			}
			// Whatever the roll-back does on n2 is done once its link has
			// carried it there and back.
			time.Sleep(2*tc.delay + 300*time.Millisecond)
			p.PassThrough()
			for i, r := range rs {
				if v := r.Client(t).Get(ctx, "lp:lock:"+key).Val(); v != "v" {
					t.Errorf("n%d's lock key = %q after the refused SET NX; want the holder's %q", i, v, "v")
				}
			}
		})
	}
}
