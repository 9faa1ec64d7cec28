//go:build linux

package nbio

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// tcpPair is a connected loopback TCP pair: the client side wrapped, the
// server side plain. Both are closed at the end of the test.
func tcpPair(t *testing.T) (*Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			c = nil
		}
		accepted <- c
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer := <-accepted
	if peer == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() {
		nc.Close()
		peer.Close()
	})
	c, ok := Wrap(nc).(*Conn)
	if !ok {
		t.Fatalf("Wrap(%T) did not wrap", nc)
	}
	return c, peer
}

func TestWrapLeavesNonSockets(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if got := Wrap(a); got != a {
		t.Fatalf("Wrap(pipe) = %T, want the pipe itself", got)
	}
}

func TestConnReadWaits(t *testing.T) {
	c, peer := tcpPair(t)
	go func() {
		time.Sleep(20 * time.Millisecond)
		peer.Write([]byte("+OK\r\n"))
	}()
	buf := make([]byte, 64)
	// The socket is empty at first: Read must wait in the poller, not
	// return EAGAIN or 0 bytes.
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "+OK\r\n" {
		t.Fatalf("read = %q, %v", buf[:n], err)
	}
	if n, err := c.Read(nil); n != 0 || err != nil {
		t.Fatalf("empty read = %d, %v", n, err)
	}
}

func TestConnReadDeadline(t *testing.T) {
	c, _ := tcpPair(t)
	if err := c.SetReadDeadline(time.Now().Add(30 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	_, err := c.Read(make([]byte, 8))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline = %v; want os.ErrDeadlineExceeded", err)
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("deadline error %v is not a net.Error timeout", err)
	}
}

func TestConnEOFAndReset(t *testing.T) {
	c, peer := tcpPair(t)
	peer.Close()
	if _, err := c.Read(make([]byte, 8)); err != io.EOF {
		t.Fatalf("read after the peer closed = %v; want io.EOF", err)
	}

	c2, peer2 := tcpPair(t)
	// A close with unread data, or with SO_LINGER 0, resets: the error is
	// package net's, with the connection's addresses and the errno.
	peer2.(*net.TCPConn).SetLinger(0)
	peer2.Close()
	_, err := c2.Read(make([]byte, 8))
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "read" || !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after a reset = %#v; want a *net.OpError wrapping ECONNRESET", err)
	}
	// With the addresses, as package net words it: the log and the
	// client's error reply say which connection failed.
	if op.Addr == nil || op.Source == nil || !strings.Contains(err.Error(), "read tcp 127.0.0.1:") {
		t.Fatalf("read error %q lacks the connection's addresses", err)
	}
}

func TestConnReadAfterClose(t *testing.T) {
	c, _ := tcpPair(t)
	c.Close()
	if _, err := c.Read(make([]byte, 8)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read after Close = %v; want net.ErrClosed", err)
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after Close = %v; want net.ErrClosed", err)
	}
}

func TestConnBigWrite(t *testing.T) {
	c, peer := tcpPair(t)
	// Far more than the socket buffers hold: Write must wait for the
	// reader (EAGAIN, then the poller) and still write all of it, in order.
	want := bytes.Repeat([]byte("0123456789abcdef"), 1<<18) // 4 MB
	got := make(chan []byte, 1)
	go func() {
		time.Sleep(20 * time.Millisecond) // let the buffers fill
		b, _ := io.ReadAll(io.LimitReader(peer, int64(len(want))))
		got <- b
	}()
	n, err := c.Write(want)
	if n != len(want) || err != nil {
		t.Fatalf("write = %d, %v; want %d, nil", n, err, len(want))
	}
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("peer read %d bytes, not what was written", len(b))
	}
}

func TestConnWriteDeadline(t *testing.T) {
	c, peer := tcpPair(t)
	// Nobody reads: the buffers fill, and the write ends at the deadline
	// with what it wrote so far. The deadline is set once the write has
	// written something (the peer's receive queue is not empty): set
	// before the write, it could pass before the write began on a loaded
	// machine, which then writes nothing.
	rc, err := peer.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	deadlineSet := make(chan error, 1)
	go func() {
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
			q, qerr := 0, error(nil)
			if err := rc.Control(func(fd uintptr) { q, qerr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); err != nil {
				qerr = err
			}
			if qerr != nil {
				deadlineSet <- qerr
				_ = c.SetWriteDeadline(time.Now())
				return
			}
			if q > 0 {
				deadlineSet <- c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
				return
			}
		}
		deadlineSet <- errors.New("nothing written in 10s")
		_ = c.SetWriteDeadline(time.Now())
	}()
	chunk := make([]byte, 64<<20)
	n, err := c.Write(chunk)
	if derr := <-deadlineSet; derr != nil {
		t.Fatalf("setting the deadline: %v", derr)
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) || n <= 0 || n >= len(chunk) {
		t.Fatalf("write past the deadline = %d, %v; want part, os.ErrDeadlineExceeded", n, err)
	}
}

func TestConnSyscallConn(t *testing.T) {
	c, _ := tcpPair(t)
	var sc syscall.Conn = c // code that peeks at the socket sees through
	rc, err := sc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	if err := rc.Control(func(s uintptr) { fd = int(s) }); err != nil || fd < 0 {
		t.Fatalf("control = %v, fd %d", err, fd)
	}
	if c.NetConn() == nil {
		t.Fatal("NetConn is nil")
	}
}
