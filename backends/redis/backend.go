package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// Config is the RedLock backend's configuration.
type Config struct {
	Nodes  []NodeConfig
	Quorum quorum.Config
	// RetryMin and RetryMax bound the random delay between attempts while a
	// LOCK waits: random so that contending clients fall out of step.
	RetryMin, RetryMax time.Duration
}

// Backend serves locks from a quorum of Redis nodes.
type Backend struct {
	nodes    []*Node
	q        *quorum.Quorum
	retryMin time.Duration
	retryMax time.Duration
	waiters  *waitQueues
	subs     []*subscriber
}

var _ backends.Backend = (*Backend)(nil)

// New starts a client for every node. It does not wait for the nodes: a
// node that is down counts as failed in each quorum until it answers.
func New(cfg Config) (*Backend, error) {
	if len(cfg.Nodes) == 0 {
		return nil, errors.New("redis: no nodes configured")
	}
	b := &Backend{retryMin: cfg.RetryMin, retryMax: cfg.RetryMax, waiters: newWaitQueues()}
	if b.retryMin <= 0 {
		b.retryMin = 20 * time.Millisecond
	}
	if b.retryMax < b.retryMin {
		b.retryMax = b.retryMin * 10
	}
	qnodes := make([]quorum.Node, len(cfg.Nodes))
	for i, nc := range cfg.Nodes {
		b.nodes = append(b.nodes, NewNode(nc))
		qnodes[i] = b.nodes[i]
		b.subs = append(b.subs, newSubscriber(b.nodes[i], b.waiters.watched, func(key string) { b.waiters.wake(key, i) }))
	}
	q, err := quorum.New(qnodes, cfg.Quorum)
	if err != nil {
		b.Close()
		return nil, fmt.Errorf("redis backend: %w", err)
	}
	b.q = q
	return b, nil
}

// Quorum exposes the algorithm, for INFO and tests.
func (b *Backend) Quorum() *quorum.Quorum { return b.q }

// Nodes returns the node clients.
func (b *Backend) Nodes() []*Node { return b.nodes }

// Lock implements backends.Backend. Without Wait it tries once. With Wait
// the caller joins the key's queue of waiters on this instance and tries
// only at its head: at once when the waiter before it gave up or there was
// none, whenever a node announces a release of the key (through whichever
// instance it was made), and otherwise after a random delay in
// [RetryMin, RetryMax], which covers expiries and missed announcements.
func (b *Backend) Lock(ctx context.Context, req backends.LockRequest) (backends.Lease, error) {
	qreq := quorum.Request{Key: req.Key, Token: req.Token, TTL: req.TTL, Mode: quorum.Exclusive}
	if req.Mode == backends.Read {
		return backends.Lease{}, errors.New("redis backend: read locks are not supported yet")
	}
	if req.Wait <= 0 {
		return b.tryOnce(ctx, qreq)
	}
	deadline := time.NewTimer(req.Wait)
	defer deadline.Stop()
	w := b.join(req.Key)
	granted := false
	defer func() { b.leave(w, granted) }()

	err := backends.ErrNotAcquired
	var retry *time.Timer
	var retryC <-chan time.Time // nil until this waiter is the head
	// A waiter that never reached the head returns ErrNotAcquired without
	// having tried: first come, first served.
	defer func() {
		if retry != nil {
			retry.Stop()
		}
	}()
	armRetry := func() {
		delay := b.retryMin + rand.N(b.retryMax-b.retryMin+1)
		if retry == nil {
			retry = time.NewTimer(delay)
			retryC = retry.C
		} else {
			retry.Reset(delay)
		}
	}
	for {
		// Only the head is signaled, and only the head's retry timer runs.
		select {
		case <-w.turn:
		case <-retryC:
		case <-w.promoted:
			armRetry()
			continue
		case <-deadline.C:
			return backends.Lease{}, err
		case <-ctx.Done():
			return backends.Lease{}, err
		}
		var lease backends.Lease
		lease, err = b.tryOnce(ctx, qreq)
		if err == nil {
			granted = true
			return lease, nil
		}
		if ctx.Err() != nil {
			return backends.Lease{}, err
		}
		b.watch(req.Key)
		armRetry()
	}
}

// join queues a waiter for key. One that joins behind another subscribes
// the key's release announcements on every node, if that is not done yet.
func (b *Backend) join(key string) *waiter {
	w, watch := b.waiters.join(key)
	if watch {
		b.updateSubscriptions(key)
	}
	return w
}

// watch subscribes key's release announcements on every node after a
// failed attempt, if that is not done yet.
func (b *Backend) watch(key string) {
	if b.waiters.watch(key) {
		b.updateSubscriptions(key)
	}
}

// leave takes w out of its queue and, after the last waiter of a watched
// key, unsubscribes the key's announcements.
func (b *Backend) leave(w *waiter, granted bool) {
	if b.waiters.leave(w, granted) {
		b.updateSubscriptions(w.key)
	}
}

func (b *Backend) updateSubscriptions(key string) {
	for _, s := range b.subs {
		s.update(key)
	}
}

// Waiting is the number of LOCK … WAIT calls queued on this instance.
func (b *Backend) Waiting() int { return b.waiters.len() }

func (b *Backend) tryOnce(ctx context.Context, req quorum.Request) (backends.Lease, error) {
	l, err := b.q.Acquire(ctx, req)
	switch {
	case err == nil:
		return backends.Lease{Token: l.Token, Validity: l.Validity, Fence: l.Fence}, nil
	case errors.Is(err, quorum.ErrNotAcquired), errors.Is(err, quorum.ErrExpired):
		return backends.Lease{}, backends.ErrNotAcquired
	default:
		return backends.Lease{}, err
	}
}

// Unlock implements backends.Backend.
func (b *Backend) Unlock(ctx context.Context, key, token string) (bool, error) {
	// Local waiters learn of the release from the nodes' announcements,
	// like everyone else's: waking them here as well would make the
	// announcements that follow look like a second release.
	return b.q.Release(ctx, key, token, 0)
}

// Renew implements backends.Backend.
func (b *Backend) Renew(ctx context.Context, key, token string, ttl time.Duration) (time.Duration, error) {
	return b.q.Extend(ctx, key, token, ttl)
}

// Ready implements backends.Backend: a majority of nodes must answer PING.
func (b *Backend) Ready(ctx context.Context) error {
	type res struct {
		name string
		err  error
	}
	ch := make(chan res, len(b.nodes))
	for _, n := range b.nodes {
		go func(n *Node) {
			ch <- res{n.Name(), n.client.Ping(ctx).Err()}
		}(n)
	}
	var failures []quorum.NodeError
	for range b.nodes {
		r := <-ch
		if r.err != nil {
			failures = append(failures, quorum.NodeError{Node: r.name, Err: r.err})
		}
	}
	if len(b.nodes)-len(failures) < b.q.Majority() {
		return &quorum.NoQuorumError{OK: len(b.nodes) - len(failures), Total: len(b.nodes), Failures: failures}
	}
	return nil
}

// Close stops the subscriptions and every node client.
func (b *Backend) Close() error {
	for _, s := range b.subs {
		s.close()
	}
	var errs []error
	for _, n := range b.nodes {
		errs = append(errs, n.Close())
	}
	return errors.Join(errs...)
}
