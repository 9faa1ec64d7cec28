package redis

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// Transparent mode's node side: plain Redis commands on lock keys run on
// every node that may vote, each on the node's own key for the lock
// (LockKey: the same string key, holding the holder's token, that LOCK
// uses). Which reply counts is decided by the caller (commands), which sees
// every node's answer. These commands do not go through the batching
// writers: they are plain go-redis calls on the node's pool, one goroutine
// per node, each bounded by fanoutTimeout. A write first waits for what is
// queued on its keys' writers (settleKeys), which it would otherwise
// overtake.

var _ backends.Fanout = (*Backend)(nil)

// NodeCount implements backends.Fanout.
func (b *Backend) NodeCount() int { return len(b.nodes) }

// Drift implements backends.Fanout.
func (b *Backend) Drift(ttl time.Duration) time.Duration { return b.q.Drift(ttl) }

// fanoutTimeout is what each node gets to answer a transparent-mode
// command: the largest node timeout, but at least minFanoutTimeout. These
// commands carry no lease that waiting would eat into (a script
// acquisition subtracts the time it took from its validity), and reads
// return as soon as a majority agrees. Writes wait for every node: a slow
// node delays them, but a write answered early could still be on its way
// to that node when the client's next command (a new acquisition with
// the same token) reaches it, and delete it there.
func (b *Backend) fanoutTimeout() time.Duration {
	return max(b.q.NodeTimeout(time.Duration(1<<62)), minFanoutTimeout)
}

// minFanoutTimeout keeps a loaded node from turning a GET or a release
// into NOQUORUM as readily as the 250 ms an acquisition allows.
const minFanoutTimeout = time.Second

// Run implements backends.Fanout. A command that may write (not
// readOnly) and names lock keys is followed, in the same MULTI, by
// syncHoldsScript: a PEXPIRE of a lock key renews the whole hold, as
// RENEW would, and a DEL leaves no extra holds behind and is announced to
// LOCK … WAIT waiters as an UNLOCK is.
func (b *Backend) Run(ctx context.Context, args []string, keys []int, readOnly bool) []backends.NodeReply {
	return b.each(ctx, readOnly, func(ctx context.Context, n *Node) backends.NodeReply {
		cmd := make([]any, len(args))
		for i, a := range args {
			cmd[i] = a
		}
		for _, k := range keys {
			cmd[k] = n.LockKey(args[k])
		}
		if readOnly || len(keys) == 0 {
			return nodeReply(n.client.Do(ctx, cmd...).Result())
		}
		bases := make([]string, len(keys))
		for i, k := range keys {
			bases[i] = args[k]
		}
		n.settleKeys(ctx, bases)
		var c, sync *goredis.Cmd
		_, err := n.client.TxPipelined(ctx, func(p goredis.Pipeliner) error {
			c = p.Do(ctx, cmd...)
			sync = n.syncHolds(ctx, p, bases)
			return nil
		})
		if err != nil && !isReply(err) {
			return backends.NodeReply{Err: err}
		}
		r := nodeReply(c.Result())
		if r.Err == nil {
			if err := n.syncHoldsDone(ctx, sync, bases); err != nil {
				return backends.NodeReply{Err: err}
			}
		}
		return r
	})
}

// RunEach implements backends.Fanout: on each node the command for every
// key is sent at once, in one MULTI with the line-up of the holds' keys
// for a write (see Run), so that a node that does not answer costs one
// timeout for all the keys, not one each.
func (b *Backend) RunEach(ctx context.Context, name string, keys []string, readOnly bool) []backends.NodeReply {
	return b.each(ctx, readOnly, func(ctx context.Context, n *Node) backends.NodeReply {
		cmds := make([]*goredis.Cmd, len(keys))
		queue := func(p goredis.Pipeliner) {
			for i, k := range keys {
				cmds[i] = p.Do(ctx, name, n.LockKey(k))
			}
		}
		var sync *goredis.Cmd
		var err error
		if readOnly {
			_, err = n.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
				queue(p)
				return nil
			})
		} else {
			n.settleKeys(ctx, keys)
			_, err = n.client.TxPipelined(ctx, func(p goredis.Pipeliner) error {
				queue(p)
				sync = n.syncHolds(ctx, p, keys)
				return nil
			})
		}
		if err != nil && !isReply(err) {
			return backends.NodeReply{Err: err}
		}
		vals := make([]any, len(keys))
		for i, c := range cmds {
			r := nodeReply(c.Result())
			if r.Err != nil {
				return r
			}
			vals[i] = r.Val
		}
		if sync != nil {
			if err := n.syncHoldsDone(ctx, sync, keys); err != nil {
				return backends.NodeReply{Err: err}
			}
		}
		return backends.NodeReply{Val: vals}
	})
}

