package commands

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/relay"
	"github.com/lockproxy/lockproxy/resp"
)

// maxWatch is resp's maxWatchBuffer: what the reader buffers of a
// client's pipeline while one of its commands blocks.
const maxWatch = 1 << 20

// gatedGrantBackend grants a LOCK once gate is closed (the lock's holder
// released it), unless the command's context ends first.
type gatedGrantBackend struct {
	fakeBackend
	gate     chan struct{}
	granted  atomic.Bool
	returned chan struct{}
}

func (b *gatedGrantBackend) Lock(ctx context.Context, req backends.LockRequest) (backends.Lease, error) {
	defer close(b.returned)
	select {
	case <-b.gate:
		b.granted.Store(true)
		return backends.Lease{Token: req.Token, Validity: req.TTL, Fence: 1}, nil
	case <-ctx.Done():
		return backends.Lease{}, backends.ErrNotAcquired
	}
}

// TestLockWaitClientGoneBehindBigPipeline: a client that pipelined more
// than the reader buffers while a command blocks (maxWatchBuffer) behind
// its LOCK … WAIT, and then went away, must not be granted the lock: its
// leaving has to end the wait (or the grant be given back), as it does for
// a client that pipelined less. Redis notices a blocked client's close
// however much it sent before. Before, the watch stopped at the buffer
// bound and nothing noticed the close: the lock was granted to nobody and
// held for its whole TTL.
func TestLockWaitClientGoneBehindBigPipeline(t *testing.T) {
	for _, loop := range []bool{false, true} {
		t.Run(fmt.Sprintf("event loop %v", loop), func(t *testing.T) {
			b := &gatedGrantBackend{gate: make(chan struct{}), returned: make(chan struct{})}
			lockWaitGoneBehindBigPipeline(t, b, dialServer(t, b, loop))
		})
	}
}

// dialServer serves a handler over b, on the event loop or not, and
// dials it.
func dialServer(t *testing.T, b backends.Backend, loop bool) net.Conn {
	t.Helper()
	h := NewHandler(Options{Limits: testLimits, Backend: b})
	return dialTest(t, serveOn(t, &resp.Server{Handler: h, EventLoop: loop}))
}

func lockWaitGoneBehindBigPipeline(t *testing.T, b *gatedGrantBackend, conn net.Conn) {
	req := relay.AppendCommand(nil, [][]byte{[]byte("LOCK"), []byte("k"), []byte("PX"), []byte("10000"), []byte("WAIT"), []byte("5000")})
	// Past the watch's bound, by less than the socket buffers hold, so
	// that the client's close reaches the server's kernel.
	req = relay.AppendCommand(req, [][]byte{[]byte("ECHO"), bytes.Repeat([]byte("x"), maxWatch+128<<10)})
	wrote := make(chan error, 1)
	go func() { _, err := conn.Write(req); wrote <- err }()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the pipeline was not taken in 5 s")
	}
	time.Sleep(200 * time.Millisecond) // the watch reaches its bound
	_ = conn.Close()
	time.Sleep(300 * time.Millisecond) // the close is noticed, if it is
	close(b.gate)                      // the lock is released: a waiter is granted it
	select {
	case <-b.returned:
	case <-time.After(5 * time.Second):
		t.Fatal("LOCK … WAIT did not return")
	}
	waitFor(t, func() bool {
		_, unlocks := b.counts()
		return !b.granted.Load() || unlocks > 0
	}, "the grant to the client that went away to be given back")
}

// TestLockWaitClientStaysBehindBigPipeline: the same pipeline from a
// client that stays gets the lock and then its ECHO: watching for the
// close past the buffer bound must not take a client that is there for
// gone.
func TestLockWaitClientStaysBehindBigPipeline(t *testing.T) {
	b := &gatedGrantBackend{gate: make(chan struct{}), returned: make(chan struct{})}
	conn := dialHandler(t, b)
	req := relay.AppendCommand(nil, [][]byte{[]byte("LOCK"), []byte("k"), []byte("PX"), []byte("10000"), []byte("WAIT"), []byte("5000")})
	echo := bytes.Repeat([]byte("x"), maxWatch+128<<10)
	req = relay.AppendCommand(req, [][]byte{[]byte("ECHO"), echo})
	go func() { _, _ = conn.Write(req) }()
	time.Sleep(500 * time.Millisecond)
	close(b.gate)
	frames := readFrames(t, conn, 2)
	if !b.granted.Load() || !bytes.HasPrefix(frames[0], []byte("*6\r\n$5\r\ntoken\r\n")) {
		t.Fatalf("LOCK … WAIT = %q (granted %v); want the lease", frames[0], b.granted.Load())
	}
	if want := "$" + strconv.Itoa(len(echo)) + "\r\n"; !bytes.HasPrefix(frames[1], []byte(want)) || len(frames[1]) != len(want)+len(echo)+2 {
		t.Fatalf("ECHO after it = %d bytes; want the %d-byte echo", len(frames[1]), len(echo))
	}
}
