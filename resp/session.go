package resp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lockproxy/lockproxy/internal/deadline"
	"github.com/lockproxy/lockproxy/internal/nbio"
)

// Session is one client connection. It carries the connection's context,
// where commands find the context they derive timeouts from; it is
// canceled as soon as the client goes away (while a command blocks, once it
// calls WatchClose).
type Session struct {
	// W buffers the replies; the server flushes it after each batch of
	// pipelined commands.
	W *Writer
	// Data is per-connection state owned by the command layer.
	Data any

	id int64
	// conn is the client's connection. It changes once at most, when the
	// event loop hands the connection to a goroutine (setConn); other
	// goroutines read it under connMu.
	conn       net.Conn
	connMu     sync.Mutex
	localAddr  string
	remoteAddr string
	ctx        context.Context
	cancel     context.CancelFunc
	created    time.Time
	lastActive atomic.Int64
	// For the server's auth timeout (rd.preAuth is the reader's): whether
	// the client is authenticated, and since when (UnixNano) it is not.
	authed     atomic.Bool
	unauthed   atomic.Int64
	closeAfter bool
	rd         *Reader
	// writeMu orders whole writes to the connection: a batch of replies
	// from the connection's goroutine, push frames from others.
	writeMu sync.Mutex
	out     io.Writer // writes to conn, under writeMu
	// wdeadline is the connection's write deadline (under writeMu).
	wdeadline deadline.Write
	pushes    chan []byte
	// serving is set while the connection's goroutine runs a batch whose
	// replies are not written yet: push frames wait for them, so that a
	// push the upstream sent after a reply (a tracking invalidation after
	// the value it invalidates) never reaches the client before it.
	serving atomic.Bool
	// passed: PassPushes cleared serving for the rest of the batch (owned
	// by the connection's goroutine), so HoldPushes may set it again.
	passed bool

	// What the command layer says of the connection for CLIENT LIST,
	// which other connections' goroutines read: its name, and whether it
	// is subscribed (TYPE pubsub).
	name   atomic.Pointer[string]
	pubsub atomic.Bool

	// Replies written by another goroutine (BeginAsync). asyncBusy is
	// owned by the connection's goroutine; asyncDone gets a token when
	// the outstanding write is done.
	asyncBusy  bool
	asyncDone  chan struct{}
	asyncWrite func([]byte)
	raw        syscall.RawConn // nil when the connection has no file descriptor
	// The one write attempt of an async write, under writeMu: fields
	// rather than a closure's captures, so that it allocates nothing.
	rawBuf  []byte
	rawN    int
	rawErr  error
	rawFunc func(fd uintptr) bool

	// On the event loop (loop_linux.go): loop is the loop serving the
	// session, nil once it has a goroutine; home the loop it started on,
	// which a finished reply write wakes when stalled is set. paused: out
	// of the loop's epoll set until a reply write is done. fc is the
	// loop's socket.
	loop      *eventLoop
	home      *eventLoop
	loopWrite func([]byte) // BeginAsync's write on the loop: home.deliver
	stalled   atomic.Bool
	paused    bool
	fc        *fdConn
}

// replyWriteTimeout bounds one write of replies to a client that does not
// read; pushWriteTimeout one push frame, written from other goroutines.
const (
	replyWriteTimeout = 30 * time.Second
	pushWriteTimeout  = 5 * time.Second
)

func newSession(base context.Context, id int64, c net.Conn) *Session {
	ctx, cancel := context.WithCancel(base)
	s := &Session{
		W:       NewWriter(),
		id:      id,
		conn:    c,
		ctx:     ctx,
		cancel:  cancel,
		created: time.Now(),
		pushes:  make(chan []byte, 16),
		rd:      NewReader(c),

		asyncDone: make(chan struct{}, 1),
	}
	if a := c.LocalAddr(); a != nil {
		s.localAddr = a.String()
	}
	if a := c.RemoteAddr(); a != nil {
		s.remoteAddr = a.String()
	}
	s.lastActive.Store(s.created.UnixNano())
	s.unauthed.Store(s.created.UnixNano())
	s.asyncWrite = s.writeAsync
	s.rawFunc = func(fd uintptr) bool {
		s.rawN, s.rawErr = nbio.Write(int(fd), s.rawBuf)
		return true // one attempt: never wait for the socket
	}
	s.setConn(c, nil)
	return s
}