// settleKeys waits until what was queued on the node's writers for bases
// (client keys) before the call was answered (see Node.startSettle), so
// that a transparent write runs on the node after the operations its
// client's earlier commands left queued there: a release after the SET
// NX it ends finds the key this node granted. It waits for at most half
// the time ctx leaves: a writer busy that long waits for a node that does
// not answer, and the write then goes out unordered, as it did before,
// rather than not at all (a release sent to a paused node still runs when
// the node resumes).
func (n *Node) settleKeys(ctx context.Context, bases []string) {
	// Only keys with operations queued and not yet answered are waited
	// for (inFlight): most writes find none, and a marker would make them
	// wait for a writer's whole batch (several ms under load) for
	// nothing. An operation queued after the count was read cannot have
	// been answered to the client before this write was made.
	var marks []*op
	for _, b := range bases {
		if !n.busy(b) {
			continue
		}
		if marks == nil {
			marks = make([]*op, 0, min(len(bases), len(n.queues)))
			if d, ok := ctx.Deadline(); ok {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, time.Now().Add(time.Until(d)/2))
				defer cancel()
			}
		}
		// One marker per writer the keys go through (each writer
		// answers in queue order), all queued before any is waited for:
		// waited for one by one, a script on many keys would wait for as
		// many batches.
		q := n.queueOf(b)
		if slices.ContainsFunc(marks, func(o *op) bool { return n.queue(o) == q }) {
			continue
		}
		marks = append(marks, n.startSettle(ctx, b))
	}
	for _, o := range marks {
		if n.awaitSettle(ctx, o) != nil {
			return
		}
	}
}

// syncHolds adds syncHoldsScript for the lock keys of bases (client keys)
// to a MULTI.
func (n *Node) syncHolds(ctx context.Context, p goredis.Pipeliner, bases []string) *goredis.Cmd {
	keys := n.syncHoldsKeys(bases)
	args := n.syncHoldsArgs(bases)
	eval := make([]any, 0, 3+len(keys)+len(args))
	eval = append(eval, "evalsha", scriptSyncHolds.sha, len(keys))
	for _, k := range keys {
		eval = append(eval, k)
	}
	return p.Do(ctx, append(eval, args...)...)
}

// syncHoldsArgs is syncHoldsScript's ARGV for bases: readMarker, then
// each key's release channel in the order of its keys, on which the
// script announces the keys the command left free (a transparent
// release), as an UNLOCK does.
func (n *Node) syncHoldsArgs(bases []string) []any {
	args := make([]any, 0, 1+len(bases))
	args = append(args, readMarker)
	for _, b := range bases {
		args = append(args, n.ReleaseChannel(b))
	}
	return args
}

func (n *Node) syncHoldsKeys(bases []string) []string {
	keys := make([]string, 0, keyWriterWaits*len(bases))
	for _, b := range bases {
		keys = append(keys, n.lockKeys(n.LockKey(b), b, keyWriterWaits)...)
	}
	return keys
}

// syncHoldsDone checks syncHolds's answer. A node that had not cached the
// script (restarted, SCRIPT FLUSH) answers NOSCRIPT when the MULTI runs:
// it is run again right after, alone, with the same ARGV; it only reads,
// lines up the holds' keys and announces keys found free, so it may come
// late. An EXECABORT (the command itself was
// refused when queued) ran nothing, and needs nothing.
func (n *Node) syncHoldsDone(ctx context.Context, sync *goredis.Cmd, bases []string) error {
	err := sync.Err()
	switch {
	case err == nil:
		return nil
	case goredis.HasErrorPrefix(err, "EXECABORT"):
		return nil
	case goredis.HasErrorPrefix(err, "NOSCRIPT"):
		_, err = n.eval(ctx, scriptSyncHolds, n.syncHoldsKeys(bases), n.syncHoldsArgs(bases)...)
		if err == nil {
			return nil
		}
	}
	return fmt.Errorf("redis: lining up the holds' keys on %s after a transparent command: %w", n.name, err)
}

