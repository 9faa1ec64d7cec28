package redis

import "sync"

// waitQueues holds, per key, this instance's LOCK … WAIT callers in the
// order they arrived. Only the head of a key's queue tries to acquire: a
// release wakes the head alone, so a thousand waiters on one key cost the
// nodes one attempt per release, not a thousand. The others sleep on their
// own channel until they become the head.
//
// The queue orders waiters of one instance only: waiters on other
// instances, and LOCK without WAIT, compete with the head as equals.
type waitQueues struct {
	mu    sync.Mutex
	keys  map[string]*waitQueue
	total int // waiters over all keys
}

type waitQueue struct {
	head, tail *waiter
	// heard has a bit per node whose release announcement came since the
	// last wake-up. A release is announced once by each node, so the
	// first announcement wakes the head and the others of the same
	// release are ignored; a second one from the same node is a new
	// release.
	heard uint64
}

// waiter is one LOCK … WAIT in a queue.
type waiter struct {
	key        string
	prev, next *waiter
	// turn receives when the waiter should try to acquire: it just became
	// the head of an idle queue, or the lock was released. Buffered 1, so
	// a signal is never lost and several coalesce into one attempt.
	turn chan struct{}
	// promoted receives when the waiter became the head because the one
	// before it was granted the lock: it should not try yet, but start its
	// retry timer, the fallback for a release that is never announced (an
	// expiry, a missed message). Buffered 1.
	promoted chan struct{}
	// queued is false once the waiter left.
	queued bool
}

func newWaitQueues() *waitQueues {
	return &waitQueues{keys: map[string]*waitQueue{}}
}

// join queues a waiter for key at the tail. A waiter that finds the queue
// empty is the head and is signaled at once. first reports whether key had
// no waiters before, so that the caller starts watching its releases.
func (qs *waitQueues) join(key string) (w *waiter, first bool) {
	w = &waiter{key: key, turn: make(chan struct{}, 1), promoted: make(chan struct{}, 1), queued: true}
	qs.mu.Lock()
	defer qs.mu.Unlock()
	qs.total++
	q := qs.keys[key]
	if q == nil {
		q = &waitQueue{}
		qs.keys[key] = q
		first = true
	}
	if q.tail == nil {
		q.head, q.tail = w, w
		signal(w)
		return w, first
	}
	w.prev = q.tail
	q.tail.next = w
	q.tail = w
	return w, first
}

// leave takes w out of its queue. When w was the head, the next waiter
// becomes the head; it is signaled to try at once, unless w leaves because
// it was granted the lock: the lock is then held, and the next head is only
// told that it is the head, to wait for the release or its retry timer.
// last reports whether key has no waiters any more.
func (qs *waitQueues) leave(w *waiter, granted bool) (last bool) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if !w.queued {
		return false
	}
	w.queued = false
	qs.total--
	q := qs.keys[w.key]
	wasHead := q.head == w
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		q.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		q.tail = w.prev
	}
	w.prev, w.next = nil, nil
	if q.head == nil {
		delete(qs.keys, w.key)
		return true
	}
	switch {
	case wasHead && granted:
		select {
		case q.head.promoted <- struct{}{}:
		default:
		}
	case wasHead:
		signal(q.head)
	}
	return false
}

// wake signals the head of key's queue that node (its index) announced a
// release, unless it is another node's announcement of a release that woke
// the head already. It reports whether key has waiters.
func (qs *waitQueues) wake(key string, node int) bool {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	q := qs.keys[key]
	if q == nil {
		return false
	}
	if node < 0 || node >= 64 {
		signal(q.head)
		return true
	}
	bit := uint64(1) << node
	if q.heard&bit != 0 {
		q.heard = 0
	}
	if q.heard == 0 {
		signal(q.head)
	}
	q.heard |= bit
	return true
}

// has reports whether key has waiters.
func (qs *waitQueues) has(key string) bool {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	return qs.keys[key] != nil
}

// isHead reports whether w is at the head of its queue.
func (qs *waitQueues) isHead(w *waiter) bool {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	q := qs.keys[w.key]
	return w.queued && q != nil && q.head == w
}

// len is the number of waiters over all keys.
func (qs *waitQueues) len() int {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	return qs.total
}

func signal(w *waiter) {
	select {
	case w.turn <- struct{}{}:
	default:
	}
}
