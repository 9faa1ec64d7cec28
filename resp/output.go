package resp

import (
	"errors"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/internal/nbio"
)

// A client's output, as Redis keeps it. Replies (and push frames) go to
// the socket with one non-blocking write: when it takes them, which is
// the common case, that is all. What it does not take waits in the
// session's output buffer, and a goroutine of the session's own
// (flushOut) writes it as the client reads, while the connection goes on
// reading and serving the client's commands, whose replies queue behind
// it. A client that writes a whole pipeline before it reads any reply
// (go-redis's Pipeline) needs that: were its replies written by the
// goroutine that reads its commands, that goroutine would wait for the
// client to read, the client for lockproxy to read the rest of its
// pipeline, and neither would until the write timeout dropped the
// connection.
//
// The buffer is bounded by Server.MaxOutput (Redis's
// client-output-buffer-limit, which is unlimited for normal clients by
// default): past it the client is closed, with a log line. A client that
// reads nothing for replyWriteTimeout while output is pending is closed
// too. flushOut ends when the buffer is empty, or with the connection.
//
// Over TLS the session writes through crypto/tls, to a socket that never
// makes it wait either (tlsSock, tls_output.go), with the same bounds.
// Only a connection with neither (a net.Conn from a listener that wraps
// its own, such as tls.NewListener's) is still written blocking.

// maxKeptOutput is the output buffer memory a connection keeps once its
// pending output is written: a burst of replies that a slow client took a
// while to read must not stay allocated for the life of the connection.
const maxKeptOutput = 64 << 10

// ErrOutputLimit is what writes to a client report once its pending output
// went past Server.MaxOutput and it was closed.
var ErrOutputLimit = errors.New("resp: client output buffer limit reached")

// write sends b to the client, or queues it behind output still pending;
// b may be reused once it returns. Only a connection with neither a raw
// socket nor a tlsSock waits for the client here. On an error the
// connection is closed.
func (s *Session) write(b []byte) error {
	s.writeMu.Lock()
	var err error
	if s.raw == nil {
		err = s.writeConnLocked(b, false)
	} else {
		err = s.sendLocked(b)
	}
	s.writeMu.Unlock()
	if err != nil {
		s.fail(err)
	}
	return err
}

// writeConnLocked writes b through the connection, for connections
// without a raw socket; under writeMu. Over a tlsSock that never waits for
// the client. Else it waits for the client to take b, at most
// replyWriteTimeout, or pushWriteTimeout for a push frame.
func (s *Session) writeConnLocked(b []byte, push bool) error {
	if s.outErr != nil {
		return s.outErr
	}
	switch {
	case s.tsock != nil:
		// No write deadline: tlsSock bounds the output.
	case push:
		// Set, not Arm: a reply's deadline, further away, must not
		// stand for a push frame's.
		s.wdeadline.Set(s.conn, time.Now().Add(pushWriteTimeout))
	default:
		s.wdeadline.Arm(s.conn, replyWriteTimeout)
	}
	_, err := s.out.Write(b)
	if err != nil {
		s.outErr = err
	}
	return err
}

// sendLocked writes b with one non-blocking attempt, or queues it when
// output is pending already; what the socket does not take is queued and
// flushOut started. Under writeMu, on a connection with a raw socket.
func (s *Session) sendLocked(b []byte) error {
	if s.outErr != nil {
		return s.outErr
	}
	if len(b) == 0 {
		return nil
	}
	if s.obuf.flushing {
		return s.queueLocked(b)
	}
	n, err := s.tryWriteLocked(b)
	if err != nil {
		s.outErr = err
		return err
	}
	if n == len(b) {
		return nil
	}
	if err := s.queueLocked(b[n:]); err != nil {
		return err
	}
	s.obuf.flushing = true
	s.obuf.flushed = make(chan struct{})
	go s.flushOut(s.obuf.flushed)
	return nil
}

// tryWriteLocked writes as much of b as the socket takes now, without
// waiting; under writeMu. Control, not RawConn.Write: it neither waits
// for the socket nor fails on a write deadline that passed while the
// connection idled, and the one write system call is all it costs.
func (s *Session) tryWriteLocked(b []byte) (int, error) { return s.obuf.tryWrite(s.raw, b) }

// queueLocked appends b to the pending output, or closes the client when
// that would take it past its limit; under writeMu.
func (s *Session) queueLocked(b []byte) error {
	if over := s.obuf.queue(b, s.outputLimit()); over > 0 {
		s.outErr = ErrOutputLimit
		s.overflow = over
		return ErrOutputLimit
	}
	return nil
}

