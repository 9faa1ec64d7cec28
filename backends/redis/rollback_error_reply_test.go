package redis

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestRollbackAfterErrorReplyKeepsEarlierHold: an acquire a node answers
// with an error reply (here OOM under maxmemory; BUSY, MISCONF, READONLY
// and NOPERM answer alike) did not run there, or stopped part way. The
// failed attempt's roll-back reaches that node too, and as a plain
// release it took a hold the attempt never made: the token's earlier
// hold when the holder repeated its LOCK or RLOCK with TOKEN, or, for a
// transparent SET NX (NoReentry), the hold of another client that locks
// with the same value. With the holder on a majority that includes the
// erring nodes, another client was then granted the key during the
// holder's lease. Now the roll-back of an erred acquire removes only a
// hold that acquire made (as the roll-back of one in doubt does). Each
// case failed before (found by a review).
func TestRollbackAfterErrorReplyKeepsEarlierHold(t *testing.T) {
	for _, tc := range []struct {
		name string
		// hold takes the first hold, on every node; again is the attempt
		// two nodes answer with OOM; rival must then be refused.
		hold, again, rival quorum.Request
	}{
		{"LOCK TOKEN repeated",
			quorum.Request{Token: "T", TTL: 20 * time.Second},
			quorum.Request{Token: "T", TTL: 20 * time.Second},
			quorum.Request{Token: "U", TTL: 5 * time.Second}},
		{"RLOCK TOKEN repeated",
			quorum.Request{Token: "R", TTL: 20 * time.Second, Mode: quorum.Shared},
			quorum.Request{Token: "R", TTL: 20 * time.Second, Mode: quorum.Shared},
			quorum.Request{Token: "W", TTL: 5 * time.Second}},
		{"same value, NoReentry (transparent SET NX)",
			quorum.Request{Token: "1", TTL: 20 * time.Second, NoReentry: true},
			quorum.Request{Token: "1", TTL: 20 * time.Second, NoReentry: true},
			quorum.Request{Token: "2", TTL: 5 * time.Second, NoReentry: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			harness.RequireBinary(t, "redis-server", "redis-server")
			rs := harness.StartRedisN(t, 3, harness.RedisOptions{})
			ctx := ctxTimeout(t, 30*time.Second)
			// The roll-back is what the test is about: under OOM a read
			// release's HINCRBY is refused as well, so the nodes leave
			// OOM as the roll-back reaches them (a BUSY script ending, a
			// memory peak passing).
			var nodes []quorum.Node
			for i, r := range rs {
				n := newTestNode(t, r)
				var hook func()
				if i > 0 {
					c := r.Client(t)
					hook = func() { _ = c.ConfigSet(context.Background(), "maxmemory", "0").Err() }
				}
				nodes = append(nodes, rollbackHookNode{Node: n, hook: hook})
			}
			q, err := quorum.New(nodes, quorum.Config{DriftFactor: 0.01, DriftMin: 2 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			key := fmt.Sprintf("oom-%d", time.Now().UnixNano())
			req := func(r quorum.Request) quorum.Request { r.Key = key; return r }
			if _, err := q.Acquire(ctx, req(tc.hold)); err != nil {
				t.Fatalf("first hold: %v", err)
			}
			// Every node has the hold and its fence before the OOM.
			for i, r := range rs {
				c := r.Client(t)
				for j := 0; c.Exists(ctx, "lp:lock:"+key).Val() != 1 || tc.hold.Mode != quorum.Shared && c.Exists(ctx, "lp:lockf:"+key).Val() != 1; j++ {
					if j == 200 {
						t.Fatalf("node %d has not the first hold 2 s after it was granted", i)
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			for _, r := range rs[1:] {
				if err := r.Client(t).ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
					t.Fatal(err)
				}
			}
			_, err = q.Acquire(ctx, req(tc.again))
			for _, r := range rs[1:] {
				_ = r.Client(t).ConfigSet(ctx, "maxmemory", "0").Err()
			}
			if err == nil {
				t.Fatal("the attempt that two nodes answered with OOM was granted")
			}
			t.Logf("the attempt two nodes answered with OOM: %v", err)
			if l, err := q.Acquire(ctx, req(tc.rival)); err == nil {
				t.Errorf("%s granted (fence %d) during %s's first lease: the failed attempt's roll-back took that hold where the attempt erred",
					tc.rival.Token, l.Fence, tc.hold.Token)
			}
		})
	}
}

// rollbackHookNode is a Node whose roll-back releases run hook first. Not
// embedded: the quorum must not find the asynchronous methods, so every
// call goes through here.
type rollbackHookNode struct {
	Node *Node
	hook func()
}

func (h rollbackHookNode) Name() string { return h.Node.Name() }

func (h rollbackHookNode) Acquire(ctx context.Context, req quorum.Request) (quorum.NodeGrant, error) {
	return h.Node.Acquire(ctx, req)
}

func (h rollbackHookNode) RaiseFence(ctx context.Context, key, token string, fence uint64) (bool, error) {
	return h.Node.RaiseFence(ctx, key, token, fence)
}

func (h rollbackHookNode) RaiseReadFence(ctx context.Context, key, token string, fence uint64) (bool, error) {
	return h.Node.RaiseReadFence(ctx, key, token, fence)
}

func (h rollbackHookNode) Release(ctx context.Context, key, token string, hold quorum.Hold) (bool, error) {
	if quorum.Rollback(ctx) && h.hook != nil {
		h.hook()
	}
	return h.Node.Release(ctx, key, token, hold)
}

func (h rollbackHookNode) Extend(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	return h.Node.Extend(ctx, key, token, ttl)
}

// TestRollsBackInBatch: a roll-back waits for its batch's answers only
// when its own acquire goes out ahead of it in the batch (same key, token
// and attempt), never a holder's release or one whose acquire is elsewhere.
func TestRollsBackInBatch(t *testing.T) {
	acq := &op{kind: opAcquire, base: "k", token: "t", attempt: "a1"}
	unnamed := &op{kind: opAcquire, base: "k", token: "u"}
	for _, tc := range []struct {
		name   string
		before []*op
		o      *op
		want   bool
	}{
		{"its named attempt ahead", []*op{acq}, &op{kind: opRelease, rollback: true, base: "k", token: "t", attempt: "a1"}, true},
		{"its unnamed attempt ahead", []*op{unnamed}, &op{kind: opRelease, rollback: true, base: "k", token: "u"}, true},
		{"another attempt of the token", []*op{acq}, &op{kind: opRelease, rollback: true, base: "k", token: "t", attempt: "a2"}, false},
		{"a holder's UNLOCK", []*op{acq}, &op{kind: opRelease, base: "k", token: "t"}, false},
		{"another key", []*op{acq}, &op{kind: opRelease, rollback: true, base: "k2", token: "t", attempt: "a1"}, false},
		{"nothing ahead", nil, &op{kind: opRelease, rollback: true, base: "k", token: "t", attempt: "a1"}, false},
	} {
		if got := rollsBackInBatch(tc.before, tc.o); got != tc.want {
			t.Errorf("%s: rollsBackInBatch = %v; want %v", tc.name, got, tc.want)
		}
	}
}
