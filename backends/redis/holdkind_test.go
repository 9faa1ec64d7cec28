package redis

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// holdStates reads key's state on every node.
func holdStates(t *testing.T, ctx context.Context, b *Backend, key string) []nodeLockState {
	t.Helper()
	var out []nodeLockState
	for _, n := range b.Nodes() {
		st, err := n.LockState(ctx, key)
		if err != nil {
			t.Fatalf("node %s: lock state: %v", n.Name(), err)
		}
		out = append(out, st)
	}
	return out
}

// onMajority reports whether ok holds for a majority of sts.
func onMajority(sts []nodeLockState, ok func(nodeLockState) bool) bool {
	n := 0
	for _, st := range sts {
		if ok(st) {
			n++
		}
	}
	return n >= len(sts)/2+1
}

// TestHoldKindLeavesOtherKind: a token holds a key for writing (10 s) and
// for reading (600 ms): a downgrade. Releasing or renewing its read hold
// (what a KEEPALIVE watchdog that keeps only the read hold does) must
// leave the write hold and its lease on the nodes as they were: the
// holder was told it holds the write lock for its whole validity. Before,
// the watchdog used UNLOCK's release, which takes the write hold first,
// and RENEW's extend, which set the lock key's PX to the read TTL, so a
// writer got in about 0.6 s into a 10 s write validity. Likewise
// releasing or renewing the write hold leaves the read hold and never
// shortens its lease.
func TestHoldKindLeavesOtherKind(t *testing.T) {
	b, _ := newRealBackend(t, 3)
	ctx := ctxTimeout(t, 60*time.Second)
	for _, tc := range []struct {
		name              string
		writeTTL, readTTL time.Duration
		act               func(t *testing.T, key string) // on the downgraded token "a"
		write, read       bool                           // the holds "a" keeps
		minWrite          time.Duration                  // the lock key's PTTL after act, at least
		minRead           time.Duration                  // a's read lease after act, at least
	}{
		{"renew read", 10 * time.Second, 600 * time.Millisecond, func(t *testing.T, key string) {
			if v, err := b.RenewHold(ctx, key, "a", backends.Read, 600*time.Millisecond); v <= 0 || err != nil {
				t.Fatalf("RenewHold(read) = %v, %v; want a validity", v, err)
			}
		}, true, true, 9 * time.Second, 500 * time.Millisecond},
		{"renew read past the write lease", 600 * time.Millisecond, 600 * time.Millisecond, func(t *testing.T, key string) {
			if v, err := b.RenewHold(ctx, key, "a", backends.Read, 10*time.Second); v <= 0 || err != nil {
				t.Fatalf("RenewHold(read) = %v, %v; want a validity", v, err)
			}
		}, true, true, 9 * time.Second, 9 * time.Second},
		{"release read", 10 * time.Second, 600 * time.Millisecond, func(t *testing.T, key string) {
			if ok, err := b.UnlockHold(ctx, key, "a", backends.Read); !ok || err != nil {
				t.Fatalf("UnlockHold(read) = %v, %v; want true", ok, err)
			}
			if ok, err := b.UnlockHold(ctx, key, "a", backends.Read); ok || err != nil {
				t.Fatalf("a second UnlockHold(read) = %v, %v; want false: no read hold left", ok, err)
			}
		}, true, false, 9 * time.Second, 0},
		{"renew write", 600 * time.Millisecond, 10 * time.Second, func(t *testing.T, key string) {
			if v, err := b.RenewHold(ctx, key, "a", backends.Write, 600*time.Millisecond); v <= 0 || err != nil {
				t.Fatalf("RenewHold(write) = %v, %v; want a validity", v, err)
			}
		}, true, true, 9 * time.Second, 9 * time.Second},
		{"release write", 10 * time.Second, 10 * time.Second, func(t *testing.T, key string) {
			if ok, err := b.UnlockHold(ctx, key, "a", backends.Write); !ok || err != nil {
				t.Fatalf("UnlockHold(write) = %v, %v; want true", ok, err)
			}
			if ok, err := b.UnlockHold(ctx, key, "a", backends.Write); ok || err != nil {
				t.Fatalf("a second UnlockHold(write) = %v, %v; want false: no write hold left", ok, err)
			}
		}, false, true, 9 * time.Second, 9 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "hk-" + tc.name
			if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "a", TTL: tc.writeTTL}); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "a", TTL: tc.readTTL, Mode: backends.Read}); err != nil {
				t.Fatalf("the downgrade: %v", err)
			}
			tc.act(t, key)
			sts := holdStates(t, ctx, b, key)
			if !onMajority(sts, func(st nodeLockState) bool {
				return st.held && (st.value == "a") == tc.write && st.ttl >= tc.minWrite
			}) {
				t.Errorf("nodes %+v; want a majority with a's write hold %v and the lock key's PTTL ≥ %v", sts, tc.write, tc.minWrite)
			}
			if !onMajority(sts, func(st nodeLockState) bool {
				r, ok := st.readers["a"]
				return ok == tc.read && r.ttl >= tc.minRead
			}) {
				t.Errorf("nodes %+v; want a majority with a's read hold %v of lease ≥ %v", sts, tc.read, tc.minRead)
			}
			if l, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "b", TTL: time.Second}); err == nil {
				t.Errorf("writer b granted (fence %d) while a holds the key", l.Fence)
			}
		})
	}
}

