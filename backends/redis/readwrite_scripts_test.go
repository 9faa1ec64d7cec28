package redis

import (
	"errors"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// lockOrFatal takes a lock through b and fails the test when it is not
// granted.
func lockOrFatal(t *testing.T, b *Backend, req backends.LockRequest) backends.Lease {
	t.Helper()
	l, err := b.Lock(ctxTimeout(t, 10*time.Second), req)
	if err != nil {
		t.Fatalf("Lock %+v: %v", req, err)
	}
	return l
}

// TestDowngradeRenewOfWriteLeaseKeepsReadLease: a write holder that took a
// longer read hold (a downgrade) and then renews its write lease with the
// write TTL (a client's RENEW of its write lock, or the KEEPALIVE watchdog
// of the write lock) keeps its read hold for the whole read validity it
// was told of (README: "the read hold keeps others' writes out for its
// whole lease, also when it outlives the write lease"). Before, the
// renewal cut the read lease to the write TTL, and writer b was granted
// 0.8 s into a 10 s read validity.
func TestDowngradeRenewOfWriteLeaseKeepsReadLease(t *testing.T) {
	b, rs := newRealBackend(t, 3)
	ctx := ctxTimeout(t, 60*time.Second)
	const writeTTL, readTTL = 500 * time.Millisecond, 10 * time.Second
	// The first LOCK has a node timeout of 25 ms: the writers' connections
	// are made first (on a loaded host they were not, and every node timed
	// out).
	WarmUp(ctx, t, b, rs, "dr-warm", 10*time.Second)
	for _, tc := range []struct {
		name   string
		unlock bool // UNLOCK (the write hold) after the RENEW
	}{
		{"write hold kept", false},
		{"write hold released after the renewal", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "dr-" + strings.ReplaceAll(tc.name, " ", "-")
			start := time.Now()
			lockOrFatal(t, b, backends.LockRequest{Key: key, Token: "a", TTL: writeTTL})
			r, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "a", TTL: readTTL, Mode: backends.Read})
			if err != nil || r.Validity < 5*time.Second {
				t.Fatalf("downgrade = %+v, %v; want a read hold of about 10 s", r, err)
			}
			readGranted := time.Now()
			if v, err := b.Renew(ctx, key, "a", writeTTL); err != nil || v <= 0 {
				t.Fatalf("RENEW of the write lease = %v, %v", v, err)
			}
			if tc.unlock {
				if ok, err := b.Unlock(ctx, key, "a"); !ok || err != nil {
					t.Fatalf("UNLOCK of the write hold = %v, %v", ok, err)
				}
			}
			if time.Since(start) > 300*time.Millisecond {
				// A loaded machine: the write lease may have ended between
				// the steps, and the downgrade was then a plain read grant.
				t.Skipf("steps took %v; nothing to judge", time.Since(start))
			}
			time.Sleep(writeTTL + 300*time.Millisecond) // past the write lease
			if l, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "b", TTL: 10 * time.Second}); err == nil {
				t.Errorf("writer b granted (fence %d) %v after a's read grant, within its read validity of %v",
					l.Fence, time.Since(readGranted).Round(time.Millisecond), r.Validity)
			}
		})
	}
}

// TestExtendOfWriteHoldSetsLeases checks, on one node, the leases an
// extend of a write hold leaves: without a read hold exactly the new TTL
// (shorter or longer than before); with the token's own read hold (a
// downgrade) the read lease is never shortened, only raised, and the lock
// key and every meta key expire together at the later of the two ends, so
// that the key keeps writers out for the whole read lease and no meta key
// outlives it.
func TestExtendOfWriteHoldSetsLeases(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 30*time.Second)
	const long, short = 10 * time.Second, 500 * time.Millisecond
	for _, tc := range []struct {
		name      string
		writeTTL  time.Duration
		readTTL   time.Duration // 0: no read hold
		extendTTL time.Duration
		want      time.Duration // every key's PTTL (and the read lease) after the extend, about
	}{
		{"no read hold, shorter", long, 0, short, short},
		{"no read hold, longer", short, 0, long, long},
		{"downgrade, write TTL below the read lease", short, long, short, long},
		{"downgrade, write TTL above the read lease", short, 2 * time.Second, long, long},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "ext-" + strings.ReplaceAll(tc.name, " ", "-")
			if g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: "a", TTL: tc.writeTTL}); err != nil || !g.Acquired {
				t.Fatalf("write grant = %+v, %v", g, err)
			}
			keys := []string{"lp:lock:" + key, "lp:lockf:" + key}
			if tc.readTTL > 0 {
				if g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: "a", TTL: tc.readTTL, Mode: quorum.Shared}); err != nil || !g.Acquired {
					t.Fatalf("downgrade = %+v, %v", g, err)
				}
				keys = append(keys, "lp:lockm:"+key, "lp:lockr:"+key, "lp:lockrh:"+key)
			}
			if ok, err := n.Extend(ctx, key, "a", tc.extendTTL); !ok || err != nil {
				t.Fatalf("Extend = %v, %v", ok, err)
			}
			for _, k := range keys {
				// Within 100 ms of the wanted lease: the steps take time,
				// and a read lease of 10 s must not have become 0.5 s.
				if p := direct.PTTL(ctx, k).Val(); p > tc.want || p < tc.want-100*time.Millisecond {
					t.Errorf("PTTL %s = %v; want about %v", k, p, tc.want)
				}
			}
			if tc.readTTL > 0 {
				score := direct.ZScore(ctx, "lp:lockr:"+key, "a").Val()
				tm := direct.Time(ctx).Val()
				if left := time.Duration(score)*time.Millisecond - time.Duration(tm.UnixMilli())*time.Millisecond; left > tc.want || left < tc.want-100*time.Millisecond {
					t.Errorf("read lease left %v; want about %v", left, tc.want)
				}
			}
		})
	}
}

