package resp

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Handler serves the commands of one connection.
type Handler interface {
	// ServeRESP runs one command and writes its reply to s.W. It runs on
	// the connection's own goroutine, one command at a time.
	ServeRESP(s *Session, args [][]byte)
	// Closed runs once after the connection closed and its session context
	// was canceled, on the connection's goroutine and under no server lock,
	// so it may hand work to other goroutines but should not block long.
	Closed(s *Session)
}

// BatchHandler is a Handler that is told when it has served a batch of
// pipelined commands, before their replies are flushed: the relay collects
// the replies of the commands it sent upstream there.
type BatchHandler interface {
	EndBatch(s *Session)
}

// ShutdownHandler is a Handler told when the server starts shutting down,
// before it closes any connection for it: what the handler does when a
// connection closes may depend on whether the server is going away.
type ShutdownHandler interface {
	ShuttingDown()
}

// LoopHandler is a Handler some of whose batches can run on the server's
// event loop (see loop_linux.go). ServeLoop serves cmds as ServeRESP for
// each and then EndBatch would, when it can do so without blocking (no
// network round trip waited for, no lock held across one), and reports
// true; otherwise it changes nothing and reports false, and the connection
// moves to a goroutine of its own for the rest of its life.
// The arguments are views of the read buffer: ServeLoop must not keep them.
// LoopSafe tells, on the connection's goroutine and before the batch is
// served, whether ServeLoop would have served it; LoopReady whether the
// connection's state (no transaction, pinned connection, pending replies
// or watchdog) lets it go back to the loop.
type LoopHandler interface {
	ServeLoop(s *Session, cmds [][][]byte) bool
	LoopSafe(s *Session, cmds [][][]byte) bool
	LoopReady(s *Session) bool
}

// shutdownGrace is how long Shutdown, out of time, lets the commands it
// canceled write their replies ("-ERR command canceled …") before it
// closes the connections that still have not (a variable for tests).
var shutdownGrace = 200 * time.Millisecond

// tlsHandshakeTimeout bounds a client's TLS handshake (a variable for
// tests).
var tlsHandshakeTimeout = 10 * time.Second

// loopReturnAfter is how many batches in a row a connection moved off the
// event loop serves that the loop could have served before it goes back:
// a pooled connection that took a lock once returns to the loop for its
// ordinary traffic, and one that alternates does not move at every batch.
const loopReturnAfter = 16

// Server accepts RESP connections. It runs its own connection loop and
// command reader rather than tidwall/redcon's, for what redcon does not
// do: replies to the commands before a protocol error, Redis's input
// limits, one allocation per batch instead of per command, a session
// context canceled as soon as the peer goes away (even while a command
// blocks), replies flushed before a command blocks, and a shutdown that
// waits for the commands in flight.
type Server struct {
	Handler Handler
	Logger  *zap.Logger
	// MaxClients caps open connections; more are refused with Redis's text.
	MaxClients int
	// EventLoop serves plain TCP connections on an event loop while their
	// commands allow it (Linux, with a LoopHandler).
	EventLoop bool
	// AuthRequired starts every connection under the pre-auth caps
	// (PreAuthMaxArgs, PreAuthMaxBulkLen) until the handler lifts them
	// (Session.SetAuthenticated).
	AuthRequired bool
	// AuthTimeout, with AuthRequired, closes connections still not
	// authenticated this long after they were accepted: a client that
	// does not know the password must not hold a slot (and a file
	// descriptor) for good. 0: never.
	AuthTimeout time.Duration
	// MaxOutput bounds, in bytes, the replies a connection holds for a
	// client that does not read them as fast as it sends commands; past
	// it the client is closed, as Redis does past
	// client-output-buffer-limit. 0: no limit (Redis's default for
	// normal clients).
	MaxOutput int
	// MaxOutputPubSub bounds it, where lower, while the client is
	// subscribed (SetPubSub), as Redis's client-output-buffer-limit
	// pubsub (32 MB); 0: MaxOutput does.
	MaxOutputPubSub int
	// TLSConfig, when set, makes every connection TLS, on goroutines (not
	// the event loop), with the same output buffering and bounds as plain
	// TCP (tls_output.go): pass the plain TCP listener to Serve. A
	// listener that does TLS itself (tls.NewListener) works too, but its
	// replies are written blocking: a client that writes a whole pipeline
	// before it reads stalls until the write timeout.
	TLSConfig *tls.Config

	baseCtx  context.Context
	cancel   context.CancelFunc
	nextID   atomic.Int64
	mu       sync.Mutex
	ln       net.Listener
	sessions map[*Session]struct{}
	closing  bool
	wg       sync.WaitGroup
	once     sync.Once
	loop     *eventLoop
	// On the event loop now, moved off it so far, and back on it.
	loopClients, loopHandoffs, loopReturns atomic.Int64
	// Connections closed for not authenticating in time, and TLS
	// handshakes that failed or timed out.
	authTimeouts, tlsFailures atomic.Int64
	// Connections refused at MaxClients.
	rejected atomic.Int64
	// Connections closed for going past MaxOutput.
	outputLimitCloses atomic.Int64
}

