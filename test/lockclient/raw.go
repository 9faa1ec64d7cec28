package lockclient

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"
)

// RawConn is a plain TCP connection speaking RESP by hand, for what
// go-redis hides: RESP3 pushes, pipelined or malformed bytes, a client
// that goes away mid-wait. Conn and BR are there for tests that set their
// own deadlines or read byte by byte.
type RawConn struct {
	Conn net.Conn
	BR   *bufio.Reader

	t     testing.TB
	reply time.Duration
}

// DialRaw connects to addr within cf.DialTimeout; the connection is closed
// at cleanup, and Read and Do wait up to cf.ReplyTimeout for a reply.
func (cf Config) DialRaw(t testing.TB, addr string) *RawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, cf.DialTimeout)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &RawConn{Conn: c, BR: bufio.NewReader(c), t: t, reply: cf.ReplyTimeout}
}

// Write sends raw bytes, failing the test on an error.
func (rc *RawConn) Write(p string) {
	rc.t.Helper()
	_ = rc.Conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(rc.Conn, p); err != nil {
		rc.t.Fatalf("write %q: %v", p, err)
	}
}

// Send sends args as one command.
func (rc *RawConn) Send(args ...string) {
	rc.t.Helper()
	rc.Write(Encode(args...))
}

// Read reads one reply, waiting up to the Config's Reply.
func (rc *RawConn) Read() (Reply, error) {
	return rc.ReadWithin(rc.reply)
}

// ReadWithin reads one reply, waiting up to d.
func (rc *RawConn) ReadWithin(d time.Duration) (Reply, error) {
	_ = rc.Conn.SetReadDeadline(time.Now().Add(d))
	return ReadReply(rc.BR)
}

// Do sends args and reads the reply, failing the test on I/O errors (an
// error reply is returned, not a failure).
func (rc *RawConn) Do(args ...string) Reply {
	rc.t.Helper()
	rc.Send(args...)
	r, err := rc.Read()
	if err != nil {
		rc.t.Fatalf("%q: reading the reply: %v", args, err)
	}
	return r
}
