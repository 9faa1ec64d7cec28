package nbio

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
)

// Reader reads a socket in Go's poller with raw read system calls: it
// waits for the socket like net.Conn.Read (deadlines included), and the
// read itself does not hand the thread's P to the scheduler. One
// goroutine reads at a time.
type Reader struct {
	rc            syscall.RawConn
	local, remote net.Addr              // for errors, as package net gives them
	fn            func(fd uintptr) bool // made once: a closure per read would allocate
	b             []byte
	n             int
	err           error
}

// NewReader reads from rc, the raw connection of the socket between local
// and remote.
func NewReader(rc syscall.RawConn, local, remote net.Addr) *Reader {
	r := &Reader{rc: rc, local: local, remote: remote}
	r.fn = func(fd uintptr) bool {
		for {
			n, err := Read(int(fd), r.b)
			switch err {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false // wait for the socket, then again
			}
			r.n, r.err = n, err
			return true
		}
	}
	return r
}

// Read reads what the socket has, waiting for something to arrive. The
// peer's orderly close is io.EOF.
func (r *Reader) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	r.b, r.n, r.err = b, 0, nil
	err := r.rc.Read(r.fn)
	n, rerr := r.n, r.err
	r.b = nil
	switch {
	case err != nil:
		return 0, err // closed, or a deadline passed: net's own errors
	case rerr != nil:
		return 0, opError("read", r.local, r.remote, rerr)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// Writer writes to a socket with raw write system calls, waiting in Go's
// poller while the socket is full. Write writes all of b or fails, as
// net.Conn.Write does. One goroutine writes at a time.
type Writer struct {
	rc            syscall.RawConn
	local, remote net.Addr
	fn            func(fd uintptr) bool
	b             []byte
	n             int
	err           error
}

// NewWriter writes to rc, the raw connection of the socket between local
// and remote.
func NewWriter(rc syscall.RawConn, local, remote net.Addr) *Writer {
	w := &Writer{rc: rc, local: local, remote: remote}
	w.fn = func(fd uintptr) bool {
		for len(w.b) > 0 {
			n, err := Write(int(fd), w.b)
			if n > 0 {
				w.n += n
				w.b = w.b[n:]
			}
			switch {
			case err == syscall.EINTR:
			case err == syscall.EAGAIN:
				return false
			case err != nil:
				w.err = err
				return true
			case n == 0:
				w.err = io.ErrUnexpectedEOF
				return true
			}
		}
		return true
	}
	return w
}

// Write writes all of b.
func (w *Writer) Write(b []byte) (int, error) {
	w.b, w.n, w.err = b, 0, nil
	err := w.rc.Write(w.fn)
	n, werr := w.n, w.err
	w.b = nil
	if err == nil && werr != nil {
		err = opError("write", w.local, w.remote, werr)
	}
	return n, err
}

// Conn is a TCP or Unix socket whose reads and writes are raw system
// calls (see Reader and Writer); everything else is the socket's own.
type Conn struct {
	net.Conn
	rc  syscall.RawConn
	rmu sync.Mutex // net.Conn allows concurrent calls; Reader and Writer do not
	r   *Reader
	wmu sync.Mutex
	w   *Writer
}

// Wrap returns nc with raw reads and writes when it is a socket, and nc
// itself otherwise (a TLS connection, a pipe, or any connection where Raw
// is false).
func Wrap(nc net.Conn) net.Conn {
	sc, ok := nc.(syscall.Conn)
	if !ok || !Raw {
		return nc
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nc
	}
	l, r := nc.LocalAddr(), nc.RemoteAddr()
	return &Conn{Conn: nc, rc: rc, r: NewReader(rc, l, r), w: NewWriter(rc, l, r)}
}

// Read reads from the socket.
func (c *Conn) Read(b []byte) (int, error) {
	c.rmu.Lock()
	n, err := c.r.Read(b)
	c.rmu.Unlock()
	return n, err
}

// Write writes all of b to the socket.
func (c *Conn) Write(b []byte) (int, error) {
	c.wmu.Lock()
	n, err := c.w.Write(b)
	c.wmu.Unlock()
	return n, err
}

// SyscallConn is the socket's raw connection, so that code that looks at
// the socket (a liveness peek) sees through the wrapper.
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.rc, nil }

// NetConn is the wrapped connection.
func (c *Conn) NetConn() net.Conn { return c.Conn }

// opError dresses a system call's error as package net does, with the
// connection's addresses.
func opError(op string, local, remote net.Addr, err error) error {
	e := &net.OpError{Op: op, Source: local, Addr: remote, Err: os.NewSyscallError(op, err)}
	if local != nil {
		e.Net = local.Network()
	}
	return e
}
