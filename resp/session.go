package resp

import (
	"context"
	"net"
	"sync/atomic"
	"time"
)

// Session is one client connection. It carries the connection's context:
// redcon has none, so this is where commands find the context they derive
// timeouts from, and it is canceled as soon as the client goes away.
type Session struct {
	// W buffers the replies; the server flushes it after each batch of
	// pipelined commands.
	W *Writer
	// Data is per-connection state owned by the command layer.
	Data any

	id         int64
	conn       net.Conn
	ctx        context.Context
	cancel     context.CancelFunc
	created    time.Time
	lastActive atomic.Int64
	closeAfter bool
	pushes     chan []byte
}

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
	}
	s.lastActive.Store(s.created.UnixNano())
	return s
}

// ID is the connection's unique number (CLIENT ID).
func (s *Session) ID() int64 { return s.id }

// Context is canceled when the connection closes or the server shuts down.
func (s *Session) Context() context.Context { return s.ctx }

// RemoteAddr is the client's address.
func (s *Session) RemoteAddr() string { return s.conn.RemoteAddr().String() }

// LocalAddr is the address the client connected to.
func (s *Session) LocalAddr() string { return s.conn.LocalAddr().String() }

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
	_ = s.conn.SetWriteDeadline(time.Now().Add(30 * time.Second))
	_, err := s.conn.Write(s.W.Bytes())
	s.W.Reset()
	if err != nil {
		s.cancel()
	}
	return err
}

// CloseAfterReply closes the connection once the current reply is written
// (QUIT).
func (s *Session) CloseAfterReply() { s.closeAfter = true }

// Push queues a pre-encoded frame (a RESP3 push) to be written between
// commands. It never blocks: when the client is not reading, the frame is
// dropped and Push reports false.
func (s *Session) Push(frame []byte) bool {
	select {
	case s.pushes <- frame:
		return true
	default:
		return false
	}
}