// TestRefusedUpgradeLeavesNoWriterMark: a LOCK … WAIT by a token that
// holds a read lock is refused at once (upgrade refused), so no writer
// waits, and no writer mark may stay behind to turn new readers away.
// Before, the mark stayed for its second and reader r2 was refused.
func TestRefusedUpgradeLeavesNoWriterMark(t *testing.T) {
	b, _ := newRealBackend(t, 3)
	ctx := ctxTimeout(t, 30*time.Second)
	key := "upgrade-mark"
	lockOrFatal(t, b, backends.LockRequest{Key: key, Token: "r1", TTL: 10 * time.Second, Mode: backends.Read})
	_, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "r1", TTL: 10 * time.Second, Wait: 5 * time.Second})
	if !errors.Is(err, backends.ErrUpgrade) {
		t.Fatalf("upgrade with WAIT = %v; want ErrUpgrade", err)
	}
	if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "r2", TTL: 10 * time.Second, Mode: backends.Read}); err != nil {
		t.Errorf("reader r2 after a refused upgrade (no writer waiting): %v; want it to share with r1", err)
	}
}

// TestWriterMarkOnlyWhenHeldByAnother checks on one node when a refused
// writer that will wait leaves its mark (lockw): when another token holds
// the key (for writing or reading), so that new readers queue behind it,
// and not when its own read hold refuses it (an upgrade, which the caller
// gives up at once).
func TestWriterMarkOnlyWhenHeldByAnother(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 30*time.Second)
	for _, tc := range []struct {
		name    string
		holder  string
		mode    quorum.Mode
		upgrade bool // the waiting writer's attempt is refused as an upgrade
		mark    bool
	}{
		{"another writer holds", "b", quorum.Exclusive, false, true},
		{"another reader holds", "b", quorum.Shared, false, true},
		{"own read hold: upgrade", "a", quorum.Shared, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "mark-" + strings.ReplaceAll(tc.name, " ", "-")
			if g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: tc.holder, TTL: 10 * time.Second, Mode: tc.mode}); err != nil || !g.Acquired {
				t.Fatalf("holder's grant = %+v, %v", g, err)
			}
			g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: "a", TTL: 10 * time.Second, WriterWait: time.Second})
			if err != nil || g.Acquired || g.Upgrade != tc.upgrade {
				t.Fatalf("waiting writer's attempt = %+v, %v; want refused, upgrade %v", g, err, tc.upgrade)
			}
			if got := direct.Exists(ctx, "lp:lockw:"+key).Val() == 1; got != tc.mark {
				t.Errorf("writer mark on the node: %v; want %v", got, tc.mark)
			}
		})
	}
}

