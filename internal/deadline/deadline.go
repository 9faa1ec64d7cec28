// Package deadline keeps a connection's write deadline without setting it
// on every write: setting one costs timer work, and the reply paths write
// thousands of times a second against deadlines tens of seconds long.
package deadline

import (
	"net"
	"time"
)

// Write is the write deadline last set on one connection. Its methods are
// called under whatever serializes the connection's writes.
type Write struct{ at time.Time }

// Arm makes sure the write deadline is at least timeout − 1 s away, moving
// it to timeout from now when it is not: a write then gets between
// timeout − 1 s and timeout.
func (w *Write) Arm(c net.Conn, timeout time.Duration) {
	if now := time.Now(); w.at.Sub(now) < timeout-time.Second {
		w.Set(c, now.Add(timeout))
	}
}

// Set sets the write deadline to at, for a write bounded otherwise.
func (w *Write) Set(c net.Conn, at time.Time) {
	w.at = at
	_ = c.SetWriteDeadline(at)
}
