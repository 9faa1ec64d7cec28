package resp

import (
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
	// from the connection's goroutine, push frames from others. It is
	// never held while waiting for the client, but on a connection with
	// neither a raw socket nor a tlsSock (see output.go).
	writeMu sync.Mutex
	out     io.Writer // writes to conn over TLS, under writeMu
	// tsock is the socket under a TLS connection (Server.TLSConfig): it
	// keeps the output the client has not read (tls_output.go).
	tsock *tlsSock
	// wdeadline is the connection's write deadline (under writeMu).
	wdeadline deadline.Write
	// The output the client has not taken yet (output.go), under writeMu:
	// obuf, written by flushOut while obuf.flushing. outErr: the write
	// error that ended the connection's output; overflow: how big the
	// output would have grown when it went past outLimit (bytes; 0: no
	// limit).
	obuf     outBuf
	outErr   error
	overflow int
	outLimit int
	// outLimitPubSub bounds it instead while the client is subscribed
	// (see outputLimit); 0: outLimit does.
	outLimitPubSub int
	// overLimit: the connection was closed for its output limit, and
	// said so in the log.
	overLimit atomic.Bool
	// closed: Close was called.
	closed atomic.Bool
	srv    *Server
	pushes chan []byte
	// held are frames PushHeld could not put in pushes (full), in order,
	// under heldMu: they are written after the frames in pushes, and
	// while there are any, PushHeld queues behind them. pushes is full
	// whenever held has frames, except while writePushesLocked (which
	// takes them next) runs, so a check of len(pushes) finds them too.
	heldMu sync.Mutex
	held   [][]byte
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

	// leftRESP3: the client switched back to RESP2 (SetProto), and
	// RESP3 push frames not written by then are dropped (writePushLocked).
	leftRESP3 atomic.Bool

	// Replies written by another goroutine (BeginAsync). asyncBusy is
	// owned by the connection's goroutine; asyncDone gets a token when
	// the outstanding write is done.
	asyncBusy  bool
	asyncDone  chan struct{}
	asyncWrite func([]byte)
	raw        syscall.RawConn // nil when the connection has no file descriptor

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

// replyWriteTimeout is how long a client may read nothing while output
// waits for it before it is closed (a variable for tests);
// pushWriteTimeout bounds the write of one push frame, from other
// goroutines, on a connection written blocking (writeConnLocked).
var replyWriteTimeout = 30 * time.Second

const pushWriteTimeout = 5 * time.Second

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
	s.obuf.fn = s.obuf.rawWrite
	s.setConn(c, nil)
	return s
}

// setConn makes c the session's connection (fc when it is the event
// loop's socket). Only the goroutine that owns the session calls it, with
// no reply write in flight.
func (s *Session) setConn(c net.Conn, fc *fdConn) {
	var raw syscall.RawConn
	var rd io.Reader = c
	var out io.Writer = c
	if fc == nil {
		raw, rd, out = pollerIO(c)
	} else if sc, ok := c.(syscall.Conn); ok {
		// The event loop's socket reads and writes by itself; its raw
		// connection serves the non-blocking write attempts.
		if rc, err := sc.SyscallConn(); err == nil {
			raw = rc
		}
	}
	s.writeMu.Lock()
	s.setConnLocked(c, fc, raw, rd, out)
	s.writeMu.Unlock()
}

// pollerIO is how a connection in Go's poller is read and written: with
// raw system calls on a socket (see nbio), through c itself otherwise
// (TLS, or where nbio.Raw is false; raw is nil then).
func pollerIO(c net.Conn) (raw syscall.RawConn, rd io.Reader, out io.Writer) {
	if sc, ok := c.(syscall.Conn); ok && nbio.Raw {
		if rc, err := sc.SyscallConn(); err == nil {
			return rc, nbio.NewReader(rc, c.LocalAddr(), c.RemoteAddr()), nbio.NewWriter(rc, c.LocalAddr(), c.RemoteAddr())
		}
	}
	return nil, c, c
}

