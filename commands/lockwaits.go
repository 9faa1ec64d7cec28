package commands

import (
	"context"
	"sync"
)

// Clients waiting in LOCK … WAIT or RLOCK … WAIT, by client id, so that
// CLIENT UNBLOCK can end the wait as Redis ends a blocking command: the
// UNBLOCK answers :1, and the LOCK answers as when WAIT runs out (nil),
// or with errUnblocked for CLIENT UNBLOCK id ERROR. Nothing upstream
// holds such a client, so the relay (relay.Named) does not know of it.

// errUnblocked is Redis's reply to a blocking command that CLIENT UNBLOCK
// id ERROR ended.
const errUnblocked = "UNBLOCKED client unblocked via CLIENT UNBLOCK"

// How CLIENT UNBLOCK ended a wait (lockWait.how).
const (
	unblockedTimeout = 't' // CLIENT UNBLOCK id [TIMEOUT]: as when WAIT runs out
	unblockedError   = 'e' // CLIENT UNBLOCK id ERROR: errUnblocked
)

// lockWait is one LOCK … WAIT in progress.
type lockWait struct {
	cancel context.CancelFunc // ends the backend's wait
	how    byte               // 0 until CLIENT UNBLOCK ends it
}

// lockWaits are the LOCK … WAITs in progress. A client runs one command at
// a time, so it has one at most.
type lockWaits struct {
	mu sync.Mutex
	m  map[int64]*lockWait
}

// begin records that client waits in a LOCK, whose wait cancel ends. The
// caller calls end when the backend answered.
func (l *lockWaits) begin(client int64, cancel context.CancelFunc) *lockWait {
	w := &lockWait{cancel: cancel}
	l.mu.Lock()
	if l.m == nil {
		l.m = make(map[int64]*lockWait)
	}
	l.m[client] = w
	l.mu.Unlock()
	return w
}

// end takes w off and tells how CLIENT UNBLOCK ended it, 0 when it did not.
// It and unblock decide under one lock: an UNBLOCK that answered :1 always
// finds its LOCK answered as unblocked, even when the backend granted the
// lock meanwhile (the caller then gives the grant back), and one that
// comes after end answers :0, as on Redis for a command that returned.
func (l *lockWaits) end(client int64, w *lockWait) byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m[client] == w {
		delete(l.m, client)
	}
	return w.how
}

// waiting tells whether client is in a wait no UNBLOCK ended yet.
func (l *lockWaits) waiting(client int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.m[client]
	return w != nil && w.how == 0
}

// unblock ends the wait of client, if it is in one that no UNBLOCK ended
// yet, with how, and reports whether it did.
func (l *lockWaits) unblock(client int64, how byte) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.m[client]
	if w == nil || w.how != 0 {
		return false
	}
	w.how = how
	w.cancel()
	return true
}