// RunScript implements backends.Fanout: MULTI, GET of each key, the
// script, syncHoldsScript (see Run: a script that renews a lock renews
// the whole hold), GET and PTTL of each key, EXEC. Scripts are always
// sent with EVAL (the node caches them by their SHA1 like for EVALSHA),
// so a node that lost its script cache never answers NOSCRIPT half-way
// through a fan-out.
func (b *Backend) RunScript(ctx context.Context, body string, keys, argv []string) []backends.NodeReply {
	return b.each(ctx, false, func(ctx context.Context, n *Node) backends.NodeReply {
		nkeys := make([]string, len(keys))
		for i, k := range keys {
			nkeys[i] = n.LockKey(k)
		}
		eval := make([]any, 0, 3+len(keys)+len(argv))
		eval = append(eval, "eval", body, len(keys))
		for _, k := range nkeys {
			eval = append(eval, k)
		}
		for _, a := range argv {
			eval = append(eval, a)
		}
		n.settleKeys(ctx, keys)
		var before, after, pttls []*goredis.Cmd
		var script, sync *goredis.Cmd
		_, err := n.client.TxPipelined(ctx, func(p goredis.Pipeliner) error {
			for _, k := range nkeys {
				before = append(before, p.Do(ctx, "get", k))
			}
			script = p.Do(ctx, eval...)
			sync = n.syncHolds(ctx, p, keys)
			for _, k := range nkeys {
				after = append(after, p.Do(ctx, "get", k))
				pttls = append(pttls, p.Do(ctx, "pttl", k))
			}
			return nil
		})
		if err != nil && !isReply(err) {
			return backends.NodeReply{Err: err}
		}
		r := nodeReply(script.Result())
		if r.Err != nil {
			return r
		}
		if err := n.syncHoldsDone(ctx, sync, keys); err != nil {
			return backends.NodeReply{Err: err}
		}
		r.Writes = make([]backends.KeyWrite, len(keys))
		// Lock keys the script found or left holding another type than a
		// string, and of those the ones it made so: held nothing or a
		// string token before it (one that deleted the token and stored a
		// hash in its place made the hash as surely as on a free key).
		var nonString, created []string
		for i := range keys {
			was, errB := before[i].Result()
			now, errA := after[i].Result()
			ttl, errT := pttls[i].Int64()
			if wrongType(errB) || wrongType(errA) {
				nonString = append(nonString, nkeys[i])
				if notNil(errB) == nil && wrongType(errA) {
					created = append(created, nkeys[i])
				}
				if wrongType(errB) && errA == nil && errT == nil {
					// It replaced another type with a string (SET over a
					// hash): that string is its write, to be rolled back
					// with its others, or the refused client's token
					// would hold the key for its whole TTL.
					nowS, _ := now.(string)
					r.Writes[i] = backends.KeyWrite{Wrote: true, Exists: true, Value: nowS, PTTL: ttl}
				}
				continue
			}
			if e := errors.Join(notNil(errB), notNil(errA), errT); e != nil {
				if isReply(e) {
					// EXECABORT: nothing in the transaction ran.
					r.Writes = nil
					return r
				}
				return backends.NodeReply{Err: fmt.Errorf("redis: reading %s around a script: %w", n.name, e)}
			}
			nowS, isStr := now.(string)
			wasS, _ := was.(string)
			r.Writes[i] = backends.KeyWrite{
				Wrote:  isStr && (was == nil || wasS != nowS),
				Exists: isStr,
				Value:  nowS,
				PTTL:   ttl,
			}
		}
		if len(nonString) > 0 {
			// The writes to the script's string keys are kept in the
			// answer: the caller rolls them back (a refused script is no
			// acquisition).
			return n.nonStringLock(ctx, created, r.Writes)
		}
		return r
	})
}

// wrongType tells whether err is Redis's WRONGTYPE: GET of a key that
// holds something other than a string.
func wrongType(err error) bool {
	return isReply(err) && strings.HasPrefix(err.Error(), "WRONGTYPE")
}

// errNonStringLock is every node's answer to a script that finds or leaves
// a lock key holding something other than a string.
const errNonStringLock = "ERR transparent mode: a lock key holds a string token (the SET NX PX kind of lock); the script found or stored another type (a hash lock, as Redisson's, is not served): use LOCK, or a string lock"

// dropNonStringScript deletes KEYS[1] unless it holds a string (or nothing).
var dropNonStringScript = goredis.NewScript(`if redis.call("type", KEYS[1]).ok ~= "string" then return redis.call("del", KEYS[1]) end return 0`)

