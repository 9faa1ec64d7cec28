// Package redis is the RedLock backend: each lock node is a Redis server
// reached through one go-redis client, and the quorum package decides.
//
// It owns how a lock looks on a node (a string key `<prefix>lock:<key>`
// holding the token, fence counters in the hash `<prefix>fence`, one field
// per key slot), the Lua scripts for compare-and-delete, compare-and-expire
// and raising a fence, and the batching writers that send many clients'
// operations to a node in one pipelined write.
//
// It knows nothing of the client protocol. Caveats: operations on one key
// reach a node in the order they were made (one writer per key); a node
// that is down counts as failed in every quorum until it answers again
// (go-redis redials about once a second).
//
// Restarts: a node restarted without persistence has forgotten its locks
// and fence counters. Each node learns its server's run_id on every new
// connection (before any command of ours runs on it) and periodically; a
// new run_id quarantines the node for max TTL + drift, during which it
// counts neither for nor against a quorum (acquire, extend and fence raises
// fail at once with the reason "quarantined"; releases are still sent).
// Before it votes again its fence counters are raised to the per-slot
// maximum read from N-Majority+1 healthy other nodes. The guarantee needs
// the proxy to have seen the node before its restart: an instance that
// first meets a node after the node restarted cannot tell, so a fresh
// instance should start no sooner than max TTL after the last node
// restart, or the nodes should run with appendfsync always.
//
// Clock rates: each periodic check also reads the node's TIME in the same
// pipeline, and a least-squares fit over the last 60 samples at least a
// second apart (at most ten minutes; samples with a round trip over 20 ms
// are skipped; none until 5 samples span 10 s; reset on a restart)
// estimates the node's clock rate
// against the proxy's monotonic clock (NodeConfig.Clock in tests). The
// drift allowance grows by ttl × (e − drift factor) for the largest rate
// error e among the nodes that may vote, and a node whose error exceeds
// MaxClockRateError stops voting (reason "clock") until its estimate is
// back within. The measurement is slow by design: a clock that turns fast
// is noticed over tens of seconds, not at once, so the drift factor must
// still cover sudden changes, and wall-clock jumps on a node (which the
// fit sees as a rate error for a while) are not prevented, only noticed.
package redis