// OutputLimitCloses tells how many connections were closed for going past
// MaxOutput, since the start.
func (s *Server) OutputLimitCloses() int64 { return s.outputLimitCloses.Load() }

// ConnStats tells how many client connections were accepted and how many
// refused at MaxClients, since the start.
func (s *Server) ConnStats() (accepted, rejected int64) {
	return s.nextID.Load(), s.rejected.Load()
}

// RefusalStats tells how many connections were closed for not
// authenticating within AuthTimeout, and how many clients' TLS handshakes
// failed, since the start.
func (s *Server) RefusalStats() (authTimeouts, tlsFailures int64) {
	return s.authTimeouts.Load(), s.tlsFailures.Load()
}

// LoopStats tells how many connections the event loop serves now, how
// many times one was handed to a goroutine of its own, and how many times
// one came back, since the start.
func (s *Server) LoopStats() (clients, handoffs, returns int64) {
	return s.loopClients.Load(), s.loopHandoffs.Load(), s.loopReturns.Load()
}

func (s *Server) init() {
	s.once.Do(func() {
		s.baseCtx, s.cancel = context.WithCancel(context.Background())
		s.sessions = make(map[*Session]struct{})
		if s.Logger == nil {
			s.Logger = zap.NewNop()
		}
	})
}

// ErrServerClosed is returned by Serve after Shutdown.
var ErrServerClosed = errors.New("resp: server closed")

// Serve accepts connections on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	s.init()
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.ln = ln
	if s.EventLoop && s.loop == nil {
		if lh, ok := s.Handler.(LoopHandler); ok {
			l, err := startLoop(s, lh)
			if err != nil {
				s.Logger.Warn("no event loop; every connection gets a goroutine", zap.Error(err))
			}
			s.loop = l
		}
	}
	s.mu.Unlock()
	if s.AuthRequired && s.AuthTimeout > 0 {
		go s.closeUnauthenticated()
	}
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded) || isTemporary(err) {
				// Out of file descriptors and the like: wait and go on.
				backoff = min(max(backoff*2, 5*time.Millisecond), time.Second)
				s.Logger.Warn("accept failed; retrying", zap.Error(err), zap.Duration("backoff", backoff))
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		s.accept(c)
	}
}

func isTemporary(err error) bool {
	return strings.Contains(err.Error(), "too many open files")
}

func (s *Server) accept(c net.Conn) {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		c.Close()
		return
	}
	if s.MaxClients > 0 && len(s.sessions) >= s.MaxClients {
		s.mu.Unlock()
		s.rejected.Add(1)
		if s.TLSConfig != nil {
			c = tls.Server(c, s.TLSConfig)
		}
		// Not on the accept loop: over TLS the write first runs the
		// handshake, which a silent peer would hold up.
		go func() {
			_ = c.SetDeadline(time.Now().Add(time.Second))
			_, _ = c.Write([]byte("-ERR max number of clients reached\r\n"))
			c.Close()
		}()
		return
	}
	var ts *tlsSock
	if s.TLSConfig != nil {
		if tc, ok := c.(*net.TCPConn); ok {
			ts = newTLSSock(tc)
		}
		if ts != nil {
			c = tls.Server(ts, s.TLSConfig)
		} else {
			c = tls.Server(c, s.TLSConfig)
		}
	}
	sess := newSession(s.baseCtx, s.nextID.Add(1), c)
	sess.rd.preAuth = s.AuthRequired
	sess.srv, sess.outLimit, sess.outLimitPubSub = s, s.MaxOutput, s.MaxOutputPubSub
	if ts != nil {
		sess.tsock, ts.sess = ts, sess
	}
	s.sessions[sess] = struct{}{}
	s.wg.Add(1)
	loop := s.loop
	s.mu.Unlock()
	if tc, ok := c.(*net.TCPConn); ok && loop != nil {
		if err := loop.add(sess, tc); err == nil {
			return
		}
	}
	go s.serveConn(sess, nil, nil)
}