// setConnLocked is setConn's switch, under writeMu: a flushOut running
// sees the old connection or the new one, never a mix.
func (s *Session) setConnLocked(c net.Conn, fc *fdConn, raw syscall.RawConn, rd io.Reader, out io.Writer) {
	s.connMu.Lock()
	s.conn, s.raw, s.fc, s.out = c, raw, fc, out
	s.rd.rd = rd
	s.wdeadline = deadline.Write{} // none is set on c yet
	s.connMu.Unlock()
}

// netConn is the connection, for other goroutines than the owner.
func (s *Session) netConn() net.Conn {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	return s.conn
}

func (s *Session) fdc() *fdConn { return s.fc }

// writeBuffered writes the replies in W, for the event loop: as any
// write, it never waits for the client's socket (output.go).
func (s *Session) writeBuffered() {
	if s.write(s.W.Bytes()) == nil && len(s.pushes) > 0 {
		s.drainPushes()
	}
	s.W.Reset()
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
// blocks (what the socket does not take at once waits in the output
// buffer, output.go). Until it is done, Flush, and BeginAsync itself,
// wait for it, so replies keep their order.
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
// BeginAsync are written (or queued behind the output pending), or the
// connection's context ends. It reports whether they are written (or
// there were none): false means the connection is going away with a write
// still in flight, after which no further reply may be written or
// prepared in the memory it uses.
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

// writeAsync is BeginAsync's write. It never waits for the client: what
// the socket does not take is queued (output.go), so the replies are done
// with as far as ordering goes.
func (s *Session) writeAsync(b []byte) {
	if s.write(b) == nil && len(s.pushes) > 0 {
		s.drainPushes()
	}
	s.asyncFinished()
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
	err := s.write(s.W.Bytes())
	s.W.Reset()
	if err != nil {
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
	// Before the connection is read: a hand-over between the event loop
	// and Go's poller that swaps it meanwhile closes the new one
	// (closeIfClosed).
	s.closed.Store(true)
	s.cancel()
	_ = s.closeConn()
}

// closeConn closes the connection. Over a tlsSock, crypto/tls writes
// close_notify first: the tlsSock is told, so that it does not take that
// write for one past the output limit.
func (s *Session) closeConn() error {
	if s.tsock != nil {
		s.tsock.closing.Store(true)
	}
	return s.netConn().Close()
}

// closeIfClosed closes c, just made the session's connection, when Close
// ran meanwhile and may have closed the one it replaced.
func (s *Session) closeIfClosed(c net.Conn) {
	if s.closed.Load() {
		_ = c.Close()
	}
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
// false (PushHeld keeps them).
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

// maxHeldPushes bounds the frames PushHeld keeps past pushes' room for a
// connection: as many as a connection may have KEEPALIVE locks (commands'
// maxKeepalivePerConn), whose lock-lost notices are what it keeps.
const maxHeldPushes = 10000

// PushHeld is Push for a frame that must not be dropped (a lock-lost
// notice): when pushes is full (a batch's replies are not written yet, or
// another writer holds the connection), the frame waits in held instead,
// to be written after the ones before it. Past maxHeldPushes frames
// waiting, the connection is closed instead of the frame dropped: its
// client then learns, as from any close, that what it held through the
// connection is gone. It reports false when the frame will not be
// written: the connection is closed (or closing).
func (s *Session) PushHeld(frame []byte) bool {
	if s.ctx.Err() != nil {
		return false
	}
	s.heldMu.Lock()
	if len(s.held) == 0 {
		select {
		case s.pushes <- frame:
			s.heldMu.Unlock()
			s.drainPushes()
			return true
		default:
		}
	}
	if len(s.held) >= maxHeldPushes {
		s.heldMu.Unlock()
		s.Close()
		return false
	}
	s.held = append(s.held, frame)
	s.heldMu.Unlock()
	s.drainPushes()
	return true
}

// drainPushes writes the queued push frames if no one else is writing. A
// writer that holds the lock drains after it lets go, so no frame waits
// for the next reply.
func (s *Session) drainPushes() {
	for len(s.pushes) > 0 && !s.serving.Load() && s.writeMu.TryLock() {
		err := s.writePushesLocked()
		s.writeMu.Unlock()
		if err != nil {
			s.fail(err)
			return
		}
	}
}

// writePushesLocked writes every queued push frame, or queues it behind
// the output pending (output.go, tls_output.go); under writeMu. On a
// connection with neither a raw socket nor a tlsSock, each write waits at
// most pushWriteTimeout for the client.
func (s *Session) writePushesLocked() error {
	for {
		select {
		case p := <-s.pushes:
			if err := s.writePushLocked(p); err != nil {
				return err
			}
			continue
		default:
		}
		// pushes is empty: the frames PushHeld kept past its room come
		// next, and then whatever was queued meanwhile.
		s.heldMu.Lock()
		held := s.held
		s.held = nil
		s.heldMu.Unlock()
		if len(held) == 0 {
			return nil
		}
		for _, p := range held {
			if err := s.writePushLocked(p); err != nil {
				return err
			}
		}
	}
}

// writePushLocked writes one push frame (see writePushesLocked). A RESP3
// push ('>') is dropped once the client has switched to RESP2: a RESP2
// client cannot take one (redis-py fails with a protocol error, go-redis
// takes it for the reply to its next command), and Redis never sends one
// to a RESP2 client. Such a frame was queued while the client spoke
// RESP3 and waited for the replies of the batch that switched it; what it
// tells must not rest on it alone (a lock-lost notice is also the reply
// to the connection's next command on the lock).
func (s *Session) writePushLocked(p []byte) error {
	if len(p) > 0 && p[0] == '>' && s.leftRESP3.Load() {
		return nil
	}
	if s.raw == nil {
		return s.writeConnLocked(p, true)
	}
	return s.sendLocked(p)
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
	err = s.writePushesLocked()
	s.writeMu.Unlock()
	if err != nil {
		s.fail(err)
	}
	return err
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

// SetProto switches the replies written from now on to RESP version p
// (HELLO, RESET). Only the connection's goroutine calls it, before the
// reply that switches, so that a push frame written after that reply
// finds the switch (writePushLocked); one written before it was written
// before the reply, while the client still read RESP3.
func (s *Session) SetProto(p int) {
	s.W.SetProto(p)
	s.leftRESP3.Store(p < 3)
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
// one, up to a bound (maxWatchBuffer); past it, nothing more is read, and
// the peer's close is watched for without reading (peerGone, on Linux),
// so that a client gone behind a long pipeline is not served, say granted
// a lock, as if it were there.
func (s *Session) WatchClose() (stop func()) {
	// The replies before the blocking command are out (the caller flushed
	// them): pushes (a lock lost meanwhile) need not wait for it to end.
	serving := s.serving.Swap(false)
	if len(s.pushes) > 0 {
		s.drainPushes()
	}
	done, stopping := make(chan struct{}), make(chan struct{})
	raw := s.raw
	if raw == nil && s.tsock != nil {
		// Over TLS the socket under crypto/tls is watched: the peer's
		// close shows there as on plain TCP.
		raw = s.tsock.raw
	}
	go func() {
		defer close(done)
		err := s.rd.watch()
		switch {
		case err == nil:
			// The buffer bound is reached.
			if peerGone(raw, stopping) {
				s.cancel()
			}
		case !errors.Is(err, os.ErrDeadlineExceeded):
			s.cancel()
		}
	}()
	return func() {
		close(stopping)
		_ = s.conn.SetReadDeadline(time.Now()) // ends the watcher's read
		<-done
		_ = s.conn.SetReadDeadline(time.Time{})
		// The server loop notes activity once per batch; a command that
		// blocked for long would leave it stale for the rest of the batch.
		s.lastActive.Store(time.Now().UnixNano())
		s.serving.Store(serving)
	}
}