// outBuf is the output a socket has not taken yet, pend[pendOff:], and the
// one non-blocking write that offers it to the socket: a plain TCP
// session's (under its writeMu) and a tlsSock's (under its mu).
type outBuf struct {
	pend    []byte
	pendOff int
	// flushing: a flush goroutine writes pend; flushed is closed when it
	// ends.
	flushing bool
	flushed  chan struct{}
	// The one write attempt of tryWrite: fields rather than a closure's
	// captures, so that it allocates nothing.
	buf  []byte
	n    int
	werr error
	fn   func(fd uintptr)
}

// tryWrite writes as much of b as raw's socket takes now, without waiting.
func (o *outBuf) tryWrite(raw syscall.RawConn, b []byte) (int, error) {
	if o.fn == nil {
		o.fn = o.rawWrite
	}
	o.buf, o.n, o.werr = b, 0, nil
	err := raw.Control(o.fn)
	n, werr := o.n, o.werr
	o.buf = nil
	if err == nil {
		err = werr
	}
	return n, err
}

// rawWrite is tryWrite's attempt, on the socket's descriptor.
func (o *outBuf) rawWrite(fd uintptr) {
	for o.n < len(o.buf) {
		n, err := nbio.Write(int(fd), o.buf[o.n:])
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			return
		case err != nil:
			o.werr = err
			return
		case n <= 0:
			return
		}
		o.n += n
	}
}

// queue appends b to the pending output; past limit (when not 0) it drops
// the pending output instead and returns the size it would have grown to.
func (o *outBuf) queue(b []byte, limit int) (overflow int) {
	pending := o.size()
	if limit > 0 && pending+len(b) > limit {
		o.pend, o.pendOff = nil, 0
		return pending + len(b)
	}
	if o.pendOff > 0 && o.pendOff >= len(o.pend)/2 {
		// Reuse what was written: copying at most what is left, once
		// half the buffer is behind us, keeps appends amortized O(1).
		n := copy(o.pend, o.pend[o.pendOff:])
		o.pend, o.pendOff = o.pend[:n], 0
	}
	o.pend = append(o.pend, b...)
	return 0
}

// waitFlushed waits, mu being the owner's lock, until the flush under way
// (if any) ended: the output written, or given up on.
func (o *outBuf) waitFlushed(mu *sync.Mutex) {
	mu.Lock()
	done := o.flushed
	if !o.flushing {
		done = nil
	}
	mu.Unlock()
	if done != nil {
		<-done
	}
}

// isFlushing reports, mu being the owner's lock, whether output waits for
// the client to read it.
func (o *outBuf) isFlushing(mu *sync.Mutex) bool {
	mu.Lock()
	defer mu.Unlock()
	return o.flushing
}

// size is how many bytes wait.
func (o *outBuf) size() int { return len(o.pend) - o.pendOff }

// writeSome offers the pending output to raw's socket once, and reports
// whether it is all written.
func (o *outBuf) writeSome(raw syscall.RawConn) (n int, done bool, err error) {
	n, err = o.tryWrite(raw, o.pend[o.pendOff:])
	o.pendOff += n
	return n, o.pendOff == len(o.pend), err
}

// flushStep is one turn of a flush loop, under the owner's lock: it
// offers the pending output to raw's socket once. errp is the owner's
// output error: a write that fails sets it, and so does a turn in which
// the client took nothing for the write timeout (timedOut). It reports
// whether the flush ends, all written or failed (err), the buffer reset.
func (o *outBuf) flushStep(raw syscall.RawConn, errp *error, timedOut bool) (n int, end bool, err error) {
	err = *errp
	done := false
	if err == nil {
		n, done, err = o.writeSome(raw)
	}
	if err == nil && n == 0 && timedOut {
		err = os.ErrDeadlineExceeded
	}
	if err == nil && !done {
		return n, false, nil
	}
	if err != nil && *errp == nil {
		*errp = err
	}
	o.reset(err != nil)
	return n, true, err
}

// reset empties the pending output once a flush ended, keeping at most
// maxKeptOutput of its memory; drop (an error ended the output) keeps none.
func (o *outBuf) reset(drop bool) {
	if cap(o.pend) > maxKeptOutput || drop {
		o.pend = nil
	}
	o.pend, o.pendOff = o.pend[:0], 0
}

