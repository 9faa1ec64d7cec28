//go:build !linux

package resp

import (
	"errors"
	"net"
	"time"
)

// The event loop is Linux's (epoll); elsewhere every connection has a
// goroutine of its own.

type eventLoop struct{}

type fdConn struct{ net.Conn }

func (*fdConn) waitWritable(time.Time) bool { return true }

func startLoop(*Server, LoopHandler) (*eventLoop, error) {
	return nil, errors.New("no event loop on this system")
}

func (l *eventLoop) add(*Session, *net.TCPConn) error { return errors.New("no event loop") }
func (l *eventLoop) stop()                            {}
func (l *eventLoop) wait()                            {}
func (l *eventLoop) wake(*Session)                    {}

func (s *Server) returnToLoop(*eventLoop, *Session) bool { return false }

// Later is nil: no connection is served on an event loop.
func (s *Session) Later() func(func()) { return nil }
