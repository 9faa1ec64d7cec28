package resp

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// peerGonePoll is how long one poll for the peer's close waits (ms) before
// peerGone looks whether it should stop: what it may add to the reply of
// the blocked command, and to a Close of the connection meanwhile (Control
// holds the descriptor), for one system call per period.
const peerGonePoll = 10

// peerGone waits, without reading, until the peer of raw's socket closes
// or shuts down its writing half (reports true), or stop is closed or the
// socket is (false). The kernel tells a received FIN (POLLRDHUP) even
// with data unread before it, so this notices a client that went away
// behind more pipelined input than the reader buffers.
func peerGone(raw syscall.RawConn, stop <-chan struct{}) bool {
	if raw == nil {
		<-stop
		return false
	}
	for {
		select {
		case <-stop:
			return false
		default:
		}
		gone := false
		err := raw.Control(func(fd uintptr) {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
			n, err := unix.Poll(fds, peerGonePoll)
			gone = err == nil && n > 0 && fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
		})
		if err != nil {
			return false // the socket is closed: the connection is ending anyway
		}
		if gone {
			return true
		}
	}
}
