package zookeeper

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestHoldKindLeavesOtherKind: a token holds a key for writing and for
// reading (a downgrade: one node with both holds and one lease). Releasing
// or renewing its read hold (what a KEEPALIVE watchdog that keeps only the
// read hold does) must leave the write hold and its lease as they were:
// the holder was told it holds the write lock for its whole validity.
// Before, the watchdog used UNLOCK's release, which takes the write hold
// first, and RENEW, which set the node's lease to the read TTL. Likewise
// releasing or renewing the write hold leaves the read hold and never
// shortens its lease. Each case runs with the downgrade made through this
// instance and through another one (whose node data this one's cache has
// not seen).
func TestHoldKindLeavesOtherKind(t *testing.T) {
	t.Parallel() // mostly waits on lease timers, in a root of its own
	root := testRoot(t)
	// Sessions whose horizon (5/12 of them, 12.5 s) is past the leases.
	a := newBackend(t, []string{zkAddr}, root, 30*time.Second)
	other := newBackend(t, []string{zkAddr}, root, 30*time.Second)
	ctx := ctxT(t, 60*time.Second)
	for _, tc := range []struct {
		name              string
		writeTTL, readTTL time.Duration
		act               func(t *testing.T, key string)
		mode              backends.Mode // LOCKINFO's mode after act
		holds             int64         // and the holder's holds of that mode
	}{
		{"renew read", 10 * time.Second, 600 * time.Millisecond, func(t *testing.T, key string) {
			if v, err := a.RenewHold(ctx, key, "t", backends.Read, 600*time.Millisecond); v <= 0 || err != nil {
				t.Fatalf("RenewHold(read) = %v, %v; want a validity", v, err)
			}
		}, backends.Write, 1},
		{"release read", 10 * time.Second, 600 * time.Millisecond, func(t *testing.T, key string) {
			if ok, err := a.UnlockHold(ctx, key, "t", backends.Read); !ok || err != nil {
				t.Fatalf("UnlockHold(read) = %v, %v; want true", ok, err)
			}
			if ok, err := a.UnlockHold(ctx, key, "t", backends.Read); ok || err != nil {
				t.Fatalf("a second UnlockHold(read) = %v, %v; want false: no read hold left", ok, err)
			}
		}, backends.Write, 1},
		{"renew write", 600 * time.Millisecond, 10 * time.Second, func(t *testing.T, key string) {
			if v, err := a.RenewHold(ctx, key, "t", backends.Write, 600*time.Millisecond); v <= 0 || err != nil {
				t.Fatalf("RenewHold(write) = %v, %v; want a validity", v, err)
			}
		}, backends.Write, 1},
		{"release write", 10 * time.Second, 10 * time.Second, func(t *testing.T, key string) {
			if ok, err := a.UnlockHold(ctx, key, "t", backends.Write); !ok || err != nil {
				t.Fatalf("UnlockHold(write) = %v, %v; want true", ok, err)
			}
			if ok, err := a.UnlockHold(ctx, key, "t", backends.Write); ok || err != nil {
				t.Fatalf("a second UnlockHold(write) = %v, %v; want false: no write hold left", ok, err)
			}
		}, backends.Read, 1},
	} {
		for _, via := range []string{"here", "elsewhere"} {
			t.Run(tc.name+" downgraded "+via, func(t *testing.T) {
				key := "k-" + tc.name + "-" + via
				mustLock(t, a, key, "t", tc.writeTTL, backends.Write)
				down := a
				if via == "elsewhere" {
					down = other
				}
				mustLock(t, down, key, "t", tc.readTTL, backends.Read)
				tc.act(t, key)
				info, ok, err := a.Info(ctx, key)
				if err != nil || !ok || info.Mode != tc.mode || len(info.Holders) != 1 ||
					info.Holders[0].Holds != tc.holds || info.Holders[0].TTL < 9*time.Second {
					t.Errorf("LOCKINFO = %+v, %v, %v; want t's %v hold (%d) with a lease of about 10 s left", info, ok, err, tc.mode, tc.holds)
				}
				time.Sleep(800 * time.Millisecond) // past the short lease
				wantNotAcquired(t, other, key, "w", backends.Write)
			})
		}
	}
}

// TestHoldKindNotHeld: releasing or renewing a kind of hold the token does
// not have answers false or 0 and leaves the hold it has as it was.
func TestHoldKindNotHeld(t *testing.T) {
	root := testRoot(t)
	a := newBackend(t, []string{zkAddr}, root, 30*time.Second) // a horizon (12.5 s) past the lease
	ctx := ctxT(t, 30*time.Second)
	for _, held := range []backends.Mode{backends.Write, backends.Read} {
		other := backends.Read
		if held == backends.Read {
			other = backends.Write
		}
		key := "only-" + held.String()
		mustLock(t, a, key, "t", 10*time.Second, held)
		if ok, err := a.UnlockHold(ctx, key, "t", other); ok || err != nil {
			t.Errorf("%v holder: UnlockHold(%v) = %v, %v; want false", held, other, ok, err)
		}
		if v, err := a.RenewHold(ctx, key, "t", other, 600*time.Millisecond); v != 0 || err != nil {
			t.Errorf("%v holder: RenewHold(%v) = %v, %v; want 0", held, other, v, err)
		}
		info, ok, err := a.Info(ctx, key)
		if err != nil || !ok || info.Mode != held || len(info.Holders) != 1 || info.Holders[0].TTL < 9*time.Second {
			t.Errorf("%v holder: LOCKINFO = %+v, %v, %v; want t's hold of about 10 s left as it was", held, info, ok, err)
		}
	}
}
