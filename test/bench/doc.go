// Package bench compares LOCK+UNLOCK cycles served by the lockproxy binary
// with the same cycles done by github.com/go-redsync/redsync/v4 in the
// client, both against the same real redis-server nodes.
//
// Run it with `make bench`, or
//
//	go test -run '^$' -bench . -benchtime 3s -timeout 20m ./test/bench/
//
// Each nodes=N group starts N redis-server processes and one lockproxy
// (--log-level warn, admin disabled) once; at every client count the two
// implementations run back to back on those nodes, so drift on a shared
// machine hits both alike. Every client locks its own key (no contention).
// A cycle counts only if LOCK returned a lease and UNLOCK released it; more
// than 0.1 % failed cycles fail the benchmark, so a broken proxy cannot look
// fast. After the run a markdown table compares throughput and latency.
//
// Caveat: clients, proxy and nodes share the machine's CPUs, so the numbers
// measure CPU efficiency as much as latency; the *-cpu-us/cycle metrics say
// where the CPU went.
package bench
