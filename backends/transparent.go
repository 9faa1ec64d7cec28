package backends

import (
	"context"
	"time"
)

// Transparent mode serves plain Redis commands on lock keys (SET NX PX,
// GET, DEL, PEXPIRE, EVAL, …) from the lock store. A backend whose store is
// a set of Redis nodes implements Fanout: the command runs on every node
// and the commands package decides which reply a majority agrees on. A
// backend without it (a ZooKeeper one) cannot serve those commands and
// transparent mode refuses them there.

// Fanout runs plain Redis commands on every node of a lock store.
type Fanout interface {
	// NodeCount is how many nodes the store has; a majority is
	// NodeCount()/2+1 of them, whether they answer or not.
	NodeCount() int
	// Run sends args to every node that may vote, with each argument at
	// the positions in keys replaced by that node's key for the lock key
	// it names, and returns one reply per node in configuration order.
	// A node that may not vote (restarted, clock out of bound) is not
	// asked: its reply carries the reason in Err. A read-only command may
	// return as soon as a majority of all nodes gave the same reply; the
	// nodes it did not wait for then carry an error too. A command that
	// writes waits for every node (up to its timeout), so that it is not
	// still on its way to a slow node when the client's next command on
	// the key reaches the others.
	Run(ctx context.Context, args []string, keys []int, readOnly bool) []NodeReply
	// RunEach runs the one-key command name once for each of keys on
	// every node that may vote, like Run, all in one round trip per node
	// (one MULTI for a write), and returns one reply per node whose Val is
	// an array of the node's replies in the order of keys. A node that
	// failed to answer for any key carries Err.
	RunEach(ctx context.Context, name string, keys []string, readOnly bool) []NodeReply
	// RunScript runs EVAL of body with keys (lock keys, rewritten per node)
	// and argv on every node that may vote, and reports, besides each
	// node's reply, which keys the script left holding a value other than
	// the one they had before it ran, and their TTL after it. The reads
	// before and after are in the same MULTI as the script, so nothing
	// else runs between them on that node.
	RunScript(ctx context.Context, body string, keys, argv []string) []NodeReply
	// Undo deletes on node i each of keys whose value is still the
	// corresponding one of values (compare-and-delete): the roll-back of a
	// write that did not reach a majority. With unfenced, only a key with
	// no fence stored for that value: the roll-back on a node whose answer
	// was lost, where the value may be a grant's hold of a client that
	// uses the same value (apps that lock with a constant, "1" or
	// "locked"), which the script found there and left alone.
	Undo(ctx context.Context, node int, keys, values []string, unfenced bool) error
	// Fence gives an acquisition made by a script a fence, as LOCK's
	// grants have: the key slot's counter is incremented on the nodes
	// that granted, and the highest is stored with the hold on each of
	// them (while token still holds key there). It returns that fence.
	Fence(ctx context.Context, nodes []int, key, token string) (uint64, error)
	// Drift is the clock-drift allowance for a lease of ttl.
	Drift(ttl time.Duration) time.Duration
}

// NodeReply is one node's answer to a command run by a Fanout.
type NodeReply struct {
	// Node names the node (its address), for error replies.
	Node string
	// Val is the reply: nil, int64, string, []any of these, or a
	// ReplyError for an error reply (also inside arrays).
	Val any
	// Err is set when the node did not answer: down, timeout, not voting.
	Err error
	// Writes, from RunScript only, lists per key whether the script left
	// it holding a new value, which, and its PTTL in ms after the script.
	Writes []KeyWrite
}

// KeyWrite is what a script did to one lock key on one node.
type KeyWrite struct {
	Wrote  bool   // the key holds a value it did not hold before the script
	Exists bool   // the key exists after the script
	Value  string // its value after the script
	PTTL   int64  // the key's PTTL after the script (-1: no expiry)
}

// ReplyError is an error reply from a node (WRONGTYPE, a script error,
// …): a value to agree on like any other, passed to the client as is.
type ReplyError string

func (e ReplyError) Error() string { return string(e) }