// nonStringLock answers a script that found (or, created, stored where
// there was nothing or a string token) a value other than a string at a
// lock key. The
// acquisition rule sees writes by comparing string values, so such a
// script's effect cannot be judged, nor rolled back where it is a
// minority: it is refused, and what it created is deleted, which puts
// those keys back as they were (lock keys hold nothing but string
// tokens, so no other client's value of another type can be there). The
// answer keeps writes, what the script did to its string lock keys, for
// the caller to roll back the values it wrote there; what it deleted
// cannot be put back.
func (n *Node) nonStringLock(ctx context.Context, created []string, writes []backends.KeyWrite) backends.NodeReply {
	for _, key := range created {
		if err := dropNonStringScript.Run(ctx, n.client, []string{key}).Err(); err != nil {
			return backends.NodeReply{Err: fmt.Errorf("redis: deleting a script's non-string lock value on %s: %w", n.name, err)}
		}
	}
	return backends.NodeReply{Val: backends.ReplyError(errNonStringLock), Writes: writes}
}

// undoScript deletes KEYS[1] if it still holds ARGV[1].
var undoScript = goredis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) end return 0`)

// undoUnfencedScript deletes KEYS[1] if it still holds ARGV[1] and
// KEYS[2] (lockf) stores no fence for ARGV[1]: every grant's hold has
// one (LOCK's fence write, a script grant's Fence), a script's write that
// was not granted has none. A lockf left by an earlier holder of another
// token does not keep the key.
var undoUnfencedScript = goredis.NewScript(`if redis.call("get", KEYS[1]) ~= ARGV[1] then return 0 end
local f = redis.call("get", KEYS[2])
if f then
  local c = string.find(f, ",", 1, true)
  if c and string.sub(f, c + 1) == ARGV[1] then return 0 end
