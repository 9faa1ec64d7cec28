package redis

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
)

// TestReentryExtendsLease: a reentrant grant with a longer ttl than the
// lease left resets the lease to that ttl (it never shortens it, see
// TestReentryTooSlowKeepsLease), on the lock key and on the hold's other
// keys alike: a holder told of the longer lease must keep the key that
// long, and no other key of the hold may outlive the lock key (lockf and
// lockm of a write hold; lockr and lockrh of a read hold, from its first
// grant on). Likewise for a reader's reentry and its own lease.
func TestReentryExtendsLease(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 10*time.Second)
	for _, mode := range []quorum.Mode{quorum.Exclusive, quorum.Shared} {
		name := map[quorum.Mode]string{quorum.Exclusive: "write", quorum.Shared: "read"}[mode]
		key := "reentry-lease-" + name
		keys := n.lockKeys(n.LockKey(key), key, numLockKeys)
		metas := []int{keyFence}
		if mode == quorum.Shared {
			metas = []int{keyReaders, keyReaderHolds}
		}
		// endWithLock checks that every key of metas ends with the lock
		// key; it returns the lock key's PTTL.
		endWithLock := func(after string) time.Duration {
			t.Helper()
			lock := direct.PTTL(ctx, keys[keyLock]).Val()
			for _, k := range metas {
				if got := direct.PTTL(ctx, keys[k]).Val(); got <= 0 || got > lock+50*time.Millisecond {
					t.Errorf("%s: after %s, %s PTTL %v; want it to end with the lock key's (%v)", name, after, keys[k], got, lock)
				}
			}
			return lock
		}
		if g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: "a", TTL: time.Second, Mode: mode}); err != nil || !g.Acquired {
			t.Fatalf("%s grant = %+v, %v", name, g, err)
		}
		endWithLock("the grant")
		g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: "a", TTL: time.Minute, Mode: mode})
		if err != nil || !g.Acquired || g.Holds != 2 {
			t.Fatalf("%s reentrant grant = %+v, %v; want a second hold", name, g, err)
		}
		if mode == quorum.Exclusive {
			metas = append(metas, keyHolds)
		}
		if lock := endWithLock("the reentry"); lock < 50*time.Second {
			t.Errorf("%s: lock key PTTL %v after a reentry with a 1 min ttl; want about 1 min", name, lock)
		}
		if mode == quorum.Shared {
			st, err := n.LockState(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if rs := st.readers["a"]; rs.ttl < 50*time.Second {
				t.Errorf("reader's own lease %v after a reentry with a 1 min ttl; want about 1 min", rs.ttl)
			}
		}
	}
}
