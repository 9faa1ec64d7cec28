//go:build unix

package redis

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"syscall"
)

// alive tells whether an idle connection is still open, without reading
// from it: a peek that finds the peer's close (a node that restarted)
// lets the writer dial anew, and so learn of the restart, before it sends
// a batch into a dead socket. Data waiting on an idle connection is as bad:
// replies out of step.
func alive(nc net.Conn) error {
	if tc, ok := nc.(*tls.Conn); ok {
		// The socket under TLS: an idle connection has nothing to read
		// there either (the session tickets a TLS 1.3 server sends after
		// the handshake were read with the INFO reply on connect).
		nc = tc.NetConn()
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	var peekErr error
	// Control, not Read: no deadline applies (the last batch's has
	// likely passed), and the peek never waits.
	err = rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case n == 0 && err == nil:
			peekErr = io.EOF
		case n > 0:
			peekErr = errUnexpectedData
		case err == syscall.EAGAIN || err == syscall.EWOULDBLOCK:
		default:
			peekErr = err
		}
	})
	if err != nil {
		return err
	}
	return peekErr
}

var errUnexpectedData = errors.New("unexpected data on an idle connection")
