//go:build linux

package resp

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockproxy/lockproxy/internal/nbio"
)

// The event loop serves plain TCP connections whose commands it can run
// without blocking: on the relay's hot path, a request is read, parsed,
// queued for the upstream and the upstream write is shared by every
// connection ready in the same round, with no goroutine woken per request
// and no read that finds the socket empty. A goroutine per connection (Go's
// poller) costs a wake-up and an extra read per request, which measured as
// about a third of the relay's CPU per unpipelined request (see
// test/bench, BenchmarkPassthrough).
//
// Every connection starts on the loop. The first batch it cannot serve
// without blocking (a lock command, a transaction, a blocking pop, a
// command that waits for a relayed reply) moves it to a goroutine of its
// own for good: the connection is taken out of the loop's epoll set and
// handed to Go's poller, and it is served as it would have been from the
// start.
//
// Connections on the loop are not in Go's poller: the loop reads them with
// plain non-blocking reads, and replies are written with one non-blocking
// write, the rest (a client that does not read) by a goroutine that polls.

// errWouldBlock is a non-blocking read that found nothing to read.
var errWouldBlock = errors.New("resp: would block")

// loopEvents is how many ready connections one epoll_wait returns at most.
const loopEvents = 256

type eventLoop struct {
	srv    *Server
	h      LoopHandler
	epfd   int
	poller *os.File // epfd in Go's poller: the loop parks like any goroutine
	wakeFD int      // eventfd: other goroutines wake the loop

	mu       sync.Mutex
	sessions map[int64]*Session // on the loop
	resume   []*Session         // whose reply write finished while they waited
	stopping bool
	closed   bool // wakeFD is closed: no more wake-ups
	// writes are replies the upstream's reader hands the loop to write
	// (deliver): the loop writes a burst of them while the next requests
	// arrive, which it then reads and relays together.
	writes []loopWrite
	// inRound: the loop is serving, and sees writes and resume before it
	// waits again, so no wake-up is needed; kicked: one is on its way.
	inRound, kicked bool

	later []func() // run after the round (upstream writes); the loop's own
	// laterFn is addLater as a value, made once: a method value made per
	// batch would allocate on the relay's hot path.
	laterFn func(func())
	done    chan struct{}
}

// startLoop starts the event loop for srv, or returns an error when the
// system refuses an epoll set or an eventfd.
func startLoop(srv *Server, h LoopHandler) (*eventLoop, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	// Non-blocking, so that os.NewFile puts it in Go's poller: the loop
	// waits for the epoll set to be readable (some connection ready)
	// without holding a thread.
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("epoll set: %w", err)
	}
	wfd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wfd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: -1, Pad: -1}); err != nil {
		unix.Close(epfd)
		unix.Close(wfd)
		return nil, fmt.Errorf("epoll_ctl eventfd: %w", err)
	}
	l := &eventLoop{
		srv: srv, h: h,
		epfd: epfd, poller: os.NewFile(uintptr(epfd), "lockproxy-loop"), wakeFD: wfd,
		sessions: make(map[int64]*Session),
		done:     make(chan struct{}),
	}
	l.laterFn = l.addLater
	go l.run()
	return l, nil
}

// add takes sess's connection out of Go's poller and serves it on the
// loop. On an error the session is left as it was, for a goroutine.
func (l *eventLoop) add(sess *Session, tc *net.TCPConn) error {
	rc, err := tc.SyscallConn()
	if err != nil {
		return err
	}
	fd := -1
	var derr error
	if err := rc.Control(func(s uintptr) {
		fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return err
	}
	if derr != nil {
		return fmt.Errorf("dup: %w", derr)
	}
	// The duplicate shares the socket (and its non-blocking flag); closing
	// the original takes it out of Go's poller.
	fc := &fdConn{fd: fd, local: tc.LocalAddr(), remote: tc.RemoteAddr()}
	sess.setConn(fc, fc)
	// Close may have closed tc after the duplicate was made.
	sess.closeIfClosed(fc)
	sess.loop, sess.home = l, l
	sess.loopWrite = func(b []byte) { l.deliver(sess, b) }
	_ = tc.Close()

	// Under l.mu, so that a shutdown (closeAll) either finds the session
	// in the set or makes it go to a goroutine.
	l.mu.Lock()
	if l.stopping {
		l.mu.Unlock()
		return l.fail(sess, errors.New("server shutting down"))
	}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, fd, loopEvent(sess, unix.EPOLLIN|unix.EPOLLRDHUP)); err != nil {
		l.mu.Unlock()
		// Give it to a goroutine after all.
		return l.fail(sess, err)
	}
	l.sessions[sess.id] = sess
	l.srv.loopClients.Add(1)
	l.mu.Unlock()
	return nil
}

