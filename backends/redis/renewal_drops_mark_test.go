package redis

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// TestRenewalDropsAttemptMark: the roll-back of a marked attempt in doubt
// (lateGrantReleaseScript, lateReadReleaseScript, also what a refused
// LOCK or RLOCK with TOKEN sends a node it did not hear) removes the hold
// the attempt made only until a renewal of the token's hold there: RENEW,
// a KEEPALIVE renewal, a transparent renewal (syncHoldsScript), or the
// write RENEW of a downgrade, which renews its read hold too. Each counts
// the hold for a holder, told of its new lease; before, RENEW and KEEPALIVE
// renewals left the mark and a later roll-back took the renewed hold.
// Without a renewal the roll-back still removes the attempt's hold, and
// where the attempt joined a read hold it takes that one hold, renewal or
// not.
func TestRenewalDropsAttemptMark(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 30*time.Second)
	const ttl = 10 * time.Second
	// syncHolds is the line-up that follows a transparent write command
	// naming key.
	syncHolds := func(key string) {
		keys := []string{"lp:lock:" + key, "lp:lockf:" + key, "lp:lockm:" + key, "lp:lockr:" + key, "lp:lockrh:" + key}
		if err := direct.Eval(ctx, scriptSyncHolds.src, keys, readMarker, "lp:released:"+key).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		read bool // the attempt is a read one
		// downgrade: the token write-holds the key before its read attempt.
		downgrade bool
		// join: the token read-holds the key before its read attempt,
		// which joins that hold: the roll-back takes one hold, the
		// attempt's, renewed or not, and the earlier one stays.
		join  bool
		renew func(key string) // nil: no renewal
		kept  bool             // the roll-back leaves the attempt's hold
	}{
		{"write, no renewal", false, false, false, nil, false},
		{"write, RENEW", false, false, false, func(key string) {
			if ok, err := n.Extend(ctx, key, "T", ttl); !ok || err != nil {
				t.Fatalf("RENEW = %v, %v", ok, err)
			}
		}, true},
		{"write, KEEPALIVE renewal", false, false, false, func(key string) {
			if ok, err := n.extendHold(ctx, key, "T", backends.Write, ttl); !ok || err != nil {
				t.Fatalf("KEEPALIVE renewal = %v, %v", ok, err)
			}
		}, true},
		{"write, transparent renewal", false, false, false, func(key string) {
			// A lease of its own: a command that leaves the lease where
			// the grant set it renews nothing (the next case).
			if err := direct.PExpire(ctx, "lp:lock:"+key, 2*ttl).Err(); err != nil {
				t.Fatal(err)
			}
			syncHolds(key)
		}, true},
		{"write, transparent command that renews nothing", false, false, false, func(key string) { syncHolds(key) }, false},
		{"read, no renewal", true, false, false, nil, false},
		{"read, RENEW", true, false, false, func(key string) {
			if ok, err := n.Extend(ctx, key, "T", ttl); !ok || err != nil {
				t.Fatalf("RENEW = %v, %v", ok, err)
			}
		}, true},
		{"read, KEEPALIVE renewal", true, false, false, func(key string) {
			if ok, err := n.extendHold(ctx, key, "T", backends.Read, ttl); !ok || err != nil {
				t.Fatalf("KEEPALIVE renewal = %v, %v", ok, err)
			}
		}, true},
		{"downgrade, no renewal", true, true, false, nil, false},
		{"downgrade, RENEW of the write hold", true, true, false, func(key string) {
			if ok, err := n.Extend(ctx, key, "T", ttl); !ok || err != nil {
				t.Fatalf("RENEW = %v, %v", ok, err)
			}
		}, true},
		{"downgrade, transparent command that renews nothing", true, true, false, func(key string) { syncHolds(key) }, false},
		{"read join, RENEW", true, false, true, func(key string) {
			if ok, err := n.Extend(ctx, key, "T", ttl); !ok || err != nil {
				t.Fatalf("RENEW = %v, %v", ok, err)
			}
		}, false},
		{"read join, KEEPALIVE renewal", true, false, true, func(key string) {
			if ok, err := n.extendHold(ctx, key, "T", backends.Read, ttl); !ok || err != nil {
				t.Fatalf("KEEPALIVE renewal = %v, %v", ok, err)
			}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "rdm-" + tc.name
			mode := quorum.Exclusive
			if tc.read {
				mode = quorum.Shared
			}
			if tc.downgrade {
				if g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: "T", TTL: ttl, NoReentry: true}); err != nil || !g.Acquired {
					t.Fatalf("write hold = %+v, %v", g, err)
				}
			}
			holds := int64(1)
			if tc.join {
				if g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: "T", TTL: ttl, Mode: mode, Attempt: "h1"}); err != nil || !g.Acquired {
					t.Fatalf("earlier read hold = %+v, %v", g, err)
				}
				holds = 2
			}
			g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: "T", TTL: ttl, Mode: mode, Attempt: "a1"})
			if err != nil || !g.Acquired || g.Holds != holds {
				t.Fatalf("the attempt's grant = %+v, %v; want %d holds", g, err, holds)
			}
			if tc.renew != nil {
				tc.renew(key)
			}
			src := scriptLateGrant.src
			keys := []string{"lp:lock:" + key, "lp:lockf:" + key, "lp:lockm:" + key}
			args := []any{"T", "a1"}
			if tc.read {
				src = scriptLateRead.src
				keys = append(keys, "lp:lockr:"+key, "lp:lockrh:"+key)
				args = append(args, readMarker)
			}
			res, err := direct.Eval(ctx, src, keys, args...).Slice()
			if err != nil {
				t.Fatalf("the attempt's roll-back: %v", err)
			}
			removed := res[0].(int64) == 1
			if removed == tc.kept {
				t.Fatalf("the attempt's roll-back removed a hold: %v; want %v", removed, !tc.kept)
			}
			readHeld := direct.ZScore(ctx, "lp:lockr:"+key, "T").Err() == nil
			writeHeld := direct.Get(ctx, "lp:lock:"+key).Val() == "T"
			switch {
			case tc.read && readHeld != (tc.kept || tc.join):
				t.Errorf("T's read hold there: %v; want %v", readHeld, tc.kept || tc.join)
			case tc.join && direct.HGet(ctx, "lp:lockrh:"+key, "T").Val() != "1":
				t.Errorf("T's read holds there: %q; want 1, the earlier hold's", direct.HGet(ctx, "lp:lockrh:"+key, "T").Val())
			case tc.read && writeHeld != tc.downgrade:
				t.Errorf("T's write hold there: %v; want %v", writeHeld, tc.downgrade)
			case !tc.read && writeHeld != tc.kept:
				t.Errorf("T's write hold there: %v; want %v", writeHeld, tc.kept)
			}
		})
	}
}
