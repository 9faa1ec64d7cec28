// Package relay owns lockproxy's connections to the upstream Redis that
// commands lockproxy does not serve itself are relayed to.
//
// Requests are written as RESP arrays; many clients' requests share a few
// upstream connections per protocol (RESP2 and RESP3 apart) and go out in
// batches; replies are relayed as raw frames, byte for byte (RESP3 types,
// attributes and pushes included), never decoded and re-encoded. A client
// whose state belongs to one connection (MULTI, WATCH, pub/sub, blocking
// commands, SELECT other than 0, CLIENT TRACKING) is pinned to a connection
// of its own until that state clears. Commands that name another client by
// id (CLIENT UNBLOCK, CLIENT TRACKING … REDIRECT) get the upstream's id of
// that client's pinned connection from Named: lockproxy's ids mean nothing
// upstream.
//
// It knows nothing of locks or of lockproxy's command table: the commands
// package decides what is relayed. It does own the relay's policy on what
// may pass: denied commands and the lock key prefix (keyspace isolation).
//
// Caveats: isolation checks the key positions the upstream's COMMAND table
// gives and the bodies of scripts; a script that builds a key name at run
// time is not caught.
package relay
