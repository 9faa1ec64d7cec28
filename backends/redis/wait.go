package redis

import (
	"context"
	"math/bits"
	"slices"
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
//
// The head hardly polls while the key stays held: between announced
// releases it tries again when the lease that refused it ends (an expiry
// is not announced), or Backend.leaseSleepMax after its last attempt if
// that comes first (some freeings are never announced). Sleeping on the
// lease is sound only while the announcements reach it, so the queues
// also track which nodes confirmed the key's
// subscription (live): an attempt made while none had is followed by the
// short retry instead, and the first confirmation (at the start, or after
// every node's subscription was lost) signals the head to try once more,
// for a release it may have missed meanwhile.
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
	// live has, per key, a bit per node whose subscription to the key's
	// announcements the node confirmed and that has not ended or been
	// lost since. It outlives the key's queue: the subscription may too.
	live map[string]uint64
}

type waitQueue struct {
	head, tail *waiter
	// heard has a bit per node whose release announcement came since the
	// last wake-up. A release is announced once by each node; the
	// announcement that completes a majority wakes the head, and the
	// others of the same release are ignored; a second one from the same
	// node is a new release, and so is one that comes more than soon
	// after the first counted (see wake).
	heard uint64
	// heardAt is when the first announcement counted in heard came.
	heardAt time.Time
	// early signals the head soon after a release's first announcement
	// (see waitQueues.soon); stopped when the majority's came.
	early *time.Timer
	// earlyGen numbers the early signals armed, so that one whose timer
	// fired while it was being stopped or replaced does nothing.
	earlyGen uint64
	// watched is set once the key is contended, until the queue empties.
	watched bool
	// holder is the token that held the key on a majority of nodes when
	// the head's last attempt was refused, or "": a waiter of that token
	// (see waiter.token) need not wait its turn.
	holder string
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
	// heldUntil, set with a promotion, is when the lease of the waiter
	// granted before it ends (at the latest: its TTL from the start of its
	// attempt), or zero.
	heldUntil time.Time
	// token is set for a waiter whose attempt may join its token's hold
	// (LOCK or RLOCK … TOKEN): when that token holds the key
	// (waitQueue.holder), or for a reader when readers hold it, the
	// waiter is signaled wherever it is in the queue (see mayJoin). The waiters
	// ahead of it wait for that very hold to end, so waiting behind them
	// would keep the holder's reentry from being granted until its WAIT
	// ran out, where the same LOCK without WAIT is granted at once. A
	// hold that ended unannounced (an expiry) is the holder until the
	// head's next refusal: a waiter of its token joining meanwhile is
	// granted afresh ahead of its turn, as that LOCK without WAIT would
	// be.
	token string
	// readTried is set once the reader's out-of-turn attempt was refused:
	// it holds no read hold, and is not let try out of turn again just
	// because readers hold the key, or a queue of readers that name
	// their tokens would cost the nodes an attempt each at every refusal
	// of the head.
	readTried bool
}

// mayJoin reports whether w's attempt may join a hold when holder's hold
// refused the head: w's token holds the key, or w reads and readers hold
// it. A reader's attempt joins its token's read hold whatever writer
// waits (a new reader is refused while one does), and the refusals of
// readers name no reader, so a reader tries when readers hold the key,
// once: a refusal sends it back to its place for good (see readTried).
func (w *waiter) mayJoin(holder string) bool {
	return w.token != "" && holder != "" && (w.token == holder || w.read && !w.readTried && holder == readMarker)
}

// refusedOutOfTurn notes that w's attempt out of its turn was refused.
func (qs *waitQueues) refusedOutOfTurn(w *waiter) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	w.readTried = w.read
}

func newWaitQueues(need int, soon time.Duration) *waitQueues {
	return &waitQueues{need: max(need, 1), soon: soon, keys: map[string]*waitQueue{}, live: map[string]uint64{}}
}

// join queues a waiter for key at the tail. A waiter that finds the queue
// empty is the head and is signaled at once. watch reports whether the
// key became watched: the waiter joined behind another.
func (qs *waitQueues) join(key string, read bool) (w *waiter, watch bool) {
	return qs.joinToken(key, read, "")
}

// joinToken is join for a waiter whose attempt may join a hold of token
// (see waiter.token); "" for none.
func (qs *waitQueues) joinToken(key string, read bool, token string) (w *waiter, watch bool) {
	w = &waiter{key: key, turn: make(chan struct{}, 1), promoted: make(chan struct{}, 1), queued: true, read: read, token: token}
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
	if w.mayJoin(q.holder) {
		signal(w)
	}
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
	return qs.leaveHeld(w, granted, time.Time{})
}

