package redis

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// drained drains one channel of each of ws, as ch picks it, and returns
// the names of those that had a signal, in name order.
func drained(ws map[string]*waiter, ch func(*waiter) chan struct{}) []string {
	var got []string
	for name, w := range ws {
		select {
		case <-ch(w):
			got = append(got, name)
		default:
		}
	}
	slices.Sort(got)
	return got
}

func turnOf(w *waiter) chan struct{}     { return w.turn }
func promotedOf(w *waiter) chan struct{} { return w.promoted }

func TestWaitQueues(t *testing.T) {
	type step struct {
		op       string // join, leave (gave up), grant (left with the lock), watch, wake
		who, key string
		node     int      // wake: the node that announced the release
		flag     bool     // join, watch: key became watched; leave, grant: key stopped being watched; wake: key had waiters
		signaled []string // waiters with a pending turn after the step
		promoted []string // waiters told they became the head, not to try
		heads    []string // waiters at the head of their queue after the step
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"first waiter is head and tries at once, unwatched", []step{
			{op: "join", who: "a", key: "k", signaled: []string{"a"}, heads: []string{"a"}},
			{op: "grant", who: "a"},
		}},
		{"later waiters sleep until their turn; the second watches", []step{
			{op: "join", who: "a", key: "k", signaled: []string{"a"}, heads: []string{"a"}},
			{op: "join", who: "b", key: "k", flag: true, heads: []string{"a"}},
			{op: "join", who: "c", key: "k", heads: []string{"a"}},
			{op: "wake", key: "k", flag: true, signaled: []string{"a"}, heads: []string{"a"}},
			{op: "wake", key: "k", flag: true, signaled: []string{"a"}, heads: []string{"a"}},
		}},
		{"a failed attempt watches", []step{
			{op: "join", who: "a", key: "k", signaled: []string{"a"}, heads: []string{"a"}},
			{op: "watch", key: "k", flag: true, heads: []string{"a"}},
			{op: "watch", key: "k", flag: false, heads: []string{"a"}},
			{op: "join", who: "b", key: "k", flag: false, heads: []string{"a"}},
			{op: "leave", who: "b", heads: []string{"a"}},
			{op: "grant", who: "a", flag: true},
			{op: "watch", key: "k", flag: false},
		}},
		{"a granted head hands over: the next waits for the release", []step{
			{op: "join", who: "a", key: "k", signaled: []string{"a"}, heads: []string{"a"}},
			{op: "join", who: "b", key: "k", flag: true, heads: []string{"a"}},
			{op: "join", who: "c", key: "k", heads: []string{"a"}},
			{op: "grant", who: "a", promoted: []string{"b"}, heads: []string{"b"}},
			{op: "wake", key: "k", flag: true, signaled: []string{"b"}, heads: []string{"b"}},
			{op: "grant", who: "b", promoted: []string{"c"}, heads: []string{"c"}},
			{op: "wake", key: "k", flag: true, signaled: []string{"c"}, heads: []string{"c"}},
			{op: "grant", who: "c", flag: true},
			{op: "wake", key: "k", flag: false},
		}},
		{"a head that gives up lets the next try at once", []step{
			{op: "join", who: "a", key: "k", signaled: []string{"a"}, heads: []string{"a"}},
			{op: "join", who: "b", key: "k", flag: true, heads: []string{"a"}},
			{op: "leave", who: "a", signaled: []string{"b"}, heads: []string{"b"}},
			{op: "leave", who: "b", flag: true},
		}},
		{"a waiter behind the head leaves quietly", []step{
			{op: "join", who: "a", key: "k", signaled: []string{"a"}, heads: []string{"a"}},
			{op: "join", who: "b", key: "k", flag: true, heads: []string{"a"}},
			{op: "join", who: "c", key: "k", heads: []string{"a"}},
			{op: "leave", who: "b", heads: []string{"a"}},
			{op: "grant", who: "a", promoted: []string{"c"}, heads: []string{"c"}},
			{op: "leave", who: "c", flag: true},
		}},
		{"the tail leaves", []step{
			{op: "join", who: "a", key: "k", signaled: []string{"a"}, heads: []string{"a"}},
			{op: "join", who: "b", key: "k", flag: true, heads: []string{"a"}},
			{op: "leave", who: "b", heads: []string{"a"}},
			{op: "join", who: "c", key: "k", heads: []string{"a"}},
			{op: "grant", who: "a", promoted: []string{"c"}, heads: []string{"c"}},
			{op: "wake", key: "k", flag: true, signaled: []string{"c"}, heads: []string{"c"}},
		}},
		{"keys are independent", []step{
			{op: "join", who: "a", key: "k1", signaled: []string{"a"}, heads: []string{"a"}},
			{op: "join", who: "b", key: "k2", signaled: []string{"b"}, heads: []string{"a", "b"}},
			{op: "join", who: "c", key: "k1", flag: true, heads: []string{"a", "b"}},
			{op: "wake", key: "k2", flag: true, signaled: []string{"b"}, heads: []string{"a", "b"}},
			{op: "grant", who: "b", heads: []string{"a"}},
			{op: "wake", key: "k2", flag: false, heads: []string{"a"}},
			{op: "leave", who: "a", signaled: []string{"c"}, heads: []string{"c"}},
		}},
		{"a release announced by every node wakes the head once", []step{
			{op: "join", who: "a", key: "k", signaled: []string{"a"}, heads: []string{"a"}},
			{op: "join", who: "b", key: "k", flag: true, heads: []string{"a"}},
			{op: "wake", key: "k", node: 0, flag: true, signaled: []string{"a"}, heads: []string{"a"}},
			{op: "wake", key: "k", node: 1, flag: true, heads: []string{"a"}},
			{op: "wake", key: "k", node: 2, flag: true, heads: []string{"a"}},
			// The next release, announced in another order.
			{op: "wake", key: "k", node: 2, flag: true, signaled: []string{"a"}, heads: []string{"a"}},
			{op: "wake", key: "k", node: 0, flag: true, heads: []string{"a"}},
			// A late announcement of that release reaches the next head
			// quietly.
			{op: "grant", who: "a", promoted: []string{"b"}, heads: []string{"b"}},
			{op: "wake", key: "k", node: 1, flag: true, heads: []string{"b"}},
			{op: "wake", key: "k", node: 1, flag: true, signaled: []string{"b"}, heads: []string{"b"}},
		}},
		{"a node beyond the first 64 always wakes", []step{
			{op: "join", who: "a", key: "k", signaled: []string{"a"}, heads: []string{"a"}},
			{op: "wake", key: "k", node: 64, flag: true, signaled: []string{"a"}, heads: []string{"a"}},
			{op: "wake", key: "k", node: 64, flag: true, signaled: []string{"a"}, heads: []string{"a"}},
		}},
		{"leaving twice is harmless", []step{
			{op: "join", who: "a", key: "k", signaled: []string{"a"}, heads: []string{"a"}},
			{op: "join", who: "b", key: "k", flag: true, heads: []string{"a"}},
			{op: "leave", who: "a", signaled: []string{"b"}, heads: []string{"b"}},
			{op: "leave", who: "a", flag: false, heads: []string{"b"}},
		}},
		{"a key can be waited on again after its queue emptied", []step{
			{op: "join", who: "a", key: "k", signaled: []string{"a"}, heads: []string{"a"}},
			{op: "join", who: "b", key: "k", flag: true, heads: []string{"a"}},
			{op: "grant", who: "a", promoted: []string{"b"}, heads: []string{"b"}},
			{op: "grant", who: "b", flag: true},
			{op: "join", who: "c", key: "k", signaled: []string{"c"}, heads: []string{"c"}},
			{op: "join", who: "d", key: "k", flag: true, heads: []string{"c"}},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			qs := newWaitQueues(1, 0)
			ws := map[string]*waiter{}
			for i, s := range tc.steps {
				var flag bool
				switch s.op {
				case "join":
					ws[s.who], flag = qs.join(s.key, false)
				case "leave":
					flag = qs.leave(ws[s.who], false)
				case "grant":
					flag = qs.leave(ws[s.who], true)
				case "watch":
					flag = qs.watch(s.key)
				case "wake":
					flag = qs.wake(s.key, s.node)
				default:
					t.Fatalf("step %d: unknown op %q", i, s.op)
				}
				desc := fmt.Sprintf("step %d: %s %s%s", i, s.op, s.who, s.key)
				if s.op == "wake" {
					desc += fmt.Sprintf(" from node %d", s.node)
				}
				if flag != s.flag {
					t.Errorf("%s = %v; want %v", desc, flag, s.flag)
				}
				if got := drained(ws, turnOf); !slices.Equal(got, s.signaled) {
					t.Errorf("%s: signaled %v; want %v", desc, got, s.signaled)
				}
				if got := drained(ws, promotedOf); !slices.Equal(got, s.promoted) {
					t.Errorf("%s: promoted %v; want %v", desc, got, s.promoted)
				}
				var heads []string
				queued := 0
				for name, w := range ws {
					if qs.isHead(w) {
						heads = append(heads, name)
					}
					if w.queued {
						queued++
					}
				}
				slices.Sort(heads)
				if !slices.Equal(heads, s.heads) {
					t.Errorf("%s: heads %v; want %v", desc, heads, s.heads)
				}
				if got := qs.len(); got != queued {
					t.Errorf("%s: len() = %d; want %d", desc, got, queued)
				}
			}
		})
	}
}