// closeUnauthenticated closes, until the server shuts down, the
// connections that have not authenticated within AuthTimeout.
func (s *Server) closeUnauthenticated() {
	every := min(max(s.AuthTimeout/4, 10*time.Millisecond), time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	var late []*Session
	for {
		select {
		case <-s.baseCtx.Done():
			return
		case <-t.C:
		}
		cutoff := time.Now().Add(-s.AuthTimeout).UnixNano()
		late = late[:0]
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			return
		}
		for sess := range s.sessions {
			if !sess.authed.Load() && sess.unauthed.Load() < cutoff {
				late = append(late, sess)
			}
		}
		s.mu.Unlock()
		for _, sess := range late {
			s.authTimeouts.Add(1)
			s.Logger.Debug("closing a connection that did not authenticate in time", zap.String("remote", sess.remoteAddr))
			sess.Close()
		}
	}
}

// forget drops a session that has ended from the server's set.
func (s *Server) forget(sess *Session) {
	s.mu.Lock()
	delete(s.sessions, sess)
	s.mu.Unlock()
}

// Clients is the number of open connections.
func (s *Server) Clients() int {
	s.init()
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

// Sessions returns the open sessions, for CLIENT LIST and INFO.
func (s *Server) Sessions() []*Session {
	s.init()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Session, 0, len(s.sessions))
	for sess := range s.sessions {
		out = append(out, sess)
	}
	return out
}

