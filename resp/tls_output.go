package resp

import (
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lockproxy/lockproxy/internal/deadline"
)

// Output over TLS. crypto/tls writes each record to the connection under
// it, and waits for that write: so tlsSock, the client's TCP connection
// under its tls.Conn (Server.TLSConfig), takes every write at once, as the
// session's own output does on plain TCP (output.go). It writes what it
// can with one non-blocking write system call, queues the rest (encrypted
// records, in order) and starts a goroutine (flush) that writes it as
// the client reads. So neither a reply written under the session's writeMu
// nor a record crypto/tls writes from its read path (a TLS 1.3 KeyUpdate
// reply, an alert), nor the handshake's, nor Close's close_notify, waits
// for the client: a client that writes a whole pipeline before it reads
// any reply is served over TLS as over TCP.
//
// The queue is bounded as the session's output is (Session.outputLimit,
// counted in encrypted bytes: a record's 22-29 bytes more per up to 16 KB
// of replies): past it the write fails with ErrOutputLimit (crypto/tls
// keeps that error for every later write) and the client is closed, logged
// and counted as on TCP. A client that reads nothing for replyWriteTimeout
// while output waits for it is closed too. flush ends when the queue is
// empty, or with the connection.
//
// tlsSock owns the socket's write deadline, which only flush uses: a
// write here never waits, so the write deadlines crypto/tls sets (Close's)
// are not passed on.
type tlsSock struct {
	// The TCP connection, as a net.Conn: no more of *net.TCPConn's
	// methods (ReadFrom…) than crypto/tls needs, none that would write
	// around Write.
	net.Conn
	raw  syscall.RawConn
	sess *Session // told of a write that failed in flush; set before the first write

	// Under mu, which is taken under crypto/tls's own write lock (under
	// the session's writeMu, or not: the read path's writes), and under
	// which no other lock is taken: obuf is the output the socket has
	// not taken yet, written by flush while obuf.flushing; err ended the
	// output; overflow is how big it would have grown past its limit.
	mu       sync.Mutex
	obuf     outBuf
	err      error
	overflow int
	// closing: the connection is being closed (Session.closeConn); what
	// crypto/tls writes now is Close's close_notify.
	closing atomic.Bool
}

// newTLSSock wraps tc for tls.Server, or returns nil when tc has no file
// descriptor to write to.
func newTLSSock(tc *net.TCPConn) *tlsSock {
	raw, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	t := &tlsSock{Conn: tc, raw: raw}
	t.obuf.fn = t.obuf.rawWrite
	return t
}

// Write takes b whole, unless the output is over: written now, or queued
// behind what is pending.
func (t *tlsSock) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err != nil {
		return 0, t.err
	}
	if len(b) == 0 {
		return 0, nil
	}
	if t.obuf.flushing {
		if err := t.queueLocked(b); err != nil {
			return 0, err
		}
		return len(b), nil
	}
	n, err := t.tryWriteLocked(b)
	if err != nil {
		t.err = err
		return n, err
	}
	if n < len(b) {
		if err := t.queueLocked(b[n:]); err != nil {
			return n, err
		}
		t.obuf.flushing = true
		t.obuf.flushed = make(chan struct{})
		go t.flush(t.obuf.flushed)
	}
	return len(b), nil
}

// SetDeadline sets the read deadline only: writes never wait.
func (t *tlsSock) SetDeadline(at time.Time) error { return t.Conn.SetReadDeadline(at) }

// SetWriteDeadline does nothing: writes never wait, and flush keeps the
// socket's own.
func (t *tlsSock) SetWriteDeadline(time.Time) error { return nil }

// tryWriteLocked writes as much of b as the socket takes now; under mu.
func (t *tlsSock) tryWriteLocked(b []byte) (int, error) { return t.obuf.tryWrite(t.raw, b) }

// queueLocked appends b to the pending output, or ends the output when
// that would take it past the session's limit; under mu.
func (t *tlsSock) queueLocked(b []byte) error {
	limit := 0
	if t.sess != nil {
		limit = t.sess.outputLimit()
	}
	over := t.obuf.queue(b, limit)
	if over == 0 {
		return nil
	}
	if t.closing.Load() {
		// The session is closing (this is Close's close_notify): it is
		// not closed for its limit. Not the session's context ended:
		// Shutdown past its deadline cancels it, and a reply written
		// after (shutdownGrace) is held to the limit as on TCP.
		t.err = net.ErrClosed
		return t.err
	}
	t.err = ErrOutputLimit
	t.overflow = over
	return ErrOutputLimit
}

// flush writes the pending output as the client reads it (Session.flushOut
// for TLS, where the connection never moves), and ends once it is all
// written, the socket is closed, or the client read nothing for
// replyWriteTimeout; done is closed then. A write that failed closes the
// session, past the limit as on TCP (Session.fail).
func (t *tlsSock) flush(done chan struct{}) {
	defer close(done)
	var wd deadline.Write
	timedOut := false
	for first := true; ; first = false {
		t.mu.Lock()
		n, end, err := t.obuf.flushStep(t.raw, &t.err, timedOut)
		if end {
			t.obuf.flushing = false
			t.mu.Unlock()
			if err != nil && t.sess != nil {
				// Not under mu, nor under crypto/tls's write lock:
				// closing sends close_notify, through Write.
				t.sess.fail(err)
			}
			return
		}
		t.mu.Unlock()
		switch {
		case first:
			wd.Set(t.Conn, time.Now().Add(replyWriteTimeout))
		case n > 0:
			// Moved at most once a second (deadline.Write.Arm).
			wd.Arm(t.Conn, replyWriteTimeout)
		}
		werr := pollWritable(t.raw)
		// Other errors (the socket closed) are for the next attempt to
		// tell.
		timedOut = errors.Is(werr, os.ErrDeadlineExceeded)
	}
}

// waitFlushed waits until the pending output is written, or given up on.
func (t *tlsSock) waitFlushed() { t.obuf.waitFlushed(&t.mu) }

// pending reports whether output waits for the client to read it.
func (t *tlsSock) pending() bool { return t.obuf.isFlushing(&t.mu) }

// overflowSize is how big the output would have grown past its limit.
func (t *tlsSock) overflowSize() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.overflow
}
