package redis

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// TestWriteRenewalLeavesEndedReadLeaseEnded: a write holder's read hold (a
// downgrade) whose lease has ended stays ended when the write hold is
// renewed, by RENEW (extendScript), the KEEPALIVE watchdog
// (extendWriteScript) or a transparent client's PEXPIRE (syncHoldsScript):
// once the write hold is released, the key is free and another writer is
// granted. Before, the renewal (extendWriteOf) set the ended read lease to
// end with the renewed write lease, so the key stayed held by a read lease
// nobody held for the whole renewal TTL.
func TestWriteRenewalLeavesEndedReadLeaseEnded(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 30*time.Second)
	for _, tc := range []struct {
		name  string
		renew func(key string) bool
	}{
		{"RENEW", func(key string) bool {
			ok, err := n.Extend(ctx, key, "a", 5*time.Second)
			if err != nil {
				t.Fatalf("Extend: %v", err)
			}
			return ok
		}},
		{"KEEPALIVE watchdog", func(key string) bool {
			ok, err := n.extendHold(ctx, key, "a", backends.Write, 5*time.Second)
			if err != nil {
				t.Fatalf("extendHold: %v", err)
			}
			return ok
		}},
		{"transparent PEXPIRE", func(key string) bool {
			k := "lp:lock:" + key
			if err := direct.PExpire(ctx, k, 5*time.Second).Err(); err != nil {
				t.Fatal(err)
			}
			keys := []string{k, "lp:lockf:" + key, "lp:lockm:" + key, "lp:lockr:" + key, "lp:lockrh:" + key}
			if err := direct.Eval(ctx, syncHoldsScript, keys, readMarker, "lp:released:"+key).Err(); err != nil {
				t.Fatalf("syncHoldsScript: %v", err)
			}
			return true
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "ended-read-" + tc.name
			if g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: "a", TTL: 10 * time.Second}); err != nil || !g.Acquired {
				t.Fatalf("write grant = %+v, %v", g, err)
			}
			if g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: "a", TTL: 100 * time.Millisecond, Mode: quorum.Shared}); err != nil || !g.Acquired {
				t.Fatalf("downgrade = %+v, %v", g, err)
			}
			time.Sleep(250 * time.Millisecond) // the read lease ends
			if !tc.renew(key) {
				t.Fatal("the write hold's renewal was refused")
			}
			if ok, err := n.Release(ctx, key, "a", quorum.WriteHold); err != nil || !ok {
				t.Fatalf("release of the write hold = %v, %v", ok, err)
			}
			st, err := n.LockState(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if st.held {
				t.Errorf("after the write hold's release the key is held: %s (pttl %v), though the read lease ended before the renewal", describeState(st), st.ttl)
			}
			if g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: "b", TTL: time.Second}); err != nil || !g.Acquired {
				t.Errorf("writer b = %+v, %v; want granted", g, err)
			}
		})
	}
}
