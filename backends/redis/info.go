package redis

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// nodeLockState is one node's view of a lock, as the info script reports
// it. held is false when the key is free on the node.
type nodeLockState struct {
	held       bool
	value      string // the write holder's token, or readMarker
	ttl        time.Duration
	fence      uint64 // stored with the write hold
	extraHolds int64
	readers    map[string]readerState
	counter    uint64 // the slot's fence counter
}

type readerState struct {
	ttl   time.Duration
	holds int64
}

// LockState reads key's state on this node. It is not on any hot path, so
// it goes straight to the node rather than through the batching writer.
func (n *Node) LockState(ctx context.Context, key string) (nodeLockState, error) {
	// Read before the check, as in Node.exec: a restart that the read's
	// own new connection reveals (onConnect) shows as a new generation,
	// and the answer, from the server that forgot its locks, is no view.
	gen := n.health.gen.Load()
	if err := n.health.refuse(); err != nil {
		return nodeLockState{}, err
	}
	keys := n.lockKeys(n.LockKey(key), key, numLockKeys)
	args := []any{slot(key), readMarker}
	v, err := n.client.EvalSha(ctx, scriptInfo.sha, keys, args...).Result()
	if err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
		v, err = n.client.Eval(ctx, scriptInfo.src, keys, args...).Result()
	}
	if err != nil {
		return nodeLockState{}, err
	}
	if err := n.answeredBy(gen); err != nil {
		return nodeLockState{}, err
	}
	return parseLockState(v)
}

func parseLockState(v any) (nodeLockState, error) {
	if i, ok := v.(int64); ok && i == 0 {
		return nodeLockState{}, nil
	}
	a, ok := v.([]any)
	if !ok || len(a) != 8 {
		return nodeLockState{}, fmt.Errorf("unexpected reply to the info script: %.60v", v)
	}
	st := nodeLockState{held: true, readers: map[string]readerState{}}
	var bad bool
	str := func(x any) string {
		s, ok := x.(string)
		bad = bad || !ok
		return s
	}
	num := func(x any) int64 {
		switch x := x.(type) {
		case int64:
			return x
		case string:
			i, err := strconv.ParseInt(x, 10, 64)
			bad = bad || err != nil
			return i
		}
		bad = true
		return 0
	}
	st.value = str(a[0])
	st.ttl = time.Duration(max(num(a[1]), 0)) * time.Millisecond
	st.fence = uint64(max(num(a[2]), 0))
	st.extraHolds = max(num(a[3]), 0)
	now := num(a[4])
	st.counter = uint64(max(num(a[7]), 0))
	readers, ok1 := a[5].([]any)
	holds, ok2 := a[6].([]any)
	if !ok1 || !ok2 || len(readers)%2 != 0 || len(holds)%2 != 0 {
		bad = true
	} else {
		h := map[string]int64{}
		for i := 0; i < len(holds); i += 2 {
			if f := str(holds[i]); !strings.HasPrefix(f, attemptField) { // a read attempt's mark
				h[f] = num(holds[i+1])
			}
		}
		for i := 0; i < len(readers); i += 2 {
			end := num(readers[i+1])
			tok := str(readers[i])
			st.readers[tok] = readerState{ttl: time.Duration(max(end-now, 0)) * time.Millisecond, holds: max(h[tok], 1)}
		}
	}
	if bad {
		return nodeLockState{}, fmt.Errorf("unexpected reply to the info script: %.60v", v)
	}
	return st, nil
}

// Info implements backends.Backend. It asks every node that may vote and
// reports what a majority agrees on: a holder is one that holds the key on
// a majority, and each number is the one a majority reaches (the
// majority-th largest), but a read lock's fence, which is at least every
// reader's (see combineLockStates). A TTL is what a majority would still honour, less
// the time the question took and the drift allowance for that span, as a
// grant's validity is: never longer than a holder may rely on. When the
// nodes that failed to answer could change the answer (a token seen on
// fewer than a majority of those that answered, but on a majority with
// them; a write holder's fence that no majority of the answers stored but
// one with them could; a hold count they could raise), it answers
// NOQUORUM rather than guess, as UNLOCK does.
func (b *Backend) Info(ctx context.Context, key string) (backends.LockInfo, bool, error) {
	need := b.q.Majority()
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, b.q.NodeTimeout(time.Hour))
	defer cancel()
	type answer struct {
		st  nodeLockState
		err error
		idx int
	}
	answers := make(chan answer, len(b.nodes))
	for i, nd := range b.nodes {
		go func() {
			st, err := nd.LockState(ctx, key)
			answers <- answer{st, err, i}
		}()
	}
	var states []nodeLockState
	var failures []quorum.NodeError
	for range b.nodes {
		a := <-answers
		if a.err != nil {
			failures = append(failures, quorum.NodeError{Node: b.nodes[a.idx].Name(), Err: a.err})
			continue
		}
		states = append(states, a.st)
	}
	noQuorum := &quorum.NoQuorumError{OK: len(states), Total: len(b.nodes), Failures: failures}
	if len(states) < need {
		return backends.LockInfo{}, false, noQuorum
	}
	elapsed := time.Since(start)
	honoured := func(ttl time.Duration) time.Duration {
		return max(ttl-elapsed-b.q.Drift(ttl), 0)
	}
	info, ok, decided := combineLockStates(states, need, len(failures), honoured)
	if !decided {
		return backends.LockInfo{}, false, noQuorum
	}
	info.Waiters = b.waiters.count(key)
	return info, ok, nil
}

