// Package resp owns client connections: the listener and per-connection
// loop, the command reader, the Session each connection gets
// (with a context canceled when the client goes away), RESP2 and RESP3
// reply writing, and argument helpers that do not allocate.
//
// It knows nothing of locks: commands are handed to a Handler.
//
// Caveats: replies are flushed once per batch of pipelined commands; a
// command that blocks must call Session.Flush first. Pushes queued with
// Session.Push are written between commands, never inside a reply. A
// flush never waits for a client that does not read, over TLS
// (Server.TLSConfig) as over TCP: what it has not read waits in the
// connection's output buffer, bounded by Server.MaxOutput (output.go,
// tls_output.go).
package resp
