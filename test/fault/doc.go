// Package fault runs lockproxy under named faults — node kills, empty
// restarts after the lease, node pauses, lockproxy kills, clients that
// vanish while holding — against real redis-server nodes, and checks every
// run's history: no two grants of a key overlap within their validity,
// fences strictly increase, and a fenced ledger loses no acknowledged
// update. Negative controls show that each check can fail.
//
// TestLinkFaults puts a test/faultproxy proxy on every link from every
// lockproxy instance to every node and runs network rows through them: a
// partitioned minority, one instance cut off from the majority (its
// KEEPALIVE holders must be told lock-lost first), slow nodes, node
// clocks running 1.5× fast on 1, 2 and 3 nodes (the last breaks RedLock's
// assumption and is expected to overlap: it is logged, not failed), and a
// half-open KEEPALIVE client.
//
// It owns the history checker (checker.go) and the workload; it must not
// know lockproxy's internals: it talks RESP to the binary that
// test/harness builds.
//
// Caveats: validity deadlines are stamped on the client's side after the
// reply (a little late, which makes the overlap check stricter); nodes are
// restarted empty only after the lease has run out, because restart
// quarantine does not exist yet. `go test ./test/fault -soak` (or
// LOCKPROXY_SOAK=1) runs the full sizes: 20 clients × 500 grants per fault
// and 20 × 10,000 without faults.
package fault
