package redis

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/quorum"
)

// TestRaiseReadFence: a read grant's raise (RaiseReadFence, and its async
// form) raises the slot's counter only while the token's read lease is
// live on the node and the key is held by readers or by the token (a
// downgrade), never lowers it, and stores nothing with the hold: a
// downgrade's lockf keeps the write hold's fence. RaiseFence stays the
// write grant's: a reader-only token cannot raise with it.
func TestRaiseReadFence(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 30*time.Second)
	acquire := func(t *testing.T, key, token string, mode quorum.Mode) quorum.NodeGrant {
		t.Helper()
		g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: token, TTL: 5 * time.Second, Mode: mode})
		if err != nil || !g.Acquired {
			t.Fatalf("Acquire(%q, %q, mode %d) = %+v, %v; want granted", key, token, mode, g, err)
		}
		return g
	}
	counter := func(t *testing.T, key string) uint64 {
		t.Helper()
		v, err := direct.HGet(ctx, "lp:fence", strconv.Itoa(int(slot(key)))).Uint64()
		if err != nil && err != goredis.Nil {
			t.Fatal(err)
		}
		return v
	}
	for _, async := range []bool{false, true} {
		raiseRead := func(key, token string, fence uint64) (bool, error) {
			if !async {
				return n.RaiseReadFence(ctx, key, token, fence)
			}
			type answer struct {
				ok  bool
				err error
			}
			ch := make(chan answer, 1)
			n.StartRaiseReadFence(ctx, key, token, fence, func(ok bool, err error) { ch <- answer{ok, err} })
			a := <-ch
			return a.ok, a.err
		}
		for _, tc := range []struct {
			name  string
			setup func(t *testing.T, key string) // leaves "r" to raise for
			by    string                         // the token raising
			delta int64                          // the fence raised to, relative to the counter
			want  bool
		}{
			{"live reader", func(t *testing.T, key string) { acquire(t, key, "r", quorum.Shared) }, "r", 100, true},
			{"reentrant reader", func(t *testing.T, key string) {
				acquire(t, key, "r", quorum.Shared)
				acquire(t, key, "r", quorum.Shared)
			}, "r", 100, true},
			{"below the counter: left alone", func(t *testing.T, key string) {
				acquire(t, key, "w", quorum.Exclusive)
				if ok, err := n.Release(ctx, key, "w", quorum.AnyHold); !ok || err != nil {
					t.Fatalf("Release = %v, %v", ok, err)
				}
				acquire(t, key, "r", quorum.Shared)
			}, "r", -1, true},
			{"another token", func(t *testing.T, key string) { acquire(t, key, "r", quorum.Shared) }, "x", 100, false},
			{"released reader", func(t *testing.T, key string) {
				acquire(t, key, "r", quorum.Shared)
				acquire(t, key, "o", quorum.Shared)
				if ok, err := n.Release(ctx, key, "r", quorum.ReadHold); !ok || err != nil {
					t.Fatalf("Release = %v, %v", ok, err)
				}
			}, "r", 100, false},
			{"reader whose lease ended", func(t *testing.T, key string) {
				acquire(t, key, "r", quorum.Shared)
				acquire(t, key, "o", quorum.Shared)
				// r's lease end in the past; o keeps the key.
				if err := direct.ZAdd(ctx, "lp:lockr:"+key, goredis.Z{Score: 1, Member: "r"}).Err(); err != nil {
					t.Fatal(err)
				}
			}, "r", 100, false},
			{"lock key gone, reader score left", func(t *testing.T, key string) {
				acquire(t, key, "r", quorum.Shared)
				if err := direct.Del(ctx, "lp:lock:"+key).Err(); err != nil {
					t.Fatal(err)
				}
			}, "r", 100, false},
			{"write hold only", func(t *testing.T, key string) { acquire(t, key, "r", quorum.Exclusive) }, "r", 100, false},
			{"downgrade", func(t *testing.T, key string) {
				acquire(t, key, "r", quorum.Exclusive)
				acquire(t, key, "r", quorum.Shared)
				if direct.Exists(ctx, "lp:lockf:"+key).Val() != 1 {
					t.Fatal("no lockf for the write hold: the check that a read raise leaves it has no teeth")
				}
			}, "r", 100, true},
		} {
			t.Run(fmt.Sprintf("async=%v/%s", async, tc.name), func(t *testing.T) {
				key := fmt.Sprintf("raise-read-%v-%s", async, tc.name)
				tc.setup(t, key)
				lockf := direct.Get(ctx, "lp:lockf:"+key).Val()
				before := counter(t, key)
				fence := uint64(int64(before) + tc.delta)
				ok, err := raiseRead(key, tc.by, fence)
				if err != nil || ok != tc.want {
					t.Fatalf("RaiseReadFence(%q, fence %d) = %v, %v; want %v", tc.by, fence, ok, err, tc.want)
				}
				want := before
				if tc.want {
					want = max(before, fence)
				}
				if got := counter(t, key); got != want {
					t.Errorf("counter after the raise = %d; want %d (was %d)", got, want, before)
				}
				if got := direct.Get(ctx, "lp:lockf:"+key).Val(); got != lockf {
					t.Errorf("lockf after a read raise = %q; want it untouched, %q", got, lockf)
				}
			})
		}
	}
	t.Run("RaiseFence of a reader-only token", func(t *testing.T) {
		const key = "raise-write-by-reader"
		g := acquire(t, key, "r", quorum.Shared)
		if ok, err := n.RaiseFence(ctx, key, "r", g.Fence+100); ok || err != nil {
			t.Fatalf("RaiseFence by a reader = %v, %v; want false", ok, err)
		}
		if got := counter(t, key); got != g.Fence {
			t.Errorf("counter = %d; want %d", got, g.Fence)
		}
	})
}
