//go:build unix

package redis

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"time"
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

// lateConn is the socket of a node connection (under TLS, when there is
// one) whose read that fails at its deadline first looks, without
// waiting, whether the node's answer is there after all.
//
// The deadline is checked before the socket is read: once it has passed,
// Go reports the timeout even when the answers arrived in time and wait
// in the socket's buffer. That is what a stopped process finds when it
// runs again (SIGSTOP, a VM pause, a long stall): the node answered within
// the node timeout, every deadline passed during the stop, and without a
// look the batch was taken for a silent node's, its answers thrown away
// (a released lock answered NOQUORUM, a grant rolled back). The look takes
// what the node sent by now: answers that arrived after the deadline, by
// the time of the look, count as a slow node's answers do, which the
// quorum judges by when it hears them (the validity it tells is measured
// after the answers). Only what has to be waited for still fails.
type lateConn struct {
	net.Conn
	rc syscall.RawConn
	// late gets the span from a deadline to when a call past it did what
	// it had to; rd and wd are the deadlines set.
	late   *lateness
	rd, wd time.Time
	// rdSet and wdSet are when rd and wd were set.
	rdSet, wdSet time.Time
}

// lateFrom is where the span that a call made past its deadline adds to
// late begins, now: at the deadline; or, where it came well after the
// deadline (stoppedLate), at when the deadline was set. A call woken
// that late was held up by a stop of the process (SIGSTOP, a VM pause, a
// long stall) that may have begun any time after that: the node's
// answers, there by now, may have come right after the write, and an
// operation queued behind the batch whose deadline passed before this
// one's, during the stop, waited for lockproxy, not for the node (see
// writer.ours). Before, such an operation (queued behind a batch written
// just before the stop, its deadline a little earlier than the batch's)
// was given up, and its release or renewal answered as failed.
func lateFrom(deadline, set, now time.Time) time.Time {
	if now.Sub(deadline) > stoppedLate && !set.IsZero() && set.Before(deadline) {
		return set
	}
	return deadline
}

// lateReads is nc as a lateConn that adds to late the span from the
// deadline to a look that did what a call had to, or nc itself where its
// socket cannot be reached.
func lateReads(nc net.Conn, late *lateness) net.Conn {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nc
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nc
	}
	return &lateConn{Conn: nc, rc: rc, late: late}
}

// Read reads what the socket has, waiting until its deadline; past it,
// what the socket holds without waiting. What it read past the deadline
// adds the span from the deadline to now to late (see Node.exec).
func (c *lateConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 || len(b) == 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		if n > 0 && !c.rd.IsZero() {
			// Read past its deadline all the same: the process ran
			// again with the answer there, and the poller told of it
			// before the deadline's timer.
			if now := time.Now(); now.After(c.rd) {
				c.late.add(lateFrom(c.rd, c.rdSet, now), now)
			}
		}
		return n, err
	}
	var got int
	// Control, not Read: the deadline that passed does not apply, and
	// the read never waits.
	if cerr := c.rc.Control(func(fd uintptr) {
		for {
			k, _, rerr := syscall.Recvfrom(int(fd), b, syscall.MSG_DONTWAIT)
			if rerr == syscall.EINTR {
				continue
			}
			if rerr == nil && k > 0 {
				got = k
			}
			return
		}
	}); cerr == nil && got > 0 {
		now := time.Now()
		c.late.add(lateFrom(c.rd, c.rdSet, now), now)
		return got, nil
	}
	return n, err
}

// Write writes all of b, waiting until its deadline; past it, what the
// socket takes without waiting. A write is the first thing a batch does
// after it set its deadline: a stop in between would otherwise fail the
// batch, with nothing sent, for a deadline that passed while lockproxy
// could not run.
func (c *lateConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if n == len(b) {
		// Written all the same past its deadline: the process ran
		// again before the deadline's timer did (as a read, see Read).
		if !c.wd.IsZero() {
			if now := time.Now(); now.After(c.wd) {
				c.wroteLate(now)
			}
		}
		return n, err
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return n, err
	}
	if cerr := c.rc.Control(func(fd uintptr) {
		for n < len(b) {
			k, serr := syscall.SendmsgN(int(fd), b[n:], nil, nil, syscall.MSG_DONTWAIT)
			if serr == syscall.EINTR {
				continue
			}
			if serr != nil || k <= 0 {
				return
			}
			n += k
		}
	}); cerr == nil && n == len(b) {
		c.wroteLate(time.Now())
		return n, nil
	}
	return n, err
}

// wroteLate records a write done at now, past its deadline.
func (c *lateConn) wroteLate(now time.Time) {
	c.late.add(lateFrom(c.wd, c.wdSet, now), now)
	if c.late.rewait && !c.rd.IsZero() {
		// Written late: the answers are read within the time the
		// deadline gave them, from now, while the quorum listens. The
		// look a read makes past its deadline would come before the
		// node could answer.
		d := now.Add(c.rd.Sub(c.rdSet))
		if h := c.late.heard; !h.IsZero() && h.Before(d) {
			d = h
		}
		_ = c.SetReadDeadline(d)
	}
}

// SetDeadline sets the socket's deadlines, and remembers them.
func (c *lateConn) SetDeadline(t time.Time) error {
	now := time.Now()
	c.rd, c.wd, c.rdSet, c.wdSet = t, t, now, now
	return c.Conn.SetDeadline(t)
}

// SetReadDeadline sets the socket's read deadline, and remembers it.
func (c *lateConn) SetReadDeadline(t time.Time) error {
	c.rd, c.rdSet = t, time.Now()
	return c.Conn.SetReadDeadline(t)
}

// SetWriteDeadline sets the socket's write deadline, and remembers it.
func (c *lateConn) SetWriteDeadline(t time.Time) error {
	c.wd, c.wdSet = t, time.Now()
	return c.Conn.SetWriteDeadline(t)
}

// SyscallConn is the socket's raw connection (see alive).
func (c *lateConn) SyscallConn() (syscall.RawConn, error) { return c.rc, nil }
