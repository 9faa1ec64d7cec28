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
package redis
