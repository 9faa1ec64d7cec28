package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
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
	wake     notifier
}

var _ backends.Backend = (*Backend)(nil)

// New starts a client for every node. It does not wait for the nodes: a
// node that is down counts as failed in each quorum until it answers.
func New(cfg Config) (*Backend, error) {
	if len(cfg.Nodes) == 0 {
		return nil, errors.New("redis: no nodes configured")
	}
	b := &Backend{retryMin: cfg.RetryMin, retryMax: cfg.RetryMax, wake: notifier{m: map[string]*waitSlot{}}}
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

// Lock implements backends.Backend. With Wait it retries after a random
// delay, and at once when a release of the key goes through this instance.
func (b *Backend) Lock(ctx context.Context, req backends.LockRequest) (backends.Lease, error) {
	qreq := quorum.Request{Key: req.Key, Token: req.Token, TTL: req.TTL, Mode: quorum.Exclusive}
	if req.Mode == backends.Read {
		return backends.Lease{}, errors.New("redis backend: read locks are not supported yet")
	}
	if req.Wait <= 0 {
		return b.tryOnce(ctx, qreq)
	}
	deadline := time.Now().Add(req.Wait)
	slot := b.wake.join(req.Key)
	defer b.wake.leave(req.Key, slot)
	for {
		// Take the wake-up channel before trying, so that a release between
		// our attempt and our sleep still wakes us.
		woken := b.wake.channel(slot)
		lease, err := b.tryOnce(ctx, qreq)
		if err == nil {
			return lease, nil
		}
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			return backends.Lease{}, err
		}
		delay := b.retryMin + rand.N(b.retryMax-b.retryMin+1)
		if delay > left {
			delay = left
		}
		t := time.NewTimer(delay)
		select {
		case <-woken:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return backends.Lease{}, err
		}
		t.Stop()
	}
}

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
	ok, err := b.q.Release(ctx, key, token, 0)
	if ok {
		b.wake.notify(key)
	}
	return ok, err
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

// Close stops every node client.
func (b *Backend) Close() error {
	var errs []error
	for _, n := range b.nodes {
		errs = append(errs, n.Close())
	}
	return errors.Join(errs...)
}

// notifier wakes this instance's waiters on a key when a release of that
// key goes through this instance.
type notifier struct {
	mu sync.Mutex
	m  map[string]*waitSlot
}

type waitSlot struct {
	ch   chan struct{}
	refs int
}

func (nt *notifier) join(key string) *waitSlot {
	nt.mu.Lock()
	defer nt.mu.Unlock()
	s := nt.m[key]
	if s == nil {
		s = &waitSlot{ch: make(chan struct{})}
		nt.m[key] = s
	}
	s.refs++
	return s
}

func (nt *notifier) leave(key string, s *waitSlot) {
	nt.mu.Lock()
	defer nt.mu.Unlock()
	if s.refs--; s.refs == 0 {
		delete(nt.m, key)
	}
}

func (nt *notifier) channel(s *waitSlot) <-chan struct{} {
	nt.mu.Lock()
	defer nt.mu.Unlock()
	return s.ch
}

func (nt *notifier) notify(key string) {
	nt.mu.Lock()
	defer nt.mu.Unlock()
	if s := nt.m[key]; s != nil {
		close(s.ch)
		s.ch = make(chan struct{})
	}
}