// TestWaitQueuesFIFO runs waiters against a simulated lock the way
// Backend.Lock does: only signaled waiters try, a release announced by
// every node wakes the head.
// Every waiter that does not give up is granted exactly once, in the order
// the waiters joined, with one attempt per grant.
func TestWaitQueuesFIFO(t *testing.T) {
	tests := []struct {
		name    string
		waiters int
		giveUp  func(i int) bool // waiters that leave before their turn
	}{
		{"all wait", 300, func(int) bool { return false }},
		{"every third gives up", 300, func(i int) bool { return i%3 == 1 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			qs := newWaitQueues(1, 0)
			// Each release is announced by three nodes.
			announce := func() {
				for node := range 3 {
					qs.wake("k", node)
				}
			}
			var (
				held     atomic.Bool
				attempts atomic.Int64
				mu       sync.Mutex
				order    []int
				wg       sync.WaitGroup
			)
			// The first waiter is granted the lock and holds it while the
			// queue fills.
			held.Store(true)
			holder, _ := qs.join("k", false)
			<-holder.turn
			ws := make([]*waiter, tc.waiters)
			for i := range ws {
				ws[i], _ = qs.join("k", false)
			}
			qs.leave(holder, true)
			for i, w := range ws {
				if tc.giveUp(i) {
					qs.leave(w, false)
				}
			}
			for i, w := range ws {
				if tc.giveUp(i) {
					continue
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-w.turn:
						case <-time.After(10 * time.Second):
							t.Errorf("waiter %d: no turn within 10 s", i)
							qs.leave(w, false)
							return
						}
						attempts.Add(1)
						if !held.CompareAndSwap(false, true) {
							continue
						}
						mu.Lock()
						order = append(order, i)
						mu.Unlock()
						qs.leave(w, true)
						held.Store(false)
						announce()
						return
					}
				}()
			}
			held.Store(false)
			announce()
			wg.Wait()

			var want []int
			for i := range ws {
				if !tc.giveUp(i) {
					want = append(want, i)
				}
			}
			if !slices.Equal(order, want) {
				t.Errorf("grant order %v; want %v", order, want)
			}
			if got := attempts.Load(); got != int64(len(want)) {
				t.Errorf("%d attempts for %d grants; want one per grant", got, len(want))
			}
			if qs.len() != 0 || qs.watched("k") {
				t.Errorf("queue not empty at the end: len %d", qs.len())
			}
		})
	}
}

