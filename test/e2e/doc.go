// Package e2e holds lockproxy's end-to-end tests: the real lockproxy binary
// (built once per run by test/harness) in front of real redis-server nodes,
// driven by go-redis, raw TCP connections, and the real redis-cli.
//
// It owns nothing but tests; it must not import lockproxy's packages, only
// talk to the binary over the wire, so that what it checks is what a client
// sees.
//
// Caveats: every test starts its own nodes and lockproxy on free loopback
// ports and runs in parallel with the others, so timings are only ever
// checked against generous upper bounds (the test machines have two shared
// cores).
package e2e