// fail hands a session that could not join the loop back to the caller,
// on a connection Go's poller serves.
func (l *eventLoop) fail(sess *Session, err error) error {
	sess.loop = nil
	if nc, cerr := sess.toPoller(sess.fdc()); cerr == nil {
		if l.srv.isClosing() {
			// Shutdown's wake-up may have gone to the old socket.
			_ = nc.SetReadDeadline(time.Now())
		}
	} else {
		sess.fdc().destroy()
	}
	return err
}

type loopWrite struct {
	sess *Session
	b    []byte
}

// deliver has the loop write b, a reply to sess's relayed commands, from
// the goroutine of the upstream connection that read it.
func (l *eventLoop) deliver(sess *Session, b []byte) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		sess.writeAsync(b)
		return
	}
	l.writes = append(l.writes, loopWrite{sess, b})
	if !l.inRound && !l.kicked {
		l.kicked = true
		l.kickLocked()
	}
	l.mu.Unlock()
}

func loopEvent(sess *Session, events uint32) *unix.EpollEvent {
	return &unix.EpollEvent{Events: events, Fd: int32(sess.id), Pad: int32(sess.id >> 32)}
}

func eventID(ev *unix.EpollEvent) int64 {
	return int64(uint32(ev.Fd)) | int64(ev.Pad)<<32
}

// wake makes the loop serve sess again, from any goroutine.
func (l *eventLoop) wake(sess *Session) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.resume = append(l.resume, sess)
	if !l.inRound && !l.kicked {
		l.kicked = true
		l.kickLocked()
	}
}

// kickLocked wakes the loop; under l.mu, which keeps wakeFD open.
func (l *eventLoop) kickLocked() {
	if l.closed {
		return
	}
	one := [8]byte{1}
	_, _ = nbio.Write(l.wakeFD, one[:])
}

// stop makes the loop close every connection it serves, after the replies
// in flight, and end. It returns at once; the server waits for the
// sessions through its WaitGroup.
func (l *eventLoop) stop() {
	l.mu.Lock()
	l.stopping = true
	l.kickLocked()
	l.mu.Unlock()
}

