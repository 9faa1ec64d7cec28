// Package commands owns the command table (name, arity, flags, key
// positions and the docs behind COMMAND DOCS) and the handlers of
// lockproxy's own commands: the lock commands, served from a
// backends.Backend, and the connection and server commands clients send on
// connect (PING, HELLO, CLIENT, INFO, COMMAND).
//
// It knows nothing of how a backend stores a lock. Errors reach clients
// through one function, replyError, with the texts PROTOCOL.md gives.
package commands
