package redis

// Releasing and renewing one kind of a token's holds (backends.HoldKeeper).
// A downgraded token holds a key both for writing and for reading, and a
// KEEPALIVE watchdog may keep only one of the two: it must release and
// renew that one. UNLOCK's release takes the write hold first, and RENEW's
// extend script resets the write lease to the TTL it is given, which for a
// watchdog of the read hold is the read TTL.
//
// These run on a quorum per kind, over the same nodes seen through
// holdNode, so that majorities, failures and validities are judged exactly
// as for UNLOCK and RENEW. Both go through the nodes' batching writers:
// a watchdog renews every TTL/3, which with thousands of KEEPALIVE locks
// is thousands of renewals a second (see Node.extendHold). The renewals
// have scripts of their own that renew one kind of hold only and never
// shorten a lease: a watchdog renews every hold of the token of that
// kind, also those taken without KEEPALIVE on other connections, whose
// holders were told of a lease of their own.

import (
	"context"
	"fmt"
	"math"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

var _ backends.HoldKeeper = (*Backend)(nil)

// newHoldQuorums builds the quorum of each kind of hold over nodes.
func newHoldQuorums(nodes []*Node, qc quorum.Config) ([2]*quorum.Quorum, error) {
	var qs [2]*quorum.Quorum
	for _, mode := range []backends.Mode{backends.Write, backends.Read} {
		hn := make([]quorum.Node, len(nodes))
		for i, n := range nodes {
			hn[i] = holdNode{n: n, mode: mode}
		}
		q, err := quorum.New(hn, qc)
		if err != nil {
			return qs, fmt.Errorf("%v hold quorum: %w", mode, err)
		}
		qs[mode] = q
	}
	return qs, nil
}

// UnlockHold implements backends.HoldKeeper: one hold of the kind mode
// says, the other kind left as it is. The nodes where the release frees the
// key for others announce it, as UNLOCK's do.
//
// Its callers release in the background (a KEEPALIVE lock whose connection
// closed, a grant whose client left) within a bound of their own, ctx's
// deadline: each node gets all of it, not UNLOCK's node timeout. A
// connection closing with thousands of KEEPALIVE locks queues as many
// releases on each node's writer at once, and those at the back waited
// past node_timeout_max: most failed, and their keys stayed held for
// the rest of their leases (TestUnlockHoldWaitsUpToItsBound).
func (b *Backend) UnlockHold(ctx context.Context, key, token string, mode backends.Mode) (bool, error) {
	q := b.holdQ[mode]
	timeout := q.NodeTimeout(time.Duration(math.MaxInt64))
	if d, ok := ctx.Deadline(); ok && time.Until(d) > timeout {
		timeout = time.Until(d)
	}
	return q.ReleaseWithin(ctx, key, token, timeout)
}

// RenewHold implements backends.HoldKeeper: extendWriteScript or
// extendReadScript on every node, which raise the lease of the token's
// holds of mode to ttl but never shorten it (RENEW's Renew sets it
// exactly).
//
// Its callers renew in the background (a KEEPALIVE watchdog, a lock-delay)
// within a bound of their own, ctx's deadline: each node gets all of it,
// not RENEW's node timeout. A watchdog's deadline is the end of the
// validity it last answered; the validity a renewal answers counts from
// when it started, so a slow answer is still a safe one. Cut at the node
// timeout, a host too busy to answer within it lost most of its
// KEEPALIVE locks at once (commands TestKeepaliveRenewalsSurviveOverload).
func (b *Backend) RenewHold(ctx context.Context, key, token string, mode backends.Mode, ttl time.Duration) (time.Duration, error) {
	validity, _, err := b.RenewHoldFrom(ctx, key, token, mode, ttl)
	return validity, err
}

// RenewHoldFrom implements backends.HoldRenewerFrom: RenewHold, with the
// time its validity counts from, which is when the nodes were asked plus
// how long they took to answer. It is taken before the quorum's own start,
// so from + validity never ends past the lease the nodes set, less the
// drift.
func (b *Backend) RenewHoldFrom(ctx context.Context, key, token string, mode backends.Mode, ttl time.Duration) (time.Duration, time.Time, error) {
	q := b.holdQ[mode]
	timeout := q.NodeTimeout(ttl)
	if d, ok := ctx.Deadline(); ok && time.Until(d) > timeout {
		timeout = time.Until(d)
	}
	asked := time.Now()
	validity, took, err := q.ExtendWithin(ctx, key, token, ttl, timeout)
	if err != nil || validity <= 0 {
		return validity, time.Time{}, err
	}
	return validity, asked.Add(took), nil
}

// holdNode is a node as the quorum of one kind of hold sees it: its
// Release releases a hold of that kind only, and its Extend renews one.
// It is not a quorum.AsyncNode: the quorum runs each release on a
// goroutine of its own, and the node's Start methods, which take no hold
// kind, are not reached through it. It is a quorum.AsyncExtender: the
// renewals, thousands a second with many KEEPALIVE locks, are answered by
// the node's writer, without a goroutine per node and renewal.
type holdNode struct {
	n    *Node
	mode backends.Mode
}

func (h holdNode) Name() string { return h.n.Name() }

// Acquire and RaiseFence are never called on a hold quorum; they are there
// for quorum.Node.
func (h holdNode) Acquire(ctx context.Context, req quorum.Request) (quorum.NodeGrant, error) {
	return h.n.Acquire(ctx, req)
}

func (h holdNode) RaiseFence(ctx context.Context, key, token string, fence uint64) (bool, error) {
	return h.n.RaiseFence(ctx, key, token, fence)
}

// Release removes one hold of h's kind and, when that frees the key for
// others on this node, announces it there.
func (h holdNode) Release(ctx context.Context, key, token string, _ quorum.Hold) (bool, error) {
	hold := quorum.WriteHold
	if h.mode == backends.Read {
		hold = quorum.ReadHold
	}
	ok, err := h.n.Release(ctx, key, token, hold)
	if ok && err == nil {
		h.n.announceHoldRelease(ctx, key, token, h.mode)
	}
	return ok, err
}

// Extend renews the token's hold of h's kind.
func (h holdNode) Extend(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	return h.n.extendHold(ctx, key, token, h.mode, ttl)
}

// StartExtend is Extend answering through done (quorum.AsyncExtender).
func (h holdNode) StartExtend(ctx context.Context, key, token string, ttl time.Duration, done func(bool, error)) {
	h.n.startExtendHold(ctx, key, token, h.mode, ttl, done)
}

// extendWriteScript: KEYS the lock keys (first five); ARGV[1] token,
// ARGV[2] ttl ms. The extend script's write path alone, raising only: the
// write lease raised to the ttl but never shortened, as a reentry raises
// it (the token's write holds taken without KEEPALIVE, which the watchdog
// does not count, share the lease, and their holders were told of theirs),
// the read hold of a downgrade raised to the ttl but never shortened (and
// the keys kept until the later of the two ends). Unlike
// RENEW's script it does not renew a read lease when the token holds the
// key for reading only: a renewal of a write hold that reaches a node
// after an UNLOCK released that hold there must not cut the token's read
// lease, which its holder was told of, to the write TTL. Returns 1 when
// the token held the key for writing.
const extendWriteScript = luaMeta + luaExtendWrite + `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return extendWrite(true)
`

// extendReadScript: KEYS the lock keys (first five); ARGV[1] token, ARGV[2]
// ttl ms, ARGV[3] readMarker. Raises the token's live read lease to the
// ttl, never shortening it: the token's read holds taken without
// KEEPALIVE share that lease, and their holders were told of theirs. The
// lock key lives as long as the longest reader; when the token
// also holds it for writing (a downgrade) the lock key is the write hold
// too, and its lease is only ever raised here, never shortened: a renewal
// of the read hold must not end early the write hold its holder was told
// it has. The meta keys' expiries are set before the lock key's, so that
// they never outlive it. Returns 1 when the token held the key for
// reading.
const extendReadScript = `
local v = redis.call('GET', KEYS[1])
if v ~= ARGV[3] and v ~= ARGV[1] then return 0 end` + luaNow + `
local s = redis.call('ZSCORE', KEYS[4], ARGV[1])
if not s or tonumber(s) <= now then return 0 end
if tonumber(s) < now + tonumber(ARGV[2]) then redis.call('ZADD', KEYS[4], now + tonumber(ARGV[2]), ARGV[1]) end
-- The renewal counts the token's read hold for its holder: the roll-back
-- of the attempt whose mark it bears must no longer remove it where that
-- attempt made the one read hold (lateReadReleaseScript). Over more holds
-- the roll-back takes one, the attempt's, and leaves the holder's.
if tonumber(redis.call('HGET', KEYS[5], ARGV[1]) or '0') <= 1 then
  redis.call('HDEL', KEYS[5], '\0lockproxy:attempt:' .. ARGV[1])
end
local keep = tonumber(redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')[2]) - now
if v == ARGV[1] then
  local p = redis.call('PTTL', KEYS[1])
  if p >= 0 and keep > p then
    redis.call('PEXPIRE', KEYS[2], keep)
    redis.call('PEXPIRE', KEYS[3], keep)
    redis.call('PEXPIRE', KEYS[1], keep)
  end
  keep = math.max(keep, redis.call('PTTL', KEYS[1]))
else
  redis.call('PEXPIRE', KEYS[1], keep)
end
redis.call('PEXPIRE', KEYS[4], keep)
redis.call('PEXPIRE', KEYS[5], keep)
return 1
`

// announceHoldScript: KEYS[1] the lock key; ARGV[1] token, ARGV[2] release
// channel, ARGV[3] 'w' or 'r', the kind of hold just released. It
// announces the release, as the release script does for UNLOCK, when it
// made the key free for someone else: the token's last write hold (the
// key is no longer the token's), or the last reader (the key is gone).
// Run after the release, it may announce a key taken again meanwhile,
// which only wakes a waiter early. The PUBLISH is a pcall: a node user
// whose ACL denies it still released, and waiters fall back to their
// retry.
const announceHoldScript = `
local v = redis.call('GET', KEYS[1])
if v and (ARGV[3] == 'r' or v == ARGV[1]) then return 0 end
redis.pcall('PUBLISH', ARGV[2], '')
return 1
`

var (
	scriptExtendHold   = [2]script{backends.Write: newScript(extendWriteScript), backends.Read: newScript(extendReadScript)}
	scriptAnnounceHold = newScript(announceHoldScript)
)

// eval runs s on the node through its go-redis client, loading it when
// the node does not have it cached.
func (n *Node) eval(ctx context.Context, s script, keys []string, args ...any) (any, error) {
	v, err := n.client.EvalSha(ctx, s.sha, keys, args...).Result()
	if err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
		v, err = n.client.Eval(ctx, s.src, keys, args...).Result()
	}
	return v, err
}