// setConn makes c the session's connection (fc when it is the event
// loop's socket). Only the goroutine that owns the session calls it, with
// no reply write in flight.
func (s *Session) setConn(c net.Conn, fc *fdConn) {
	var raw syscall.RawConn
	if sc, ok := c.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			raw = rc
		}
	}
	// On a socket Go's poller serves, reads and writes are raw system
	// calls (see nbio); the event loop's socket makes its own.
	var rd io.Reader = c
	var out io.Writer = c
	if raw != nil && fc == nil {
		rd, out = nbio.NewReader(raw, c.LocalAddr(), c.RemoteAddr()), nbio.NewWriter(raw, c.LocalAddr(), c.RemoteAddr())
	}
	s.writeMu.Lock()
	s.connMu.Lock()
	s.conn, s.raw, s.fc, s.out = c, raw, fc, out
	s.rd.rd = rd
	s.wdeadline = deadline.Write{} // none is set on c yet
	s.connMu.Unlock()
	s.writeMu.Unlock()
}

// netConn is the connection, for other goroutines than the owner.
func (s *Session) netConn() net.Conn {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	return s.conn
}

func (s *Session) fdc() *fdConn { return s.fc }

// writeBuffered hands the replies in W to writeAsync, for the event loop,
// which must not wait for a client's socket.
func (s *Session) writeBuffered() {
	b := bytes.Clone(s.W.Bytes())
	s.W.Reset()
	s.asyncBusy = true
	s.writeAsync(b)
}

// asyncFinished tells the owner that the reply write is done, and wakes
// the event loop when it waits for that.
func (s *Session) asyncFinished() {
	s.asyncDone <- struct{}{}
	if s.stalled.Swap(false) {
		s.home.wake(s)
	}
}

// BeginAsync lets another goroutine write the replies to the commands
// served so far, so that the connection's goroutine can go on reading the
// client's next requests: the relay hands a batch's replies to the client
// from the upstream connection's reader, without waking this goroutine
// per reply. It is only possible while no reply is buffered in W. The
// returned write must be called exactly once with the replies; it never
// blocks (when the socket does not take everything at once, the rest is
// written by a goroutine of its own). Until it is done, Flush, and
// BeginAsync itself, wait for it, so replies keep their order.
func (s *Session) BeginAsync() (write func([]byte), ok bool) {
	if !s.WaitAsync() || s.raw == nil || s.W.Len() > 0 || s.ctx.Err() != nil {
		return nil, false
	}
	s.asyncBusy = true
	if s.loop != nil {
		return s.loopWrite, true
	}
	return s.asyncWrite, true
}

// WaitAsync waits until the replies handed to another goroutine by
// BeginAsync are written, or the connection's context ends. It reports
// whether they are written (or there were none): false means the
// connection is going away with a write still in flight, after which no
// further reply may be written or prepared in the memory it uses.
func (s *Session) WaitAsync() bool {
	if s.asyncPoll() {
		return true
	}
	select {
	case <-s.asyncDone:
		s.asyncBusy = false
		return true
	case <-s.ctx.Done():
		// asyncBusy stays set, so no further reply is written after one
		// that may still be in flight.
		return false
	}
}

// asyncPoll is WaitAsync without the wait: whether no reply write is in
// flight any more.
func (s *Session) asyncPoll() bool {
	if !s.asyncBusy {
		return true
	}
	select {
	case <-s.asyncDone:
		s.asyncBusy = false
		return true
	default:
		return false
	}
}

