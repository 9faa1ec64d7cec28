package quorum_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
)

// orderNode is an AsyncNode whose StartAcquire may block before it takes
// the attempt (a backend's full queue), and which records whether a
// release reached it before its StartAcquire returned.
type orderNode struct {
	*fakeNode
	block time.Duration

	mu            sync.Mutex
	acquireDone   bool
	releaseBefore bool
	releases      int
}

func (n *orderNode) StartAcquire(ctx context.Context, req quorum.Request, done func(quorum.NodeGrant, error)) {
	time.Sleep(n.block)
	n.mu.Lock()
	n.acquireDone = true
	n.mu.Unlock()
	go func() { done(n.Acquire(ctx, req)) }()
}

func (n *orderNode) StartRaiseFence(ctx context.Context, key, token string, fence uint64, done func(bool, error)) {
	go func() { done(n.RaiseFence(ctx, key, token, fence)) }()
}

func (n *orderNode) StartRelease(ctx context.Context, key, token string, hold quorum.Hold, done func(bool, error)) {
	n.mu.Lock()
	n.releases++
	n.releaseBefore = n.releaseBefore || !n.acquireDone
	n.mu.Unlock()
	go func() { done(n.Release(ctx, key, token, hold)) }()
}

func (n *orderNode) StartExtend(ctx context.Context, key, token string, ttl time.Duration, done func(bool, error)) {
	go func() { done(n.Extend(ctx, key, token, ttl)) }()
}

// TestRollbackNeverOvertakesItsAttempt: the quorum sends an attempt's
// roll-back to a node only after that node's StartAcquire returned, also
// when the other nodes decided the attempt while it was blocked there.
// backends/redis relies on it: its StartAcquire returns once the attempt
// is on the writer's queue (or given up and recorded as unsent), so the
// roll-back queues behind it and never goes out ahead of an attempt that
// is still to be sent, where a release would take the token's earlier
// hold (a reentrant LOCK … TOKEN or RLOCK … TOKEN).
func TestRollbackNeverOvertakesItsAttempt(t *testing.T) {
	for _, mode := range []quorum.Mode{quorum.Exclusive, quorum.Shared} {
		refusing := []*orderNode{
			{fakeNode: &fakeNode{name: "n1", refuse: true}},
			{fakeNode: &fakeNode{name: "n2", refuse: true}},
		}
		slow := &orderNode{fakeNode: &fakeNode{name: "n3"}, block: 100 * time.Millisecond}
		q, err := quorum.New([]quorum.Node{refusing[0], refusing[1], slow}, defaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = q.Acquire(ctx, quorum.Request{Key: "k", Token: "T", TTL: 10 * time.Second, Mode: mode})
		cancel()
		if err == nil {
			t.Fatalf("mode %v: granted with two of three nodes refusing", mode)
		}
		slow.mu.Lock()
		before, n := slow.releaseBefore, slow.releases
		slow.mu.Unlock()
		if n != 1 || before {
			t.Errorf("mode %v: %d roll-backs on the blocked node, one before its StartAcquire returned: %v; want one, after", mode, n, before)
		}
	}
}
