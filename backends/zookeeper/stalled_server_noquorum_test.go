package zookeeper

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// stallProxy is a TCP proxy in front of one server that can stop reading
// what its clients send (a server stopped or hung, whose kernel still
// holds its connections: the client's writes fill the buffers on the way,
// then block), for good on every connection, open or new.
type stallProxy struct {
	ln      net.Listener
	stalled atomic.Bool
	release chan struct{}
}

func startStallProxy(t *testing.T, up string) *stallProxy {
	t.Helper()
	p := &stallProxy{release: make(chan struct{})}
	p.ln = startRelay(t, up, func(c, s net.Conn) {
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); p.pipe(c, s, true) }()
		go func() { defer wg.Done(); p.pipe(s, c, false) }()
		wg.Wait()
	})
	t.Cleanup(func() { close(p.release) }) // before the relay's cleanup waits
	return p
}

// pipe copies src to dst; the client's side (fromClient) stops being read
// once the proxy is stalled.
func (p *stallProxy) pipe(src, dst net.Conn, fromClient bool) {
	defer src.Close()
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		if fromClient && p.stalled.Load() {
			<-p.release
			return
		}
		n, err := src.Read(buf)
		if fromClient && p.stalled.Load() {
			<-p.release
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestStalledServerAnswersNoQuorum: while the server an instance is on is
// stalled (stopped, hung: its kernel keeps the connection and stops
// taking bytes once its buffers are full), what the ensemble could not
// decide answers -NOQUORUM, as a lost connection does. go-zookeeper hands
// the request whose write to the connection failed (the write timed out
// with the buffers full; or a broken pipe, a reset) the socket's own
// error rather than ErrConnectionClosed, which the backend passed on as
// a plain error: -ERR "zookeeper: create: write tcp …: i/o timeout", which
// clients take for a bug rather than an outage to wait out. Keys of tens
// of KiB (locks.max_key_bytes is 64 KiB; the key is in every path sent)
// fill the buffers within a few requests.
func TestStalledServerAnswersNoQuorum(t *testing.T) {
	t.Parallel() // waits on the connection's receive timeout, in a root of its own
	root := testRoot(t)
	p := startStallProxy(t, zkAddr)
	a := newBackend(t, []string{p.ln.Addr().String()}, root, 4*time.Second)
	big := strings.Repeat("k", 60<<10)
	mustLock(t, a, big+"warm", "W", time.Second, backends.Write)
	p.stalled.Store(true)

	const locks = 96
	errs := make(chan error, locks)
	for i := range locks {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			_, err := a.Lock(ctx, backends.LockRequest{Key: big + strconv.Itoa(i), Token: "T", TTL: 10 * time.Second})
			errs <- err
		}()
	}
	for range locks {
		err := <-errs
		switch {
		case err == nil:
			t.Errorf("LOCK granted through a stalled server")
		case errors.Is(err, quorum.ErrNoQuorum), errors.Is(err, context.DeadlineExceeded):
		default:
			t.Errorf("LOCK through a stalled server = %v; want NOQUORUM (connection lost)", err)
		}
	}
}
