//go:build !linux

package resp

import "syscall"

// peerGone is the Linux one's stand-in: elsewhere a client that went away
// behind more pipelined input than the reader buffers is noticed only
// once its blocked command is done.
func peerGone(raw syscall.RawConn, stop <-chan struct{}) bool {
	<-stop
	return false
}
