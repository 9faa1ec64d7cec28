package resp

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/relay"
)

// blockHandler's BLOCK flushes, watches the connection (WatchClose) and
// waits until the session's context ends or wait passes, as LOCK … WAIT
// does; it reports on gone whether the context ended. ECHO echoes.
type blockHandler struct {
	gone chan bool
	wait time.Duration
}

func (h *blockHandler) ServeRESP(s *Session, args [][]byte) {
	switch string(args[0]) {
	case "BLOCK":
	case "ECHO":
		s.W.Bulk(args[1])
		return
	default:
		s.W.Simple("OK")
		return
	}
	_ = s.Flush()
	stop := s.WatchClose()
	select {
	case <-s.Context().Done():
		h.gone <- true
	case <-time.After(h.wait):
		h.gone <- false
	}
	stop()
	s.W.Simple("OK")
}

func (h *blockHandler) Closed(*Session) {}

// TestWatchCloseBehindBigPipeline: a client whose command blocks, that
// pipelines more behind it than the reader buffers meanwhile
// (maxWatchBuffer) and then goes away, is seen gone while the command
// still blocks, over TLS as over plain TCP: the blocked command (LOCK …
// WAIT) must not go on, and be granted, for a client that left; one that
// stays is not taken for gone, and gets its replies. Before, a TLS
// connection had no raw socket for peerGone to watch, and the close went
// unnoticed until the command ended by itself.
func TestWatchCloseBehindBigPipeline(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		for _, leaves := range []bool{true, false} {
			t.Run(fmt.Sprintf("TLS %v, client leaves %v", useTLS, leaves), func(t *testing.T) {
				h := &blockHandler{gone: make(chan bool, 1), wait: 5 * time.Second}
				if !leaves {
					h.wait = time.Second
				}
				srv := &Server{Handler: h}
				var ln net.Listener
				var clientCfg *tls.Config
				if useTLS {
					ln, srv.TLSConfig, clientCfg = tlsListener(t)
				} else {
					ln = listenLocal(t)
				}
				serveUntilEnd(t, srv, ln, time.Second)
				raw, err := net.DialTimeout("tcp", ln.Addr().String(), 3*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				defer raw.Close()
				c := raw
				if useTLS {
					tc := tls.Client(raw, clientCfg)
					_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
					if err := tc.Handshake(); err != nil {
						t.Fatal(err)
					}
					c = tc
				}
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				// Past the watch's bound, by less than the socket buffers
				// hold, so that the client's close reaches the server.
				arg := make([]byte, maxWatchBuffer+128<<10)
				req := relay.AppendCommand(nil, [][]byte{[]byte("BLOCK")})
				req = relay.AppendCommand(req, [][]byte{[]byte("ECHO"), arg})
				if _, err := c.Write(req); err != nil {
					t.Fatal(err)
				}
				time.Sleep(300 * time.Millisecond) // the watch reaches its bound
				if leaves {
					_ = c.Close()
				}
				select {
				case gone := <-h.gone:
					if gone != leaves {
						t.Fatalf("client gone: %v; want %v (the client's close behind a big pipeline went unnoticed, or one that stayed was taken for gone)", gone, leaves)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("the blocked command did not end")
				}
				if leaves {
					return
				}
				rd := bufio.NewReader(c)
				if line, err := rd.ReadString('\n'); line != "+OK\r\n" || err != nil {
					t.Fatalf("BLOCK answered %q, %v; want +OK", line, err)
				}
				want := fmt.Sprintf("$%d\r\n", len(arg))
				if line, err := rd.ReadString('\n'); line != want || err != nil {
					t.Fatalf("ECHO answered %q, %v; want %q", line, err, want)
				}
				if _, err := io.CopyN(io.Discard, rd, int64(len(arg)+2)); err != nil {
					t.Fatalf("reading the echo: %v", err)
				}
			})
		}
	}
}
