// Package clients tests lockproxy as a drop-in in front of Redis with real
// clients: redis-cli, go-redis v9, redis-py (Debian's python3-redis),
// ioredis and node-redis (npm, in node/), under RESP2 and RESP3 where the
// client speaks both. Each client runs the same ordinary workload directly
// against a real upstream redis-server and through lockproxy, and the
// results must be identical; then lock commands, keyspace isolation and
// denied commands through the same client.
package clients