func (l *eventLoop) run() {
	defer close(l.done)
	defer func() {
		// Also when the loop failed: its connections go on on goroutines,
		// what it queued upstream is written, and no new connection joins
		// it.
		l.mu.Lock()
		shutdown := l.stopping
		l.mu.Unlock()
		l.closeAll(shutdown)
		_ = l.poller.Close()
	}()
	rc, err := l.poller.SyscallConn()
	if err != nil {
		l.srv.Logger.Error("event loop: no poller; connections stay on goroutines")
		return
	}
	events := make([]unix.EpollEvent, loopEvents)
	var ready []*Session
	var writes []loopWrite
	more := false // writes or wake-ups came in during the last round
	held := 0     // rounds served since requests were queued upstream
	for {
		n, werr := nbio.EpollPoll(l.epfd, events)
		if werr == unix.EINTR {
			n, werr = 0, nil
		}
		if werr != nil {
			l.srv.Logger.Error(fmt.Sprintf("event loop: epoll_wait: %v", werr))
			return
		}
		if n == 0 && !more {
			if len(l.later) > 0 {
				// No client is ready: the requests of the rounds so far
				// go upstream in one write, then look again.
				l.runLater()
				held = 0
				continue
			}
			l.mu.Lock()
			if len(l.writes) > 0 || len(l.resume) > 0 || l.stopping {
				l.mu.Unlock()
				more = true
				continue
			}
			l.inRound = false // from now on, hand-ins kick the eventfd
			l.mu.Unlock()
			if err := rc.Read(func(fd uintptr) bool {
				n, werr = nbio.EpollPoll(int(fd), events)
				// Nothing ready: let Go's poller wait for the set to be.
				return n != 0 || (werr != nil && werr != unix.EINTR)
			}); err != nil || werr != nil {
				l.srv.Logger.Error(fmt.Sprintf("event loop: epoll_wait: %v %v", err, werr))
				return
			}
		}

		ready = ready[:0]
		l.mu.Lock()
		l.inRound, l.kicked = true, false
		writes, l.writes = l.writes, writes[:0]
		for i := range events[:n] {
			ev := &events[i]
			if ev.Fd == -1 && ev.Pad == -1 {
				var b [8]byte
				_, _ = nbio.Read(l.wakeFD, b[:])
				continue
			}
			if sess := l.sessions[eventID(ev)]; sess != nil {
				ready = append(ready, sess)
			}
		}
		resume := l.resume
		l.resume = nil
		stopping := l.stopping
		l.mu.Unlock()

		// Replies first: while they go out, the next requests come in.
		for i, w := range writes {
			w.sess.writeAsync(w.b)
			writes[i] = loopWrite{}
		}
		if stopping {
			return // the deferred closeAll ends the sessions
		}
		for _, sess := range ready {
			if sess.loop == l { // not handed off earlier in this round
				l.readable(sess)
			}
		}
		for _, sess := range resume {
			if sess.loop == l && l.owns(sess) {
				l.serve(sess)
			}
		}
		// Requests wait for the loop to run out of ready clients, so that
		// many go upstream in one write, but not for long.
		if len(l.later) > 0 {
			if held++; held >= maxHeldRounds {
				l.runLater()
				held = 0
			}
		}

		l.mu.Lock()
		more = len(l.writes) > 0 || len(l.resume) > 0 || l.stopping
		l.mu.Unlock()
	}
}

// maxHeldRounds bounds how many rounds requests queued for the upstream
// wait for the loop to run out of ready clients.
const maxHeldRounds = 8

// runLater runs what the round's commands left for after it.
func (l *eventLoop) runLater() {
	for i, f := range l.later {
		f()
		l.later[i] = nil
	}
	l.later = l.later[:0]
}

// wait returns once the loop has ended.
func (l *eventLoop) wait() { <-l.done }

func (l *eventLoop) owns(sess *Session) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sessions[sess.id] == sess
}

// readable reads what sess's client sent and serves it.
func (l *eventLoop) readable(sess *Session) {
	if sess.paused {
		// Out of the set, yet reported: the socket hung up or failed.
		l.close(sess)
		return
	}
	if sess.rd.Buffered() >= maxWatchBuffer && !l.asyncIdle(sess) {
		// Waiting for a reply write to finish (asyncIdle marked it to be
		// woken), with a megabyte of requests read ahead: stop reading
		// until it is done. Without a write in flight, a big command is
		// read on, as on a goroutine.
		l.pause(sess)
		return
	}
	err := sess.rd.fill(sess.rd.need)
	switch {
	case err == errWouldBlock:
		return
	case err != nil && sess.rd.Buffered() > 0:
		// The client sent its last requests and closed: a goroutine
		// serves them once the replies before them are written, then
		// sees the end.
		l.handOff(sess, nil, nil)
		return
	case err != nil:
		l.close(sess)
		return
	}
	l.serve(sess)
}

// pause takes sess's connection out of the epoll set until its reply
// write is done (serve puts it back).
func (l *eventLoop) pause(sess *Session) {
	sess.paused = true
	_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_MOD, sess.fdc().fd, loopEvent(sess, 0))
}

