package redis

import (
	"fmt"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
)

// TestFreshGrantMetaExpiresWithLock: every way a write hold is made afresh
// (the plain SET NX PX and its fence write, a marked acquire, the acquire
// script's own grant, with and without a mark) and every script that
// stores a hold's fence afterwards (raiseFenceScript, owedFenceScript)
// gives lockf, and lockm where it writes one, an expiry no later than the
// lock key's: a meta key must not outlive its hold.
func TestFreshGrantMetaExpiresWithLock(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 10*time.Second)
	const ttl = 10 * time.Second
	for _, tc := range []struct {
		name string
		// grant makes a's hold on key, with its fence stored.
		grant func(t *testing.T, key string, keys []string, sl uint16)
		lockm bool // the grant writes lockm
		// late: lockf is written after the grant, by a command of its
		// own with the lease's PX, so it may end a little after the
		// lock key, never after the lease from its write.
		late bool
	}{
		{"plain grant", func(t *testing.T, key string, keys []string, sl uint16) {
			g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: "a", TTL: ttl, NoReentry: true})
			if err != nil || !g.Acquired {
				t.Fatalf("grant = %+v, %v", g, err)
			}
			want := fmt.Sprintf("%d,a", g.Fence)
			waitFor(t, "the fence write", func() bool { return direct.Get(ctx, keys[keyFence]).Val() == want })
		}, false, true},
		{"marked grant", func(t *testing.T, key string, keys []string, sl uint16) {
			g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: "a", TTL: ttl})
			if err != nil || !g.Acquired {
				t.Fatalf("grant = %+v, %v", g, err)
			}
		}, true, false},
		{"acquire script", func(t *testing.T, key string, keys []string, sl uint16) {
			if err := direct.Eval(ctx, acquireScript, keys, "a", ttl.Milliseconds(), sl, 0, readMarker, 0, 100).Err(); err != nil {
				t.Fatal(err)
			}
		}, false, false},
		{"acquire script with a mark", func(t *testing.T, key string, keys []string, sl uint16) {
			if err := direct.Eval(ctx, acquireScript, keys, "a", ttl.Milliseconds(), sl, 0, readMarker, 0, 100, "attempt-1").Err(); err != nil {
				t.Fatal(err)
			}
		}, true, false},
		{"raise fence script", func(t *testing.T, key string, keys []string, sl uint16) {
			if err := direct.Set(ctx, keys[keyLock], "a", ttl).Err(); err != nil {
				t.Fatal(err)
			}
			if err := direct.Eval(ctx, raiseFenceScript, []string{keys[keyLock], keys[keyFenceHash], keys[keyFence], keys[keyReaders]},
				"a", sl, 7, "").Err(); err != nil {
				t.Fatal(err)
			}
		}, false, false},
		{"owed fence script", func(t *testing.T, key string, keys []string, sl uint16) {
			if err := direct.Set(ctx, keys[keyLock], "a", ttl).Err(); err != nil {
				t.Fatal(err)
			}
			if err := direct.Eval(ctx, owedFenceScript, []string{keys[keyLock], keys[keyFenceHash], keys[keyFence]}, "a", sl, 7).Err(); err != nil {
				t.Fatal(err)
			}
		}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "fresh-meta-" + tc.name
			sl := slot(key)
			keys := n.lockKeys(n.LockKey(key), key, numLockKeys)
			tc.grant(t, key, keys, sl)
			lock := direct.PTTL(ctx, keys[keyLock]).Val()
			if lock <= 0 {
				t.Fatalf("lock key PTTL %v; want the grant's lease", lock)
			}
			metas := []int{keyFence}
			if tc.lockm {
				metas = append(metas, keyHolds)
			}
			// Reads a few ms apart: a meta key set in the same call as
			// the lock key may read a ms longer.
			bound := lock + 50*time.Millisecond
			if tc.late {
				bound = ttl
			}
			for _, k := range metas {
				if got := direct.PTTL(ctx, keys[k]).Val(); got <= 0 || got > bound {
					t.Errorf("%s PTTL %v; want it to end with the lock key's (%v)", keys[k], got, lock)
				}
			}
		})
	}
}
