// Package fault runs lockproxy under named faults — node kills, nodes
// restarted empty while their locks are held, node pauses, lockproxy
// kills, clients that vanish while holding — against real redis-server
// nodes, and checks every run's history: no two grants of a key overlap
// within their validity, fences strictly increase, and a fenced ledger
// loses no acknowledged update. Negative controls show that each check can
// fail.
//
// Every must-pass row also runs long holds (longhold_test.go): holders
// that keep the lock for 90 % of the validity they were told while a
// client of the other instance waits for the key, so that a validity
// longer than the lease on the nodes shows as an overlap. The restart row
// holds a lock on exactly 3 of 5 nodes (instance 0's links to the other
// two drop everything while it is taken), restarts one of the 3 empty and
// has the other instance contend for the key: without the restart
// quarantine a majority that forgot the lock grants it again.
//
// TestLinkFaults puts a test/faultproxy proxy on every link from every
// lockproxy instance to every node and runs network rows through them: a
// partitioned minority, one instance cut off from the majority (its
// KEEPALIVE holders must be told lock-lost first), a RENEW that misses the
// majority (blackholed or slow links: it must answer NOQUORUM within the
// lease, and nobody else may get the lock before), slow nodes, node clocks
// running 1.5× fast on 1, 2 and 3 nodes (they break RedLock's timing
// assumption: their overlaps are logged, not failed, but fence
// regressions, lost updates and a non-linearizable ledger fail them, since
// fences must hold whatever the timing), and a half-open KEEPALIVE client.
//
// The rows that stop or kill a lockproxy instance require that their
// fault caught the workload's commands in flight (inflight_test.go): a
// short stop must hold up a LOCK/RLOCK sent before it and answered after
// the continue, on a key nobody held long meanwhile, while the other
// instance answered PINGs; the kill must cut off a LOCK/RLOCK sent before
// it, and the killed instance's clients must reconnect and go on after
// the restart.
//
// Every row runs 20 clients through two instances, at least 500 grants
// each, and is judged on one list of criteria (row_test.go): size, safety,
// availability while a majority is up, no panic, goroutines back to their
// baseline and bounded memory (resources_test.go). Rows of one table run
// two at a time, each on its own nodes and instances.
//
// It owns the history checker (checker.go) and the workload; it must not
// know lockproxy's internals: it talks RESP to the binary that
// test/harness builds, and reads its INFO and admin endpoints.
//
// Caveats: validity deadlines are stamped on the client's side after the
// reply (a little late, which makes the overlap check stricter).
// `go test ./test/fault -soak` (or LOCKPROXY_SOAK=1, `make soak`) runs
// 20 clients × 10,000 grants in every row, repeating its fault until done.
package fault