// serve runs the commands buffered for sess, when the replies to its
// previous ones are written and it can run them without blocking; a batch
// it cannot run here moves the connection to a goroutine.
func (l *eventLoop) serve(sess *Session) {
	if !l.asyncIdle(sess) {
		return // wake brings it back
	}
	if sess.paused {
		sess.paused = false
		_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_MOD, sess.fdc().fd, loopEvent(sess, unix.EPOLLIN|unix.EPOLLRDHUP))
	}
	cmds, perr := sess.rd.parseViews()
	if len(cmds) == 0 && perr == nil {
		return // a command is not complete yet
	}
	if perr != nil || sess.ctx.Err() != nil || !l.h.ServeLoop(sess, cmds) {
		l.handOff(sess, sess.rd.detach(), perr)
		return
	}
	sess.lastActive.Store(time.Now().UnixNano())
	if sess.W.Len() > 0 {
		sess.writeBuffered()
	}
	// The batch is served and its views are dead: give back what a big
	// command grew now, as the client may idle from here on and the loop
	// reads it only when it sends more.
	sess.rd.release()
	if sess.rd.cut {
		// The batch stopped with more commands buffered (a client not yet
		// authenticated pipelined more than one, or more than
		// maxBatchCommands): the rest is served in the next round, no
		// event will say so.
		l.mu.Lock()
		l.resume = append(l.resume, sess)
		l.mu.Unlock()
	}
}

// asyncIdle reports whether no reply write of sess is in flight. When one
// is, sess is marked to be woken when it is done.
func (l *eventLoop) asyncIdle(sess *Session) bool {
	if sess.asyncPoll() {
		return true
	}
	sess.stalled.Store(true)
	// The write may have finished in between, before it saw the mark.
	if sess.asyncPoll() {
		// A wake may still come for it: serving twice is harmless.
		sess.stalled.Store(false)
		return true
	}
	return false
}

// handOff moves sess to a goroutine of its own, which serves cmds (and
// perr) first.
func (l *eventLoop) handOff(sess *Session, cmds [][][]byte, perr error) {
	l.srv.loopHandoffs.Add(1)
	l.detach(sess)
	go l.srv.adopt(sess, cmds, perr)
}

// close ends a session on the loop: its client went away or failed.
func (l *eventLoop) close(sess *Session) {
	l.detach(sess)
	go l.srv.finishLoopSession(sess)
}

func (l *eventLoop) detach(sess *Session) {
	_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, sess.fdc().fd, nil)
	l.mu.Lock()
	delete(l.sessions, sess.id)
	l.mu.Unlock()
	l.srv.loopClients.Add(-1)
	sess.loop = nil
	sess.stalled.Store(false)
	sess.paused = false // out of the set; if it comes back, it is read again
}

// closeAll ends every session on the loop, when the loop ends. At
// shutdown, a session with requests read and not yet served goes to a
// goroutine, which serves them and then closes it, and the others are
// closed once their replies in flight are out; when the loop failed, every
// session goes on on a goroutine of its own.
func (l *eventLoop) closeAll(shutdown bool) {
	l.mu.Lock()
	l.stopping = true
	all := make([]*Session, 0, len(l.sessions))
	for _, sess := range l.sessions {
		all = append(all, sess)
	}
	l.mu.Unlock()
	for _, sess := range all {
		if !shutdown || sess.rd.Buffered() > 0 {
			l.handOff(sess, nil, nil)
		} else {
			l.close(sess)
		}
	}
	l.runLater()
	// Replies handed in from now on are written by whoever hands them in.
	l.mu.Lock()
	writes := l.writes
	l.writes = nil
	if !l.closed {
		l.closed = true
		_ = unix.Close(l.wakeFD)
	}
	l.mu.Unlock()
	for _, w := range writes {
		w.sess.writeAsync(w.b)
	}
}

// Later runs f after the loop has served every connection ready in this
// round; nil when sess is not served on the loop. The relay writes the
// round's requests upstream there, once per upstream connection.
func (s *Session) Later() func(func()) {
	if s.loop == nil {
		return nil
	}
	return s.loop.laterFn
}