// serveConn serves a connection on its own goroutine: first cmds and err,
// a batch the event loop read but could not run, if any.
func (s *Server) serveConn(sess *Session, cmds [][][]byte, err error) {
	returned := false // to the event loop, which owns the session now
	defer func() {
		if returned {
			return
		}
		// Replies another goroutine still writes (BeginAsync), and the
		// output the client has not read yet, go out before the
		// connection closes (a client that half-closed after its last
		// command gets its replies), bounded by the write timeout.
		sess.WaitAsync()
		sess.waitOutput()
		sess.cancel()
		_ = sess.closeConn()
		s.forget(sess)
		s.Handler.Closed(sess)
		s.wg.Done()
	}()

	if tc, ok := sess.conn.(*tls.Conn); ok && !tc.ConnectionState().HandshakeComplete {
		// A peer that never finishes the handshake must not hold its
		// connection slot for good.
		ctx, cancel := context.WithTimeout(sess.ctx, tlsHandshakeTimeout)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			// A peer that closes before saying anything (a TCP health
			// check, a port scan, the watchdog's self-check) is no
			// failed handshake.
			if !errors.Is(err, io.EOF) {
				s.tlsFailures.Add(1)
			}
			s.Logger.Debug("tls handshake failed", zap.String("remote", sess.remoteAddr), zap.Error(err))
			// Closed now: the handshake's output still queued for a
			// peer that does not read is dropped, not waited for.
			sess.Close()
			return
		}
	}

	// One goroutine reads and runs the connection's commands: no hand-off
	// per batch on the hot path. A command that blocks asks the session to
	// watch for the peer going away meanwhile (Session.WatchClose).
	bh, _ := s.Handler.(BatchHandler)
	s.mu.Lock()
	loop := s.loop
	s.mu.Unlock()
	var lh LoopHandler
	if loop != nil {
		lh, _ = s.Handler.(LoopHandler)
	}
	streak := 0         // batches in a row the loop could have served
	var rest [][][]byte // commands of a batch cut short by maxBatchReply
	for first := true; ; first = false {
		if rest != nil {
			cmds, rest = rest, nil
		} else if !first || (len(cmds) == 0 && err == nil) {
			if lh != nil && streak >= loopReturnAfter && sess.rd.Buffered() == 0 && lh.LoopReady(sess) {
				if s.returnToLoop(loop, sess) {
					returned = true
					return
				}
				streak = 0
			}
			cmds, err = sess.rd.ReadBatch()
		}
		if lh != nil && len(cmds) > 0 {
			if err == nil && lh.LoopSafe(sess, cmds) {
				streak++
			} else {
				streak = 0
			}
		}
		// Commands that arrived before a protocol error are served first,
		// as Redis does.
		if len(cmds) > 0 {
			// Once per batch, not per command: the clock costs on the
			// pipelined hot path, and a command that blocks moves it
			// again when it is done (WatchClose).
			sess.lastActive.Store(time.Now().UnixNano())
			sess.serving.Store(true)
		}
		for i := 0; i < len(cmds); i++ {
			args := cmds[i]
			if sess.rd.preAuth {
				// A RESET earlier in the batch signed the client out:
				// the commands after it, read while it was signed in,
				// are held to the pre-auth caps now, as Redis holds
				// them (the reader holds those it reads from now on).
				if perr := preAuthCapped(args); perr != nil {
					cmds, err = cmds[:i], perr
					break
				}
			}
			s.Handler.ServeRESP(sess, args)
			if sess.closeAfter {
				break
			}
			if sess.W.Len() >= maxBatchReply && i+1 < len(cmds) {
				// The replies go out before the rest of the batch runs, as
				// a batch of its own: a pipeline of small commands with
				// large replies (INFO, COMMAND DOCS) must not build them
				// all in memory first.
				rest = cmds[i+1:]
				break
			}
		}
		if bh != nil && len(cmds) > 0 {
			bh.EndBatch(sess)
		}
		if err == nil && rest == nil && sess.rd.preAuth && !sess.closeAfter {
			// So is the command in progress, as far as it came.
			err = sess.rd.partCapped()
		}
		if rest != nil && !sess.closeAfter {
			if sess.endBatch() != nil || s.isClosing() {
				return
			}
			continue // err, if any, comes after the rest
		}
		if err != nil && !sess.closeAfter {
			if IsProtocolError(err) {
				sess.W.Error("ERR " + err.Error())
			}
			_ = sess.endBatch()
			return
		}
		if sess.endBatch() != nil || sess.closeAfter || s.isClosing() {
			return
		}
	}
}

// maxBatchReply is how many reply bytes a batch builds before they are
// written and the rest of the batch runs (see serveConn). The reader also
// caps a batch at maxBatchCommands.
const maxBatchReply = 1 << 20

func (s *Server) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// Shutdown stops accepting, lets every connection finish the commands it
// is running (until ctx is done, after which their contexts are canceled
// and they have shutdownGrace to answer), and closes the connections.
func (s *Server) Shutdown(ctx context.Context) error {
	s.init()
	if sh, ok := s.Handler.(ShutdownHandler); ok {
		sh.ShuttingDown()
	}
	s.mu.Lock()
	s.closing = true
	if s.ln != nil {
		s.ln.Close()
	}
	for sess := range s.sessions {
		// Wakes a connection waiting for input; one running a command
		// finishes it, then sees the server closing.
		_ = sess.netConn().SetReadDeadline(time.Now())
	}
	loop := s.loop
	if loop != nil {
		// The loop closes its connections once their replies are out.
		loop.stop()
	}
	s.mu.Unlock()

	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		if loop != nil {
			loop.wait()
		}
		close(done)
	}()
	select {
	case <-done:
		s.cancel()
		return nil
	case <-ctx.Done():
		// Out of time: cancel what runs. A canceled command (LOCK …
		// WAIT) answers with an error, which its client should get
		// rather than a bare EOF: the connections have a short grace
		// to write it, then every one left is closed, so that no read
		// or write can hold the drain up.
		s.cancel()
		grace := time.NewTimer(shutdownGrace)
		defer grace.Stop()
		select {
		case <-done:
			return ctx.Err()
		case <-grace.C:
		}
		s.mu.Lock()
		for sess := range s.sessions {
			_ = sess.closeConn()
		}
		s.mu.Unlock()
		<-done
		return ctx.Err()
	}
}