// combineLockStates reduces the nodes' views to what need of them agree on.
// failed nodes did not answer; decided is false when their answers could
// have made another token a holder, another stored fence the write
// holder's, or a holder's hold count higher. honoured turns the TTL a majority
// reaches into the one reported.
func combineLockStates(states []nodeLockState, need, failed int, honoured func(time.Duration) time.Duration) (info backends.LockInfo, held, decided bool) {
	// kthOf is the k-th largest of xs, 0 when there are fewer.
	kthOf := func(xs []int64, k int) int64 {
		if len(xs) < k {
			return 0
		}
		slices.Sort(xs)
		return xs[len(xs)-k]
	}
	// kth is the need-th largest of xs: the value a majority reaches.
	kth := func(xs []int64) int64 { return kthOf(xs, need) }
	// holdsDecided tells whether the failed nodes could not raise the
	// need-th largest of a token's hold counts: with their counts it
	// lies between that of the answers and their (need-failed)-th
	// largest. An undercount is no safe side: the keepalive watchdogs
	// take fewer holds left than they count for one of theirs released.
	holdsDecided := func(holds []int64) bool {
		return failed == 0 || kthOf(holds, need) == kthOf(holds, max(need-failed, 1))
	}
	writers := map[string]int{}
	for _, st := range states {
		if st.held && st.value != readMarker {
			writers[st.value]++
		}
	}
	for tok, c := range writers {
		if c < need {
			continue
		}
		// Two write holders cannot both hold a majority: this one is
		// the holder whatever the failed nodes would say.
		var ttls, holds []int64
		var fences []uint64
		var counter uint64
		for _, st := range states {
			if st.held && st.value == tok {
				ttls = append(ttls, int64(st.ttl))
				holds = append(holds, st.extraHolds+1)
				fences = append(fences, st.fence)
				if st.fence == 0 {
					counter = max(counter, st.counter)
				}
			}
		}
		// The fence is the one a majority stored (the grant's), when
		// one did among the answers. Otherwise, when the failed nodes
		// could make one of the stored fences the majority's, that
		// one is the grant's and LOCKINFO cannot tell which: the
		// highest stored (a late node's own) may be above the fence
		// the next holder, granted without that node, gets.
		if failed > 0 && (!fenceDecided(fences, need, failed) || !holdsDecided(holds)) {
			return backends.LockInfo{}, false, false
		}
		ttl := honoured(time.Duration(kth(ttls)))
		return backends.LockInfo{
			Mode:    backends.Write,
			Holders: []backends.Holder{{Token: tok, Holds: kth(holds), TTL: ttl}},
			TTL:     ttl,
			Fence:   quorum.HoldFence(fences, counter, need),
		}, true, true
	}
	for _, c := range writers {
		if c+failed >= need {
			return backends.LockInfo{}, false, false
		}
	}
	seen := map[string]bool{}
	info.Mode = backends.Read
	var counters []int64
	for _, st := range states {
		counters = append(counters, int64(st.counter))
		for tok := range st.readers {
			if seen[tok] {
				continue
			}
			seen[tok] = true
			var ttls, holds []int64
			for _, o := range states {
				// A node where tok holds the key for writing too (a
				// downgrade) holds its read hold as well: no writer
				// but tok is granted there. Left out, a reader whose
				// majority includes such a node (its write hold on a
				// minority) was not listed, and the key answered free
				// while every rival LOCK was refused.
				if r, ok := o.readers[tok]; ok && o.held && (o.value == readMarker || o.value == tok) {
					ttls = append(ttls, int64(r.ttl))
					holds = append(holds, r.holds)
				}
			}
			if len(ttls) < need {
				if len(ttls)+failed >= need {
					return backends.LockInfo{}, false, false
				}
				continue
			}
			if !holdsDecided(holds) {
				return backends.LockInfo{}, false, false
			}
			h := backends.Holder{Token: tok, Holds: kth(holds), TTL: honoured(time.Duration(kth(ttls)))}
			info.Holders = append(info.Holders, h)
			if len(info.Holders) == 1 || h.TTL < info.TTL {
				info.TTL = h.TTL
			}
		}
	}
	if len(info.Holders) == 0 {
		return backends.LockInfo{}, false, true
	}
	slices.SortFunc(info.Holders, func(a, b backends.Holder) int { return int(b.TTL - a.TTL) })
	// A reader's fence is on a majority (settleFence), of which the failed
	// nodes may be part: need-failed of those that answered are sure to
	// be at it, so their least counter is at least every reader's fence.
	// The need-th largest of the answers alone can be a lagging node's
	// counter, below a fence a reader was granted.
	info.Fence = uint64(kthOf(counters, max(need-failed, 1)))
	return info, true, true
}

// fenceDecided tells whether the fence a majority stored is known from
// stored, the fences the answering nodes holding the key stored: either
// one has need votes, or none could reach need with the failed nodes'.
func fenceDecided(stored []uint64, need, failed int) bool {
	votes := map[uint64]int{}
	most := 0
	for _, f := range stored {
		if f > 0 {
			votes[f]++
			most = max(most, votes[f])
		}
	}
	return most >= need || most+failed < need
}