// TestWaitWakeOnMajority: with three nodes a release wakes the head when
// the second node announces it (the key is then free on a majority), once.
func TestWaitWakeOnMajority(t *testing.T) {
	qs := newWaitQueues(2, 0)
	a, _ := qs.join("k", false)
	<-a.turn
	signaled := func() bool {
		select {
		case <-a.turn:
			return true
		default:
			return false
		}
	}
	for i, step := range []struct {
		node int
		want bool
	}{
		{0, false}, {1, true}, {2, false}, // one release
		{1, false}, {2, true}, {0, false}, // the next, another order
	} {
		qs.wake("k", step.node)
		if got := signaled(); got != step.want {
			t.Errorf("step %d (node %d): signaled %v; want %v", i, step.node, got, step.want)
		}
	}
}

// TestWaitWakeEarly: a release announced by fewer than a majority of nodes
// (the others' subscriptions down or lagging) still signals the head,
// soon after the first announcement; one announced by a majority signals
// it at once and only once; a queue that empties before the early signal
// is left alone.
func TestWaitWakeEarly(t *testing.T) {
	const soon = 20 * time.Millisecond
	qs := newWaitQueues(3, soon)
	a, _ := qs.join("k", false)
	<-a.turn

	// Two of five nodes: no signal at once, one after soon. A signal seen
	// at the first look is early only if soon has not passed since the
	// first announcement: on a loaded machine this goroutine may look
	// later than that.
	first := time.Now()
	qs.wake("k", 3)
	qs.wake("k", 4)
	select {
	case <-a.turn:
		if since := time.Since(first); since < soon {
			t.Fatalf("signaled %v after a minority announced a release; want soon (%v) after", since, soon)
		}
	default:
		select {
		case <-a.turn:
		case <-time.After(5 * time.Second):
			t.Fatal("not signaled after a minority announced a release")
		}
	}

	// A majority: at once, and the early signal is called off.
	for _, n := range []int{0, 1, 2} {
		qs.wake("k", n)
	}
	select {
	case <-a.turn:
	default:
		t.Fatal("not signaled when a majority announced")
	}
	time.Sleep(10 * soon)
	select {
	case <-a.turn:
		t.Fatal("signaled twice for one release")
	default:
	}

	// The queue empties before the early signal is due.
	qs.wake("k", 3) // a new release: node 3 was heard in the last one
	qs.leave(a, true)
	time.Sleep(10 * soon)
	if qs.len() != 0 {
		t.Fatalf("waiters = %d; want 0", qs.len())
	}
	b, _ := qs.join("k", false)
	<-b.turn
	time.Sleep(10 * soon)
	select {
	case <-b.turn:
		t.Fatal("a new queue got the old queue's early signal")
	default:
	}
}
