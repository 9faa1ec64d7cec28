// Package quorum implements the RedLock algorithm over N independent nodes.
//
// It owns the parts of a distributed lock that do not depend on how a node
// stores a key: fanning a request out to every node at once with a per-node
// timeout, counting a majority, computing the validity left after the time
// spent acquiring and the allowance for clock drift, rolling back partial
// grants, and issuing fencing tokens that grow across every grant of a key.
//
// It knows nothing of RESP or go-redis: a node is the Node interface, which
// backends/redis implements with Lua scripts. It imports only the standard
// library.
//
// Fencing: each node keeps counters (one per key slot). A node's acquire
// increments the slot's counter atomically with setting the key and returns
// it. The fence of a grant is the maximum over the majority that granted;
// every granting node whose counter is below it is raised to it, on the
// condition that the node still holds the key, and the grant succeeds only if
// a majority ends up at or above the fence. A later grant of the same key must
// take a majority too, which shares a node with ours; that node's counter was
// raised before our key on it went away, so the later grant reads at least our
// fence and returns more. A per-node INCR alone would not be monotonic: two
// majorities can read different counters.
package quorum