// flushOut writes the pending output as the client reads it, and ends
// once it is all written, the client is closed, or the client read
// nothing for replyWriteTimeout; done is closed then. It waits for the
// socket outside writeMu, so that replies and push frames queue up
// meanwhile, and so that the event loop can hand the socket to Go's poller
// (the next attempt takes the new one).
func (s *Session) flushOut(done chan struct{}) {
	defer close(done)
	last := time.Now() // the client last took output
	timedOut := false
	var armed net.Conn // the connection whose write deadline is set
	for first := true; ; first = false {
		s.writeMu.Lock()
		n, end, err := s.obuf.flushStep(s.raw, &s.outErr, timedOut)
		if end {
			s.obuf.flushing = false
			s.writeMu.Unlock()
			if err != nil {
				s.fail(err)
			} else if len(s.pushes) > 0 {
				s.drainPushes()
			}
			return
		}
		if n > 0 || first {
			last = time.Now()
		}
		switch {
		case s.conn != armed:
			// First, or the event loop handed the socket to Go's poller
			// meanwhile (or back): the deadline is set on the new one.
			s.wdeadline.Set(s.conn, last.Add(replyWriteTimeout))
			armed = s.conn
		case n > 0:
			// Moved at most once a second (deadline.Write.Arm): a client
			// that takes output a little at a time costs no timer work
			// per write.
			s.wdeadline.Arm(s.conn, replyWriteTimeout)
		}
		raw, fc := s.raw, s.fc
		s.writeMu.Unlock()
		if len(s.pushes) > 0 {
			// Frames that came while this held the lock: queued behind
			// the output, in order.
			s.drainPushes()
		}
		if fc != nil {
			timedOut = fc.waitWritable(last.Add(replyWriteTimeout))
			continue
		}
		werr := pollWritable(raw)
		// Other errors (the socket closed, or handed to the event loop)
		// are for the next attempt to tell.
		timedOut = errors.Is(werr, os.ErrDeadlineExceeded)
	}
}

// pollWritable waits, in Go's poller, until raw's socket takes more
// output (or its write deadline passes, or it is closed): RawConn.Write
// calls its function again once the socket is writable, which then
// reports done without writing; the next attempt writes.
func pollWritable(raw syscall.RawConn) error {
	waited := false
	return raw.Write(func(uintptr) bool {
		if waited {
			return true
		}
		waited = true
		return false
	})
}

// waitOutput waits until the output pending is written, or given up on
// (the client closed, or did not read for replyWriteTimeout).
func (s *Session) waitOutput() {
	if s.tsock != nil {
		s.tsock.waitFlushed()
		return
	}
	s.obuf.waitFlushed(&s.writeMu)
}

// OutputBytes is how many bytes of replies wait for the client to read
// them (CLIENT LIST's omem): the output buffer's, not the socket's. Over
// TLS they are counted encrypted.
func (s *Session) OutputBytes() int {
	if s.tsock != nil {
		s.tsock.mu.Lock()
		defer s.tsock.mu.Unlock()
		return s.tsock.obuf.size()
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	return s.obuf.size()
}

// outputPending reports whether output waits for the client to read it.
func (s *Session) outputPending() bool {
	if s.tsock != nil {
		return s.tsock.pending()
	}
	return s.obuf.isFlushing(&s.writeMu)
}

// outputLimit is the bound on the connection's pending output: a
// subscriber's is Server.MaxOutputPubSub where that is lower, as Redis
// bounds pub/sub clients (32 MB) and not normal ones. Messages for a
// subscriber that stopped reading come without it asking, from other
// clients' PUBLISH, at their pace, not its own.
func (s *Session) outputLimit() int {
	limit := s.outLimit
	if s.pubsub.Load() && s.outLimitPubSub > 0 && (limit == 0 || s.outLimitPubSub < limit) {
		limit = s.outLimitPubSub
	}
	return limit
}

// fail closes the connection after a write failed; past the output limit,
// with a log line (once), as Redis logs a client closed for overcoming
// client-output-buffer-limit.
func (s *Session) fail(err error) {
	if errors.Is(err, ErrOutputLimit) && !s.overLimit.Swap(true) && s.srv != nil {
		s.srv.outputLimitCloses.Add(1)
		s.writeMu.Lock()
		size := s.overflow
		s.writeMu.Unlock()
		if s.tsock != nil {
			size = s.tsock.overflowSize()
		}
		s.srv.Logger.Warn("client closed for overcoming the output buffer limit (limits.max_output_bytes)",
			zap.Int64("id", s.id), zap.String("remote", s.remoteAddr),
			zap.Int("output_bytes", size), zap.Int("limit", s.outputLimit()), zap.Bool("pubsub", s.pubsub.Load()))
	}
	s.Close()
}
