package redis

import (
	"fmt"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestWaitRollbackNeverRemovesNextAttempt: the roll-back of a LOCK or
// RLOCK … WAIT's refused attempt, sent to a node that had not answered it
// (see quorum.Request.OwnToken), runs there before the waiter's next
// attempt of the same token, also when the node's writer sends the
// refused attempt, its roll-back and the next attempt in one batch (the
// writer was busy with an earlier batch while they queued). Sent after
// the next attempt, the roll-back, a release of the token's hold, removed
// the hold that attempt made there: the waiter was granted and the node
// held nothing for it, one node short of what its grant counts on. The
// same for a waiter that names its TOKEN, whose roll-back, sent unheard to
// the silent node, is scoped to its attempt (token=true).
func TestWaitRollbackNeverRemovesNextAttempt(t *testing.T) {
	const (
		ttl     = 30 * time.Second
		timeout = time.Second // the node timeout at this TTL
	)
	for _, tc := range []struct {
		mode  backends.Mode
		token bool // the waiter names its TOKEN
	}{{backends.Write, false}, {backends.Read, false}, {backends.Write, true}, {backends.Read, true}} {
		mode := tc.mode
		t.Run(fmt.Sprintf("read=%v token=%v", mode == backends.Read, tc.token), func(t *testing.T) {
			b, rs := newRealBackend(t, 3, nodeTimeouts(timeout))
			ctx := ctxTimeout(t, 30*time.Second)
			const key = "rollback-order"
			WarmUp(ctx, t, b, rs, "ro-warm", ttl)
			lockOrFatal(t, b, backends.LockRequest{Key: key, Token: "A", TTL: ttl})
			c2 := rs[2].Client(t)
			waitFor(t, "the hold on the third node", func() bool { return c2.Get(ctx, "lp:lock:"+key).Val() == "A" })
			rs[2].Pause()
			t.Cleanup(rs[2].Resume)
			// Keep the third node's writer (one per node) busy with a
			// batch of its own: what comes next for the key queues
			// behind it.
			busy := make(chan error, 1)
			go func() {
				_, err := b.Lock(ctx, backends.LockRequest{Key: "ro-busy", Token: "Z", TTL: ttl})
				busy <- err
			}()
			time.Sleep(50 * time.Millisecond)
			type result struct {
				l   backends.Lease
				err error
			}
			got := make(chan result, 1)
			go func() {
				req := backends.LockRequest{Key: key, Token: "B", TTL: ttl, Wait: 5 * time.Second, Mode: mode, NoReentry: true, OwnToken: true}
				if tc.token {
					req.NoReentry, req.OwnToken = false, false
				}
				l, err := b.Lock(ctx, req)
				got <- result{l, err}
			}()
			// B's first attempt is refused by the two nodes that answer;
			// its roll-back is queued behind it on the third.
			time.Sleep(100 * time.Millisecond)
			if ok, err := b.Unlock(ctx, key, "A"); !ok || err != nil {
				t.Fatalf("UNLOCK A = %v, %v; want released", ok, err)
			}
			r := <-got
			if r.err != nil {
				t.Fatalf("LOCK … WAIT = %v; want a grant", r.err)
			}
			// B's next attempt is queued on the third node too: it runs
			// there, after the roll-back of the first, once the node
			// answers again, well within the node timeout of the busy
			// batch.
			rs[2].Resume()
			if err := <-busy; err != nil {
				t.Fatalf("LOCK ro-busy = %v", err)
			}
			holds := func() bool {
				if mode == backends.Read {
					return c2.ZScore(ctx, "lp:lockr:"+key, "B").Err() == nil
				}
				return c2.Get(ctx, "lp:lock:"+key).Val() == "B"
			}
			// B holds the key on every node, for as long as its lease
			// lasts.
			waitFor(t, "B's hold on the third node", holds)
			for end := time.Now().Add(2 * timeout); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
				if !holds() {
					t.Fatalf("B's hold on the third node gone while B holds the key (validity %v)", r.l.Validity)
				}
			}
		})
	}
}