func (l *eventLoop) addLater(f func()) { l.later = append(l.later, f) }

// adopt serves a session the loop handed over on this goroutine.
func (s *Server) adopt(sess *Session, cmds [][][]byte, perr error) {
	// The replies in flight are written to the socket the loop used.
	sess.WaitAsync()
	fc := sess.fdc()
	nc, err := sess.toPoller(fc)
	if err != nil {
		s.Logger.Warn(fmt.Sprintf("moving a connection off the event loop: %v", err))
		fc.destroy()
		sess.cancel()
		s.forget(sess)
		s.Handler.Closed(sess)
		s.wg.Done()
		return
	}
	if s.isClosing() {
		// Shutdown's wake-up went to the loop's socket: the batch is
		// served, and the connection then closed rather than read.
		_ = nc.SetReadDeadline(time.Now())
	}
	s.serveConn(sess, cmds, perr)
}

// returnToLoop gives a connection served on its goroutine back to the
// loop, once its replies are out; it reports false when the connection
// stays on the goroutine (the server is closing, or the loop refused it).
func (s *Server) returnToLoop(l *eventLoop, sess *Session) bool {
	tc, ok := sess.conn.(*net.TCPConn)
	// Not while output waits for the client: flushOut would go on on the
	// loop's socket, waiting in poll(2), where Go's poller waits for it
	// without holding a thread.
	if !ok || s.isClosing() || !sess.WaitAsync() || sess.outputPending() {
		return false
	}
	if err := l.add(sess, tc); err != nil {
		// add gave it back on a new net.Conn, served here as before.
		return false
	}
	s.loopReturns.Add(1)
	return true
}

// finishLoopSession ends a session whose connection the loop closed.
func (s *Server) finishLoopSession(sess *Session) {
	defer s.wg.Done()
	sess.WaitAsync()
	sess.waitOutput()
	sess.cancel()
	sess.writeMu.Lock()
	sess.fdc().destroy()
	sess.writeMu.Unlock()
	s.forget(sess)
	s.Handler.Closed(sess)
}

// fdConn is a connection on the event loop: a non-blocking socket outside
// Go's poller. Reads never wait (errWouldBlock); writes wait for the socket
// with poll(2), for the rare client that does not read its replies.
type fdConn struct {
	// mu is held for reading around every use of fd, and for writing to
	// close it or give it to Go's poller, so that a write from another
	// goroutine never lands on a descriptor number reused meanwhile.
	mu            sync.RWMutex
	fd            int // -1 once closed or handed over
	local, remote net.Addr
	wdeadline     atomic.Int64 // unix ns; 0: none
	shut          atomic.Bool
}

func (c *fdConn) Read(b []byte) (int, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.fd < 0 {
		return 0, net.ErrClosed
	}
	for {
		n, err := nbio.Read(c.fd, b)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return 0, errWouldBlock
		case err != nil:
			return 0, err
		case n == 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

// pollSlice bounds one poll(2), so that a close waits at most this long
// for a writer that waits for the socket.
const pollSlice = 50 * time.Millisecond

func (c *fdConn) Write(b []byte) (int, error) {
	total := 0
	for len(b) > 0 {
		c.mu.RLock()
		if c.fd < 0 || c.shut.Load() {
			c.mu.RUnlock()
			return total, net.ErrClosed
		}
		n, err := nbio.Write(c.fd, b)
		if n > 0 {
			total += n
			b = b[n:]
		}
		if err == unix.EAGAIN {
			wait := pollSlice
			if dl := c.wdeadline.Load(); dl != 0 {
				left := time.Until(time.Unix(0, dl))
				if left <= 0 {
					c.mu.RUnlock()
					return total, os.ErrDeadlineExceeded
				}
				wait = min(wait, left)
			}
			fds := []unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLOUT}}
			_, err = unix.Poll(fds, int(wait.Milliseconds())+1)
			if err == unix.EINTR {
				err = nil
			}
		}
		c.mu.RUnlock()
		if err != nil && err != unix.EAGAIN && err != unix.EINTR {
			return total, err
		}
	}
	return total, nil
}