// TestReaderKeysEndWithLastHold: once every hold of a key has ended
// (released or expired), none of its keys stays on the nodes; only the
// fence hash is kept. Before, a reader's release left lockr and lockrh
// with the released reader's longer expiry (up to locks.max_ttl).
func TestReaderKeysEndWithLastHold(t *testing.T) {
	b, rs := newRealBackend(t, 3)
	ctx := ctxTimeout(t, 60*time.Second)
	for _, tc := range []struct {
		name string
		run  func(key string)
	}{
		{"long reader unlocks, short reader expires", func(key string) {
			lockOrFatal(t, b, backends.LockRequest{Key: key, Token: "long", TTL: 5 * time.Minute, Mode: backends.Read})
			lockOrFatal(t, b, backends.LockRequest{Key: key, Token: "short", TTL: 200 * time.Millisecond, Mode: backends.Read})
			if ok, err := b.Unlock(ctx, key, "long"); !ok || err != nil {
				t.Fatalf("UNLOCK long = %v, %v", ok, err)
			}
		}},
		{"long reader renewed shorter, expires", func(key string) {
			lockOrFatal(t, b, backends.LockRequest{Key: key, Token: "r", TTL: 5 * time.Minute, Mode: backends.Read})
			if v, err := b.Renew(ctx, key, "r", 200*time.Millisecond); err != nil || v <= 0 {
				t.Fatalf("RENEW = %v, %v", v, err)
			}
		}},
		// The write hold's renewal cannot shorten the read hold (see
		// TestDowngradeRenewOfWriteLeaseKeepsReadLease): the holder
		// shortens it with its own RENEW once the write hold is released.
		{"downgraded holder releases the write hold, read hold renewed shorter, expires", func(key string) {
			lockOrFatal(t, b, backends.LockRequest{Key: key, Token: "a", TTL: 5 * time.Minute})
			lockOrFatal(t, b, backends.LockRequest{Key: key, Token: "a", TTL: 5 * time.Minute, Mode: backends.Read})
			if v, err := b.Renew(ctx, key, "a", 200*time.Millisecond); err != nil || v <= 0 {
				t.Fatalf("RENEW of the write hold = %v, %v", v, err)
			}
			if ok, err := b.Unlock(ctx, key, "a"); !ok || err != nil {
				t.Fatalf("UNLOCK of the write hold = %v, %v", ok, err)
			}
			if v, err := b.Renew(ctx, key, "a", 200*time.Millisecond); err != nil || v <= 0 {
				t.Fatalf("RENEW of the read hold = %v, %v", v, err)
			}
		}},
		// The read hold is the shorter: the write hold's release leaves the
		// key to it, and the reader keys end with it, not with the write
		// lease (see TestWriteReleaseAfterDowngradeEndsReaderKeysWithKey).
		{"downgraded holder releases the write hold, shorter read hold expires", func(key string) {
			lockOrFatal(t, b, backends.LockRequest{Key: key, Token: "a", TTL: 5 * time.Minute})
			lockOrFatal(t, b, backends.LockRequest{Key: key, Token: "a", TTL: 200 * time.Millisecond, Mode: backends.Read})
			if ok, err := b.Unlock(ctx, key, "a"); !ok || err != nil {
				t.Fatalf("UNLOCK of the write hold = %v, %v", ok, err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "keys-" + strings.ReplaceAll(tc.name, " ", "-")
			tc.run(key)
			time.Sleep(600 * time.Millisecond) // past every lease left
			for i, r := range rs {
				keys, err := r.Client(t).Keys(ctx, "lp:*"+key).Result()
				if err != nil {
					t.Fatal(err)
				}
				sort.Strings(keys)
				if len(keys) > 0 {
					var ttls []string
					for _, k := range keys {
						ttls = append(ttls, k+" pttl="+r.Client(t).PTTL(ctx, k).Val().Round(time.Second).String())
					}
					t.Errorf("node %d: keys left after every hold ended: %v", i, ttls)
				}
			}
		})
	}
}

// TestExtendOfWriteHoldEndsStaleReaderKeys: a downgraded holder's extend
// sets lockr and lockrh to expire with the lock key, not at the longer of
// their old expiry and the TTL: a lockr left with a longer expiry (here
// set by hand, as a reader release before this fix left it) must not
// outlive the key by minutes.
func TestExtendOfWriteHoldEndsStaleReaderKeys(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 30*time.Second)
	const key = "stale-readers"
	if g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: "a", TTL: time.Second}); err != nil || !g.Acquired {
		t.Fatalf("write grant = %+v, %v", g, err)
	}
	if g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: "a", TTL: time.Second, Mode: quorum.Shared}); err != nil || !g.Acquired {
		t.Fatalf("downgrade = %+v, %v", g, err)
	}
	for _, k := range []string{"lp:lockr:" + key, "lp:lockrh:" + key} {
		direct.PExpire(ctx, k, 5*time.Minute)
	}
	if ok, err := n.Extend(ctx, key, "a", 2*time.Second); !ok || err != nil {
		t.Fatalf("Extend = %v, %v", ok, err)
	}
	lease := direct.PTTL(ctx, "lp:lock:"+key).Val()
	for _, k := range []string{"lp:lockr:" + key, "lp:lockrh:" + key} {
		if p := direct.PTTL(ctx, k).Val(); p > lease+5*time.Millisecond {
			t.Errorf("PTTL %s = %v; want at most the lock key's %v", k, p, lease)
		}
	}
}