// extendHold renews token's hold of key of mode on this node (see
// extendWriteScript and extendReadScript) through key's batching writer,
// as RENEW's extend goes, counted in the node's extend metrics with
// RENEW's. Not on the go-redis client: a connection holding 10,000
// KEEPALIVE locks of PX 5000 asks each node for about 6,000 renewals a
// second, which the client's pool (redlock.pool_size connections, one
// round trip and several allocations per call) could not carry within the
// node timeout on a loaded host, and most of those locks were lost
// (TestKeepaliveRenewalsPipelined). On the writer they share its pipelined
// batches, and the batch's own checks (the restart generation read before
// the node may vote, the data epoch read after its commands) make an
// answer from a server that restarted meanwhile no vote, as the go-redis
// call's answeredBy did. The writer also keeps a renewal in order with the
// other operations on the key sent through this instance (an UNLOCK's
// release, a reentrant grant), which the client's connections did not.
func (n *Node) extendHold(ctx context.Context, key, token string, mode backends.Mode, ttl time.Duration) (bool, error) {
	if err := n.health.refuse(); err != nil {
		return false, err
	}
	return extendHoldResult(mode, n.do(ctx, extendHoldOp(n, key, token, mode, ttl)))
}

// startExtendHold is extendHold answering through done, called on the
// writer (or here when the op cannot be queued): done must not block.
func (n *Node) startExtendHold(ctx context.Context, key, token string, mode backends.Mode, ttl time.Duration, done func(bool, error)) {
	if err := n.health.refuse(); err != nil {
		done(false, err)
		return
	}
	o := extendHoldOp(n, key, token, mode, ttl)
	o.done = func(r opResult) { done(extendHoldResult(mode, r)) }
	n.start(ctx, o)
}

