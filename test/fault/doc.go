// Package fault runs lockproxy under named faults — node kills, empty
// restarts after the lease, node pauses, lockproxy kills, clients that
// vanish while holding — against real redis-server nodes, and checks every
// run's history: no two grants of a key overlap within their validity,
// fences strictly increase, and a fenced ledger loses no acknowledged
// update. Negative controls show that each check can fail.
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