// leaveHeld is leave, where a granted w's lease ends at heldUntil: a
// waiter promoted to the head learns it (see promotion).
func (qs *waitQueues) leaveHeld(w *waiter, granted bool, heldUntil time.Time) (unwatch bool) {
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
	if wasHead && granted {
		// A new hold: the head's. Its token's waiters behind it join it.
		q.holder = w.token
	}
	switch {
	case wasHead && granted && w.read && q.head.read:
		signal(q.head)
	case wasHead && granted:
		q.head.heldUntil = heldUntil
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
		q.holder = ""
		signal(q.head)
		return true
	}
	// A release: the holder the head was refused by may be gone, and a
	// waiter of its token would be granted afresh, ahead of its turn.
	q.holder = ""
	bit := uint64(1) << node
	// One release's announcements come within about a millisecond of
	// each other, so one that comes more than soon after the first
	// counted starts a new release, as a node's second does. Without
	// that, the bits of the release that woke a head that was then
	// granted (nothing clears them) would count towards the next release
	// for the head promoted behind it: an announcement from a node that
	// was silent in the last one would be neither the first (no early
	// signal) nor complete the majority, and one from another node would
	// complete a "majority" on its own. A late announcement of a release
	// already seen costs one more attempt, as after a refusal.
	now := time.Now()
	if q.heard&bit != 0 || (qs.soon > 0 && q.heard != 0 && now.Sub(q.heardAt) > qs.soon) {
		q.heard = 0
	}
	if q.heard == 0 {
		q.heardAt = now
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

// refused notes that the head's attempt on key was refused: the
// announcements heard so far are of releases that attempt has seen (or
// may have: those that came during it), and every one that comes from now
// on counts afresh. Without this, a release whose announcements complete
// no new majority (the bits of its nodes were set, in no order, by an
// earlier release's) would wake nobody, and the head, which hardly polls,
// would sleep until the lease end or its cap. A late announcement of a
// release already seen costs one more attempt. An early signal pending
// stays: it may be for a release during the attempt.
func (qs *waitQueues) refused(key string) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if q := qs.keys[key]; q != nil {
		q.heard = 0
	}
}

// heldBy notes that the head's attempt on key was refused by holder's
// hold on a majority of nodes ("" when no one holder refused it so), and
// signals the waiters behind the head whose attempts may join that hold
// (see waiter.mayJoin).
func (qs *waitQueues) heldBy(key, holder string) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	q := qs.keys[key]
	if q == nil {
		return
	}
	q.holder = holder
	if holder == "" {
		return
	}
	for w := q.head.next; w != nil; w = w.next {
		if w.mayJoin(holder) {
			signal(w)
		}
	}
}

// promotion is when the lease of the grant that made w the head ends, or
// zero when unknown.
func (qs *waitQueues) promotion(w *waiter) time.Time {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	return w.heldUntil
}

// liveBit is node's bit in live: nodes past 63 share the last.
func liveBit(node int) uint64 { return 1 << min(max(node, 0), 63) }

// subscribed records that node confirmed (on) or ended its subscription
// to key's announcements. The first node to confirm, while none had,
// signals the head: a release before then went unheard, and the head may
// be sleeping until a lease end.
func (qs *waitQueues) subscribed(key string, node int, on bool) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	was := qs.live[key]
	now := was &^ liveBit(node)
	if on {
		now |= liveBit(node)
	}
	if now == 0 {
		delete(qs.live, key)
	} else {
		qs.live[key] = now
	}
	if was == 0 && now != 0 {
		if q := qs.keys[key]; q != nil && q.head != nil {
			signal(q.head)
		}
	}
}

// lost records that node's subscription connection failed, and every
// subscription on it with it.
func (qs *waitQueues) lost(node int) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	for key, m := range qs.live {
		if m &^= liveBit(node); m == 0 {
			delete(qs.live, key)
		} else {
			qs.live[key] = m
		}
	}
}

