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
// With an upstream configured (Options.Relay), commands it does not serve
// are relayed (relay.go): a connection's relayed commands of one batch are
// sent together and their replies put where their commands were; state
// that belongs to one connection (MULTI, WATCH, pub/sub, blocking
// commands, SELECT) pins it to an upstream connection of its own.
//
// It knows nothing of how a backend stores a lock. Errors reach clients
// through one function, replyError, with the texts PROTOCOL.md gives.
package commands
