//go:build !unix

package redis

import "net"

// alive cannot peek without the unix socket calls: a dead connection is
// found by the batch that uses it.
func alive(net.Conn) error { return nil }

// lateReads is nc: without the unix socket calls a read cannot look past
// its deadline (see the unix lateConn).
func lateReads(nc net.Conn, _ *lateness) net.Conn { return nc }
