// Package lockclient holds the client-side helpers the end-to-end test
// packages (test/e2e, test/zk, test/suite, test/transparent, test/fault)
// share: sending LOCK/RLOCK/UNLOCK through go-redis and parsing the
// grants, and a raw TCP connection that speaks RESP2/RESP3 by hand for
// what go-redis hides (pushes, pipelined bytes, connections closed
// mid-wait).
//
// The helpers that wait take their limits from a Config, because the
// packages wait differently long: ZooKeeper's session handling makes
// grants there far slower on a loaded machine than RedLock's.
package lockclient
