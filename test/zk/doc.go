// Package zk runs the lockproxy binary with --backend zookeeper against a
// real three-server ZooKeeper ensemble that the tests start on free
// loopback ports (test/harness), through real clients (go-redis and raw
// RESP3 connections): the replies of test/e2e's lock tests, FIFO order of
// 100 waiters across two instances, KEEPALIVE, session expiry, a server
// killed, and shutdown.
package zk
