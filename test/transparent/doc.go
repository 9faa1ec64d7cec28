// Package transparent tests lockproxy's transparent mode end to end:
// three real redis-server nodes, the real lockproxy binary with lock
// patterns, and unmodified lock libraries that were written for a single
// Redis — go-redis with the seed's SET NX PX and compare-and-delete script,
// bsm/redislock, redsync with one pool, redis-py's Lock (Debian's
// python3-redis) and redis-semaphore on ioredis (npm, under node/).
//
// It imports none of lockproxy's packages: it checks what a client sees and
// what the nodes hold. Every test starts its own nodes and lockproxy on free
// loopback ports and stops them by PID.
package transparent
