// Package commands owns the command table (name, arity, flags, key
// positions and the docs behind COMMAND DOCS) and the handlers of
// lockproxy's own commands: the lock commands, served from a
// backends.Backend, and the connection and server commands clients send on
// connect (PING, HELLO, CLIENT, INFO, COMMAND).
//
// It also runs the KEEPALIVE watchdogs (keepalive.go): one goroutine per
// keepalive lock renews it every ttl/3 while its connection is open and
// sent a command within the idle window, and releases it when the
// connection closes. Caveat: liveness is judged by commands received, not
// by the client's progress; a client that PINGs from a healthy thread
// while its lock-holding work is stuck keeps the lock.
//
// It knows nothing of how a backend stores a lock. Errors reach clients
// through one function, replyError, with the texts PROTOCOL.md gives.
package commands