// writeAsync is BeginAsync's write.
func (s *Session) writeAsync(b []byte) {
	locked := s.writeMu.TryLock()
	if locked {
		s.rawBuf = b
		err := s.raw.Write(s.rawFunc)
		n, werr := s.rawN, s.rawErr
		s.rawBuf = nil
		switch {
		case err == nil && werr == nil && n == len(b):
			s.writeMu.Unlock()
			if len(s.pushes) > 0 {
				go s.drainPushes()
			}
			s.asyncFinished()
			return
		case err == nil && werr != nil && werr != syscall.EAGAIN && werr != syscall.EINTR:
			s.writeMu.Unlock()
			s.cancel() // the client is gone
			s.asyncFinished()
			return
		case err == nil && n > 0:
			b = b[n:]
		}
		// Otherwise (a full socket buffer, a deadline passed on an idle
		// connection) the blocking write below sorts it out. The lock
		// goes with it: part of the reply may be out, and nothing else (a
		// push frame) may be written before the rest.
	}
	go func() {
		if !locked {
			s.writeMu.Lock()
		}
		s.wdeadline.Arm(s.conn, replyWriteTimeout)
		_, err := s.out.Write(b)
		s.writeMu.Unlock()
		if err != nil {
			s.cancel()
		}
		if len(s.pushes) > 0 {
			s.drainPushes()
		}
		s.asyncFinished()
	}()
}

// ID is the connection's unique number (CLIENT ID).
func (s *Session) ID() int64 { return s.id }

// Context is canceled when the connection closes or the server shuts down.
func (s *Session) Context() context.Context { return s.ctx }

// RemoteAddr is the client's address.
func (s *Session) RemoteAddr() string { return s.remoteAddr }

// LocalAddr is the address the client connected to.
func (s *Session) LocalAddr() string { return s.localAddr }

// Created is when the connection was accepted.
func (s *Session) Created() time.Time { return s.created }

// LastActive is when the client last sent a command.
func (s *Session) LastActive() time.Time { return time.Unix(0, s.lastActive.Load()) }

// Flush writes the buffered replies. Call it before a command blocks, so
// the replies to the commands before it in the same pipeline are not held
// back.
func (s *Session) Flush() error {
	if s.W.Len() == 0 {
		return nil
	}
	if !s.WaitAsync() {
		s.W.Reset()
		return s.ctx.Err()
	}
	s.writeMu.Lock()
	s.wdeadline.Arm(s.conn, replyWriteTimeout)
	_, err := s.out.Write(s.W.Bytes())
	s.writeMu.Unlock()
	s.W.Reset()
	if err != nil {
		s.cancel()
		return err
	}
	if len(s.pushes) > 0 {
		s.drainPushes()
	}
	return nil
}

// endBatch writes a batch's replies and lets the push frames that waited
// for them (see serving) go.
func (s *Session) endBatch() error {
	err := s.Flush()
	s.serving.Store(false)
	s.passed = false
	if len(s.pushes) > 0 {
		s.drainPushes()
	}
	return err
}

// Close closes the connection from any goroutine; the connection's loop
// ends when its next read or write fails, and the session's context is
// canceled. The relay uses it when the upstream connection that held the
// client's state (a subscription, a transaction) is lost, as Redis would
// have closed it.
func (s *Session) Close() {
	s.cancel()
	_ = s.netConn().Close()
}

// SetAuthenticated lifts the pre-auth caps on what the client may send
// (true), or puts them back (false: RESET signed it out). Only the
// connection's command handler calls it, which owns the reader then.
func (s *Session) SetAuthenticated(ok bool) {
	s.rd.preAuth = !ok
	if !ok && s.authed.Load() {
		s.unauthed.Store(time.Now().UnixNano())
	}
	s.authed.Store(ok)
}

// CloseAfterReply closes the connection once the current reply is written
// (QUIT).
func (s *Session) CloseAfterReply() { s.closeAfter = true }