end
return redis.call("del", KEYS[1])`)

// Undo implements backends.Fanout. Like a release it is sent whether or
// not the node may vote.
func (b *Backend) Undo(ctx context.Context, node int, keys, values []string, unfenced bool) error {
	if node < 0 || node >= len(b.nodes) {
		return fmt.Errorf("redis: no node %d", node)
	}
	n := b.nodes[node]
	ctx, cancel := context.WithTimeout(ctx, b.fanoutTimeout())
	defer cancel()
	var errs []error
	for i, k := range keys {
		s, ks := undoScript, []string{n.LockKey(k)}
		if unfenced {
			s, ks = undoUnfencedScript, append(ks, n.prefix+"lockf:"+k)
		}
		if err := s.Run(ctx, n.client, ks, values[i]).Err(); err != nil {
			errs = append(errs, fmt.Errorf("redis: undo on %s: %w", n.name, err))
		}
	}
	return errors.Join(errs...)
}

// Fence implements backends.Fanout.
func (b *Backend) Fence(ctx context.Context, nodes []int, key, token string) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, b.fanoutTimeout())
	defer cancel()
	field := strconv.Itoa(int(slot(key)))
	counters := make([]int64, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, idx := range nodes {
		if idx < 0 || idx >= len(b.nodes) {
			return 0, fmt.Errorf("redis: no node %d", idx)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := b.nodes[idx]
			counters[i], errs[i] = n.client.HIncrBy(ctx, n.fenceKey, field, 1).Result()
		}()
	}
	wg.Wait()
	var fence int64
	for i, c := range counters {
		if errs[i] == nil {
			fence = max(fence, c)
		}
	}
	if fence == 0 {
		return 0, fmt.Errorf("redis: fence for a script acquisition: %w", errors.Join(errs...))
	}
	raised := make([]bool, len(nodes))
	for i, idx := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			raised[i], errs[i] = b.nodes[idx].RaiseFence(ctx, key, token, uint64(fence))
		}()
	}
	wg.Wait()
	// The fence counts only where it was raised: a later grant reads the
	// counters of a majority, which must meet one raised to it, or its
	// fence may be this one's or lower (as LOCK's settleFence).
	ok := 0
	var failures []quorum.NodeError
	for i, idx := range nodes {
		switch {
		case errs[i] != nil:
			failures = append(failures, quorum.NodeError{Node: b.nodes[idx].name, Err: errs[i]})
		case raised[i]:
			ok++
		default:
			failures = append(failures, quorum.NodeError{Node: b.nodes[idx].name, Err: errFenceHoldLost})
		}
	}
	if ok < len(b.nodes)/2+1 {
		return 0, &quorum.NoQuorumError{OK: ok, Total: len(b.nodes), Failures: failures}
	}
	return uint64(fence), nil
}

// errFenceHoldLost is a holder's failure when raising a script
// acquisition's fence found the hold gone there.
var errFenceHoldLost error = fenceHoldLostError{}

type fenceHoldLostError struct{}

func (fenceHoldLostError) Error() string  { return "redis: hold lost before its fence was stored" }
func (fenceHoldLostError) Reason() string { return "hold lost before its fence was stored" }

// each runs do on every node at once and waits for all of them, each
// bounded by fanoutTimeout; with early, it returns as soon as a majority of
// all nodes gave the same reply, and the nodes still out are reported as
// not waited for. A node that may not vote is not asked, and an answer
// that arrives across a restart of its node counts as none: it comes from
// a server that forgot its locks.
func (b *Backend) each(ctx context.Context, early bool, do func(context.Context, *Node) backends.NodeReply) []backends.NodeReply {
	type answer struct {
		i int
		r backends.NodeReply
	}
	out := make([]backends.NodeReply, len(b.nodes))
	got := make([]bool, len(b.nodes))
	// Buffered for every node: a goroutine never waits for a collector
	// that returned early.
	answers := make(chan answer, len(b.nodes))
	timeout := b.fanoutTimeout()
	for i, n := range b.nodes {
		if err := n.health.refuse(); err != nil {
			answers <- answer{i, backends.NodeReply{Node: n.name, Err: err}}
			continue
		}
		go func() {
			nctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			gen := n.health.gen.Load()
			r := do(nctx, n)
			if n.health.gen.Load() != gen && n.health.restarting() {
				r = backends.NodeReply{Err: errQuarantined}
			}
			r.Node = n.name
			answers <- answer{i, r}
		}()
	}
	need := len(b.nodes)/2 + 1
	for range b.nodes {
		a := <-answers
		out[a.i], got[a.i] = a.r, true
		if early && a.r.Err == nil && agreeing(out, got, a.r.Val) >= need {
			for i, ok := range got {
				if !ok {
					out[i] = backends.NodeReply{Node: b.nodes[i].name, Err: errNotWaited}
				}
			}
			return out
		}
	}
	return out
}

// errNotWaited marks a node whose answer was not needed: a majority had
// already given the same reply.
var errNotWaited = errors.New("redis: not waited for, a majority agreed")

// agreeing counts the answers equal to v.
func agreeing(out []backends.NodeReply, got []bool, v any) int {
	n := 0
	for i, r := range out {
		if got[i] && r.Err == nil && reflect.DeepEqual(r.Val, v) {
			n++
		}
	}
	return n
}

// nodeReply turns a go-redis result into a NodeReply: a nil reply is a
// nil value, an error reply a ReplyError value, any other error a node
// failure.
func nodeReply(v any, err error) backends.NodeReply {
	switch {
	case err == nil:
		return backends.NodeReply{Val: replyValue(v)}
	case errors.Is(err, goredis.Nil):
		return backends.NodeReply{}
	case notNowReply(err):
		// The node did not run the command: no answer to agree on, as
		// for LOCK, and never a reply for the client, which would act
		// on it as on its own server's (retry, reconnect, redirect).
		return backends.NodeReply{Err: err}
	case isReply(err):
		return backends.NodeReply{Val: backends.ReplyError(err.Error())}
	default:
		return backends.NodeReply{Err: err}
	}
}

// notNowReplies are the prefixes of the error replies with which a node
// refuses a command it did not run, for now or in its present role: busy
// with another client's script, loading its data, a replica, a cluster
// redirect or outage. Clients act on these prefixes (PROTOCOL.md forbids
// them in lockproxy's replies).
var notNowReplies = []string{"BUSY", "LOADING", "TRYAGAIN", "READONLY", "MOVED", "ASK", "MASTERDOWN", "CLUSTERDOWN", "NOPROTO"}

// notNowReply tells whether err is an error reply of notNowReplies: the
// node did not answer the command.
func notNowReply(err error) bool {
	if !isReply(err) {
		return false
	}
	m := err.Error()
	for _, p := range notNowReplies {
		if strings.HasPrefix(m, p) && (len(m) == len(p) || m[len(p)] == ' ') {
			return true
		}
	}
	return false
}

// isReply reports whether err is an error reply from the server rather
// than a failure to talk to it.
func isReply(err error) bool {
	var re goredis.Error
	return errors.As(err, &re)
}

// notNil drops goredis.Nil, which only means the key was absent.
func notNil(err error) error {
	if errors.Is(err, goredis.Nil) {
		return nil
	}
	return err
}

// replyValue converts the error replies nested in arrays.
func replyValue(v any) any {
	switch t := v.(type) {
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = replyValue(e)
		}
		return out
	case error:
		return backends.ReplyError(t.Error())
	default:
		return v
	}
}
