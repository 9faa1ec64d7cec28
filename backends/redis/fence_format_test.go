package redis

import (
	"fmt"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
)

// TestLargeFenceStoredInDecimal: a node's grant, and every script that
// stores a write hold's fence in lockf (acquireScript's and
// acquireMarkedScript's fresh grants, raiseFenceScript, owedFenceScript),
// writes it as a decimal integer also
// from 10^14 on, so that the hold's fence reads back (LOCKINFO, a
// reentrant grant). Before, the scripts concatenated the Lua number,
// which Redis's Lua formats with %.14g: lockf held "1e+14,a", which
// fenceOf reads as no fence (0).
func TestLargeFenceStoredInDecimal(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 10*time.Second)
	const big = 100_000_000_000_000 // 10^14: the first fence %.14g writes with an exponent
	for _, tc := range []struct {
		name string
		// store runs the script that stores a's fence, big, for key.
		store func(key string, keys []string, sl uint16) error
	}{
		{"node grant", func(key string, keys []string, sl uint16) error {
			g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: "a", TTL: 10 * time.Second})
			if err == nil && !g.Acquired {
				err = fmt.Errorf("not granted: %+v", g)
			}
			return err
		}},
		{"acquire script", func(key string, keys []string, sl uint16) error {
			return direct.Eval(ctx, acquireScript, keys, "a", 10000, sl, 0, readMarker, 0, 100).Err()
		}},
		{"marked acquire script", func(key string, keys []string, sl uint16) error {
			return direct.Eval(ctx, acquireMarkedScript, []string{keys[keyLock], keys[keyFence], keys[keyHolds], keys[keyWriterWaits], keys[keyFenceHash]},
				"a", 10000, sl, "attempt-1", "0").Err()
		}},
		{"raise fence script", func(key string, keys []string, sl uint16) error {
			if err := direct.Set(ctx, keys[keyLock], "a", 10*time.Second).Err(); err != nil {
				return err
			}
			return direct.Eval(ctx, raiseFenceScript, []string{keys[keyLock], keys[keyFenceHash], keys[keyFence], keys[keyReaders]},
				"a", sl, big, "").Err()
		}},
		{"owed fence script", func(key string, keys []string, sl uint16) error {
			if err := direct.Set(ctx, keys[keyLock], "a", 10*time.Second).Err(); err != nil {
				return err
			}
			return direct.Eval(ctx, owedFenceScript, []string{keys[keyLock], keys[keyFenceHash], keys[keyFence]}, "a", sl, big).Err()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "big-fence-" + tc.name
			sl := slot(key)
			// The slot's counter is one below: a fresh grant takes big.
			if err := direct.HSet(ctx, "lp:fence", fmt.Sprint(sl), big-1).Err(); err != nil {
				t.Fatal(err)
			}
			if err := tc.store(key, n.lockKeys(n.LockKey(key), key, numLockKeys), sl); err != nil {
				t.Fatalf("script: %v", err)
			}
			if lf, want := direct.Get(ctx, "lp:lockf:"+key).Val(), fmt.Sprintf("%d,a", big); lf != want {
				t.Errorf("lockf %q; want %q", lf, want)
			}
			st, err := n.LockState(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if st.fence != big {
				t.Errorf("stored fence read back as %d; want %d", st.fence, big)
			}
			g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: "a", TTL: 10 * time.Second})
			if err != nil || !g.Acquired {
				t.Fatalf("reentrant grant = %+v, %v", g, err)
			}
			if g.Fence != big {
				t.Errorf("reentrant grant reports fence %d; want the hold's %d", g.Fence, big)
			}
		})
	}
}