// Push sends a pre-encoded frame (a RESP3 push) between replies, from any
// goroutine, without blocking: it is written at once when no reply is
// being written, else right after. When more than a few frames wait for a
// client that does not read, further ones are dropped and Push reports
// false.
func (s *Session) Push(frame []byte) bool {
	if s.ctx.Err() != nil {
		return false
	}
	select {
	case s.pushes <- frame:
	default:
		return false
	}
	s.drainPushes()
	return true
}

// drainPushes writes the queued push frames if no one else is writing. A
// writer that holds the lock drains after it lets go, so no frame waits
// for the next reply.
func (s *Session) drainPushes() {
	for len(s.pushes) > 0 && !s.serving.Load() && s.writeMu.TryLock() {
		s.writePushesLocked()
		s.writeMu.Unlock()
	}
}

// writePushesLocked writes every queued push frame; under writeMu.
func (s *Session) writePushesLocked() {
	for {
		select {
		case p := <-s.pushes:
			s.wdeadline.Set(s.conn, time.Now().Add(pushWriteTimeout))
			if _, err := s.out.Write(p); err != nil {
				s.cancel()
			}
		default:
			return
		}
	}
}

// PassPushes writes the replies buffered in W, then every push frame
// queued so far, and lets the frames that come later go to the client as
// they come for the rest of the batch, instead of after the batch's
// replies (see serving). It is for a command whose replies are push
// frames themselves (a pub/sub tunnel's): they must keep the order the
// upstream sends them in, and a reply written to W after the caller made
// sure they arrived must come after them, not before. Frames a writer
// still holds are written before it returns: it waits for the lock, not
// just tries it. Only the connection's goroutine calls it.
func (s *Session) PassPushes() error {
	err := s.Flush()
	if s.serving.Swap(false) {
		s.passed = true
	}
	if err != nil {
		return err
	}
	s.writeMu.Lock()
	s.writePushesLocked()
	s.writeMu.Unlock()
	return nil
}

// HoldPushes undoes PassPushes for the rest of the batch: the command
// layer's replies go to W again (the tunnel ended), and a push that comes
// after one of them waits for it again.
func (s *Session) HoldPushes() {
	if s.passed {
		s.passed = false
		s.serving.Store(true)
	}
}

// SetName records the connection's name (CLIENT SETNAME), for CLIENT LIST
// run on other connections.
func (s *Session) SetName(name string) { s.name.Store(&name) }

// Name is the name SetName recorded, "" if none; any goroutine may ask.
func (s *Session) Name() string {
	if n := s.name.Load(); n != nil {
		return *n
	}
	return ""
}

// SetPubSub records whether the client is subscribed to any channel, for
// CLIENT LIST TYPE run on other connections.
func (s *Session) SetPubSub(on bool) { s.pubsub.Store(on) }

// PubSub tells what SetPubSub recorded; any goroutine may ask.
func (s *Session) PubSub() bool { return s.pubsub.Load() }

// WatchClose watches the connection while the command running on it
// blocks, and cancels the session's context as soon as the peer goes away.
// Call the returned stop before the connection's goroutine reads again.
// Commands the client pipelines meanwhile are kept for after the blocking
// one (up to a bound, past which the watch just stops).
func (s *Session) WatchClose() (stop func()) {
	// The replies before the blocking command are out (the caller flushed
	// them): pushes (a lock lost meanwhile) need not wait for it to end.
	serving := s.serving.Swap(false)
	if len(s.pushes) > 0 {
		s.drainPushes()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := s.rd.watch(); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			s.cancel()
		}
	}()
	return func() {
		_ = s.conn.SetReadDeadline(time.Now()) // ends the watcher's read
		<-done
		_ = s.conn.SetReadDeadline(time.Time{})
		// The server loop notes activity once per batch; a command that
		// blocked for long would leave it stale for the rest of the batch.
		s.lastActive.Store(time.Now().UnixNano())
		s.serving.Store(serving)
	}
}