// extendHoldOp is the writer's op renewing token's hold of key of mode.
func extendHoldOp(n *Node, key, token string, mode backends.Mode, ttl time.Duration) *op {
	o := n.newOp(opExtend, key, token)
	o.ms = ttl.Milliseconds()
	o.hold = quorum.WriteHold
	if mode == backends.Read {
		o.hold = quorum.ReadHold
	}
	return o
}

// extendHoldResult is whether the extend hold script's answer r renewed
// a hold of mode.
func extendHoldResult(mode backends.Mode, r opResult) (bool, error) {
	if r.err != nil {
		return false, fmt.Errorf("extend %v hold: %w", mode, r.err)
	}
	return r.n == 1, nil
}

// announceHoldRelease announces on this node the release of a hold of
// mode by token, when it freed key (see announceHoldScript). A failure
// only leaves waiters to their retry.
func (n *Node) announceHoldRelease(ctx context.Context, key, token string, mode backends.Mode) {
	which := "w"
	if mode == backends.Read {
		which = "r"
	}
	if _, err := n.eval(ctx, scriptAnnounceHold, []string{n.LockKey(key)}, token, n.ReleaseChannel(key), which); err != nil {
		n.log.Debug("redis node: a hold's release was not announced; waiters find it by their retry",
			zap.String("node", n.Name()), zap.Error(err))
	}
}

// answeredBy tells whether an answer read on the go-redis client (not on
// a writer, whose batches check this themselves) is a vote: nil unless
// the node's restart generation moved from gen, read before the call's
// check that the node may vote, and the node may no longer vote. A
// restart the call's own new connection revealed (onConnect) is such a
// move: the answer came from a server that forgot its locks, or holds a
// stale snapshot's.
func (n *Node) answeredBy(gen uint64) error {
	if n.health.gen.Load() != gen {
		return n.health.refuse()
	}
	return nil
}