// TestHoldKindNotHeld: releasing or renewing a kind of hold the token does
// not have answers false or 0 and changes nothing. In particular a renewal
// of a write hold that reaches the nodes after an UNLOCK released it must
// not cut the token's read lease to the write TTL, as RENEW's extend
// script, which renews whichever hold the token has, did to a downgrade's
// read hold when a KEEPALIVE write renewal crossed the UNLOCK (test/e2e
// TestUnlockOfWriteHoldKeepsKeepaliveReadHold, now and then).
func TestHoldKindNotHeld(t *testing.T) {
	b, _ := newRealBackend(t, 3)
	ctx := ctxTimeout(t, 30*time.Second)
	for _, held := range []backends.Mode{backends.Write, backends.Read} {
		other := backends.Read
		if held == backends.Read {
			other = backends.Write
		}
		key := "hk-only-" + held.String()
		if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "a", TTL: 10 * time.Second, Mode: held}); err != nil {
			t.Fatal(err)
		}
		if ok, err := b.UnlockHold(ctx, key, "a", other); ok || err != nil {
			t.Errorf("%v holder: UnlockHold(%v) = %v, %v; want false", held, other, ok, err)
		}
		if v, err := b.RenewHold(ctx, key, "a", other, 600*time.Millisecond); v != 0 || err != nil {
			t.Errorf("%v holder: RenewHold(%v) = %v, %v; want 0", held, other, v, err)
		}
		info, ok, err := b.Info(ctx, key)
		if err != nil || !ok || info.Mode != held || len(info.Holders) != 1 || info.Holders[0].TTL < 9*time.Second {
			t.Errorf("%v holder: LOCKINFO = %+v, %v, %v; want a's hold of about 10 s left as it was", held, info, ok, err)
		}
	}
}

// TestHoldKindReleaseWakesWaiter: a waiting writer learns of the release
// of the last hold through the nodes' announcements, as it does of an
// UNLOCK, not by its retry timer.
func TestHoldKindReleaseWakesWaiter(t *testing.T) {
	b, _ := newRealBackend(t, 3, func(c *Config) { c.RetryMin, c.RetryMax = 5*time.Second, 5*time.Second })
	ctx := ctxTimeout(t, 30*time.Second)
	for _, mode := range []backends.Mode{backends.Write, backends.Read} {
		key := "hk-wake-" + mode.String()
		if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "a", TTL: 10 * time.Second, Mode: mode}); err != nil {
			t.Fatal(err)
		}
		got := make(chan time.Time, 1)
		go func() {
			_, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "b", TTL: time.Second, Wait: 20 * time.Second})
			if err != nil {
				t.Errorf("waiter: %v", err)
			}
			got <- time.Now()
		}()
		// The waiter tries once at the head, then subscribes.
		waitFor(t, "the waiter queued", func() bool { return b.Waiting() == 1 })
		time.Sleep(300 * time.Millisecond)
		released := time.Now()
		if ok, err := b.UnlockHold(context.Background(), key, "a", mode); !ok || err != nil {
			t.Fatalf("UnlockHold(%v) = %v, %v", mode, ok, err)
		}
		select {
		case at := <-got:
			if d := at.Sub(released); d > 2*time.Second {
				t.Errorf("%v: the waiter got the key %v after the release; want it woken by the announcement, not its 5 s retry", mode, d)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%v: the waiter did not get the key", mode)
		}
	}
}
