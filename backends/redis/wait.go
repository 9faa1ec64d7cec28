package redis

import (
	"math/bits"
	"sync"
	"time"
)

// waitQueues holds, per key, this instance's LOCK … WAIT callers in the
// order they arrived. Only the head of a key's queue tries to acquire: a
// release wakes the head alone, so a thousand waiters on one key cost the
// nodes one attempt per release, not a thousand. The others sleep on their
// own channel until they become the head.
//
// The queue orders waiters of one instance only: waiters on other
// instances, and LOCK without WAIT, compete with the head as equals.
//
// A key is watched (its release announcements subscribed to) only once it
// is contended: a waiter joined behind another, or an attempt failed. A
// LOCK … WAIT granted at its first attempt, alone, costs the nodes no
// subscription.
type waitQueues struct {
	// need is how many nodes' announcements make a release: a majority,
	// since before that the key is still held on a majority and an
	// attempt could not succeed.
	need int
	// soon is how long after the first announcement of a release the head
	// tries even if the rest of the majority's never come: a node whose
	// subscription is down, redialing or lagging (after slow links, say)
	// must not leave every waiter to its retry timer. 0 turns it off.
	soon  time.Duration
	mu    sync.Mutex
	keys  map[string]*waitQueue
	total int // waiters over all keys
}

type waitQueue struct {
	head, tail *waiter
	// heard has a bit per node whose release announcement came since the
	// last wake-up. A release is announced once by each node; the
	// announcement that completes a majority wakes the head, and the
	// others of the same release are ignored; a second one from the same
	// node is a new release.
	heard uint64
	// early signals the head soon after a release's first announcement
	// (see waitQueues.soon); stopped when the majority's came.
	early *time.Timer
	// earlyGen numbers the early signals armed, so that one whose timer
	// fired while it was being stopped or replaced does nothing.
	earlyGen uint64
	// watched is set once the key is contended, until the queue empties.
	watched bool
}

// stopEarly stops the queue's early signal, if one is pending.
func (q *waitQueue) stopEarly() {
	if q.early != nil {
		q.early.Stop()
		q.early = nil
	}
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
	// read is set for RLOCK: readers at the head are let in together.
	read bool
}

func newWaitQueues(need int, soon time.Duration) *waitQueues {
	return &waitQueues{need: max(need, 1), soon: soon, keys: map[string]*waitQueue{}}
}

// join queues a waiter for key at the tail. A waiter that finds the queue
// empty is the head and is signaled at once. watch reports whether the
// key became watched: the waiter joined behind another.
func (qs *waitQueues) join(key string, read bool) (w *waiter, watch bool) {
	w = &waiter{key: key, turn: make(chan struct{}, 1), promoted: make(chan struct{}, 1), queued: true, read: read}
	qs.mu.Lock()
	defer qs.mu.Unlock()
	qs.total++
	q := qs.keys[key]
	if q == nil {
		q = &waitQueue{}
		qs.keys[key] = q
	}
	if q.tail == nil {
		q.head, q.tail = w, w
		signal(w)
		return w, false
	}
	w.prev = q.tail
	q.tail.next = w
	q.tail = w
	watch = !q.watched
	q.watched = true
	return w, watch
}

// watch marks key contended: an attempt failed. It reports whether the
// key became watched.
func (qs *waitQueues) watch(key string) bool {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	q := qs.keys[key]
	if q == nil || q.watched {
		return false
	}
	q.watched = true
	return true
}

// leave takes w out of its queue. When w was the head, the next waiter
// becomes the head; it is signaled to try at once, unless w leaves because
// it was granted the lock: the lock is then held, and the next head is only
// told that it is the head, to wait for the release or its retry timer.
// A reader granted lets the reader behind it try at once, so the readers
// at the head of a queue share the lock and a writer behind them waits.
// unwatch reports whether the key was watched and has no waiters any more.
func (qs *waitQueues) leave(w *waiter, granted bool) (unwatch bool) {
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
		q.stopEarly()
		delete(qs.keys, w.key)
		return q.watched
	}
	switch {
	case wasHead && granted && w.read && q.head.read:
		signal(q.head)
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

// wake notes that node (its index) announced a release of key, and signals
// the head of key's queue when a majority of nodes has announced it: the
// first announcement comes as soon as one node released, and an attempt
// then could still find the key held on the others (and, if nothing else
// woke the waiter, leave it to its retry timer). When the majority's
// announcements do not all come, the head is signaled qs.soon after the
// first. It reports whether key has waiters.
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
	q.heard |= bit
	switch heard := bits.OnesCount64(q.heard); {
	case heard == qs.need:
		q.stopEarly()
		signal(q.head)
	case heard == 1 && qs.soon > 0:
		q.stopEarly()
		q.earlyGen++
		gen := q.earlyGen
		q.early = time.AfterFunc(qs.soon, func() { qs.signalEarly(key, q, gen) })
	}
	return true
}

// signalEarly signals the head of q, key's queue, unless the queue is gone
// or the early signal gen was stopped or replaced meanwhile.
func (qs *waitQueues) signalEarly(key string, q *waitQueue, gen uint64) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if qs.keys[key] != q || q.head == nil || q.early == nil || q.earlyGen != gen {
		return
	}
	q.early = nil
	signal(q.head)
}

// watched reports whether key has waiters and is contended.
func (qs *waitQueues) watched(key string) bool {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	q := qs.keys[key]
	return q != nil && q.watched
}

// isHead reports whether w is at the head of its queue.
func (qs *waitQueues) isHead(w *waiter) bool {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	q := qs.keys[w.key]
	return w.queued && q != nil && q.head == w
}

// count is the number of waiters for key.
func (qs *waitQueues) count(key string) int {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	n := 0
	if q := qs.keys[key]; q != nil {
		for w := q.head; w != nil; w = w.next {
			n++
		}
	}
	return n
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