// Close shuts the socket down without freeing the descriptor: the loop
// sees the end of input and closes it (destroy) once no one uses it.
func (c *fdConn) Close() error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.fd < 0 || c.shut.Swap(true) {
		return nil
	}
	return unix.Shutdown(c.fd, unix.SHUT_RDWR)
}

// destroy closes the descriptor.
func (c *fdConn) destroy() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fd >= 0 {
		_ = unix.Close(c.fd)
		c.fd = -1
	}
}

// toPoller gives the loop's socket fc of sess to Go's poller, and makes it
// the session's connection. Under writeMu, so that a flushOut running
// meanwhile writes to the old socket or the new one, never to neither.
func (sess *Session) toPoller(fc *fdConn) (net.Conn, error) {
	sess.writeMu.Lock()
	defer sess.writeMu.Unlock()
	nc, err := fc.netConn()
	if err != nil {
		return nil, err
	}
	raw, rd, out := pollerIO(nc)
	sess.setConnLocked(nc, nil, raw, rd, out)
	sess.closeIfClosed(nc)
	return nc, nil
}

// waitWritable waits until the socket takes more output, at most
// pollSlice (so that a close or a hand-over waits at most that long for
// it) and not past until; it reports whether until has passed. What the
// socket says (closed, handed over) is for the next write attempt to
// tell.
func (c *fdConn) waitWritable(until time.Time) bool {
	left := time.Until(until)
	if left <= 0 {
		return true
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.fd < 0 || c.shut.Load() {
		return false
	}
	fds := []unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLOUT}}
	_, _ = unix.Poll(fds, int(min(pollSlice, left).Milliseconds())+1)
	return false
}

// netConn gives the socket to Go's poller as a net.Conn; c is done.
func (c *fdConn) netConn() (net.Conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fd < 0 {
		return nil, net.ErrClosed
	}
	f := os.NewFile(uintptr(c.fd), "client")
	nc, err := net.FileConn(f) // a duplicate, in Go's poller
	_ = f.Close()
	c.fd = -1
	if err == nil && c.shut.Load() {
		_ = nc.Close()
		return nil, net.ErrClosed
	}
	return nc, err
}

func (c *fdConn) LocalAddr() net.Addr  { return c.local }
func (c *fdConn) RemoteAddr() net.Addr { return c.remote }

// SetReadDeadline does nothing: the loop never waits to read.
func (c *fdConn) SetReadDeadline(time.Time) error { return nil }

func (c *fdConn) SetWriteDeadline(t time.Time) error {
	if t.IsZero() {
		c.wdeadline.Store(0)
	} else {
		c.wdeadline.Store(t.UnixNano())
	}
	return nil
}

func (c *fdConn) SetDeadline(t time.Time) error { return c.SetWriteDeadline(t) }

// SyscallConn gives the session's non-blocking write attempts (output.go).
func (c *fdConn) SyscallConn() (syscall.RawConn, error) { return fdRaw{c}, nil }

type fdRaw struct{ c *fdConn }

func (r fdRaw) Control(f func(fd uintptr)) error {
	r.c.mu.RLock()
	defer r.c.mu.RUnlock()
	if r.c.fd < 0 {
		return net.ErrClosed
	}
	f(uintptr(r.c.fd))
	return nil
}

func (r fdRaw) Read(f func(fd uintptr) bool) error { return errors.New("resp: not supported") }

// Write calls f once: nothing waits for this socket through its raw
// connection (writes are tried with Control; flushOut waits with
// waitWritable).
func (r fdRaw) Write(f func(fd uintptr) bool) error {
	r.c.mu.RLock()
	defer r.c.mu.RUnlock()
	if r.c.fd < 0 || r.c.shut.Load() {
		return net.ErrClosed
	}
	f(uintptr(r.c.fd))
	return nil
}