// hearsReleases reports whether a release of key is announced to this
// instance now: at least one node confirmed its subscription, and it was
// not lost since.
func (qs *waitQueues) hearsReleases(key string) bool {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	return qs.live[key] != 0
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

// refusals gathers, for one attempt of a LOCK … WAIT, what the nodes that
// refused it said (noteAnswer, through the attempt's context: the quorum
// passes their answers on in its own terms, which have no lease): which
// nodes refused, who holds the key on each, and when that hold ends; and
// for a writer's, which nodes granted. A
// failed attempt has all its answers in by the time the quorum returns: it
// rolls back every node that did not refuse, and waits for that, which
// comes after the node's answer; but the refused attempt of a waiter
// (quorum.Request.OwnToken, and with TOKEN its scoped roll-back) returns
// once the nodes that
// answered refused it on a majority, and a node silent until then
// answers later, into a refusals no one reads any more: the next attempt
// gathers its own.
type refusals struct {
	mu      sync.Mutex
	nodes   []*Node // every node that refused
	granted []*Node // every node that granted
	// wasGranted is set with key and token once the writer's attempt was
	// granted (won): a refusal that comes later takes its mark off at
	// once.
	wasGranted bool
	key, token string
	// holds has, per holder, how many refusals told its lease, and the
	// earliest end among them.
	holds map[string]heldBy
}

type heldBy struct {
	nodes int
	end   time.Time
}

type refusalsKey struct{}

// withRefusals is ctx, whose acquire refusals rs gathers.
func withRefusals(ctx context.Context, rs *refusals) context.Context {
	return context.WithValue(ctx, refusalsKey{}, rs)
}

// noteAnswer adds node n's answer r to an acquire (a refusal, or a grant
// of a waiting writer's) to the refusals gathered through ctx, if ctx
// gathers them.
func noteAnswer(ctx context.Context, n *Node, r opResult) {
	if r.err != nil || (r.n < 0 && r.n != acquireRefused) {
		return
	}
	rs, ok := ctx.Value(refusalsKey{}).(*refusals)
	if !ok {
		return
	}
	if r.n >= 0 {
		rs.mu.Lock()
		rs.granted = append(rs.granted, n)
		rs.mu.Unlock()
		return
	}
	end := time.Now().Add(time.Duration(r.lease) * time.Millisecond)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.nodes = append(rs.nodes, n)
	if rs.wasGranted {
		// Queued behind the attempt on the node, so it finds its mark;
		// from the writer's answer callback, which must not block.
		n.unmarkFromAnswer(rs.key, rs.token)
		return
	}
	if !r.leased {
		return
	}
	if rs.holds == nil {
		rs.holds = map[string]heldBy{}
	}
	h := rs.holds[r.holder]
	if h.nodes == 0 || end.Before(h.end) {
		h.end = end
	}
	h.nodes++
	rs.holds[r.holder] = h
}

// until is when the key may be free again unless it is released first:
// the earliest end of the hold that refused the attempt on at least
// majority nodes (a write holder, the readers, a waiting writer's marks
// for a reader). The earliest is the safe choice: trying early costs an
// attempt, which tells the lease again, where trying late would leave the
// lock free for nothing after an expiry. Such a hold ends by a release,
// which is announced, or by that lease's end, or earlier without an
// announcement (the caller caps its sleep: see Backend.leaseSleepMax).
// It reports false when no one holder refused on a majority: the votes
// were split between attempts (this one and another instance's, say), or
// stale holds on a minority of nodes joined a competing attempt's, and
// those are rolled back without an announcement, so the leases they tell
// may be gone long before they end; or too few refusals told a lease
// (nodes failed, a key without expiry).
func (rs *refusals) until(majority int) (time.Time, bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for _, h := range rs.holds {
		if h.nodes >= majority {
			return h.end, true
		}
	}
	return time.Time{}, false
}

// holder is the token whose hold refused the attempt on at least majority
// nodes, telling its lease (see until), or "".
func (rs *refusals) holder(majority int) string {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for h, held := range rs.holds {
		if held.nodes >= majority {
			return h
		}
	}
	return ""
}

// refusedAny reports whether a node refused, so far.
func (rs *refusals) refusedAny() bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return len(rs.nodes) > 0
}

// won notes that the attempt, a waiting writer's (key, token), was
// granted, and returns the nodes whose mark of it must be taken off now:
// those that refused so far, or, when an earlier attempt was refused
// (before), every node of all that has not granted this one (an earlier
// mark may be there). A refusal that comes from now on takes its own off
// (noteAnswer): one that came after the majority's grants, after the
// caller was answered, and whose mark would otherwise hold readers back
// until it ends.
func (rs *refusals) won(all []*Node, before bool, key, token string) []*Node {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.wasGranted, rs.key, rs.token = true, key, token
	if !before {
		return append([]*Node(nil), rs.nodes...)
	}
	var out []*Node
	for _, n := range all {
		if !slices.Contains(rs.granted, n) {
			out = append(out, n)
		}
	}
	return out
}
