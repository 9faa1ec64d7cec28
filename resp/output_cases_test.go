package resp

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// quitEchoHandler is echoHandler with QUIT (CloseAfterReply, never on the
// loop), and the last session served kept for the test.
type quitEchoHandler struct {
	echoHandler
	sess   atomic.Pointer[Session]
	closed atomic.Int64
}

func (h *quitEchoHandler) ServeRESP(s *Session, args [][]byte) {
	h.sess.Store(s)
	if st, _ := s.Data.(*echoState); st != nil && len(st.async) > 0 && string(args[0]) != "AECHO" {
		// A reply written now comes after the async ones before it.
		s.W.Raw(st.async)
		st.async = st.async[:0]
	}
	if strings.EqualFold(string(args[0]), "QUIT") {
		s.W.Simple("OK")
		s.CloseAfterReply()
		return
	}
	h.echoHandler.ServeRESP(s, args)
}

func (h *quitEchoHandler) Closed(*Session) { h.closed.Add(1) }

func (h *quitEchoHandler) LoopSafe(s *Session, cmds [][][]byte) bool {
	for _, c := range cmds {
		if strings.EqualFold(string(c[0]), "QUIT") || string(c[0]) == "MOVE" {
			return false
		}
	}
	return h.echoHandler.LoopSafe(s, cmds)
}

func (h *quitEchoHandler) ServeLoop(s *Session, cmds [][][]byte) bool {
	return serveBatch(h, s, cmds)
}

func quitEchoServer(t *testing.T, loop bool, maxOutput int) (*Server, *quitEchoHandler, string) {
	t.Helper()
	h := &quitEchoHandler{}
	srv := &Server{Handler: h, EventLoop: loop, MaxOutput: maxOutput}
	addr := startServer(t, srv, 0)
	h.served.Store(0)
	h.closed.Store(0)
	return srv, h, addr
}

// TestOutputHalfCloseGetsAllReplies: a client that writes its pipeline,
// half-closes, then reads, gets every reply before the server closes.
func TestOutputHalfCloseGetsAllReplies(t *testing.T) {
	setWriteTimeout(t, 5*time.Second)
	const n, size = 500, 8 << 10
	forEachMode(t, func(t *testing.T, m outputMode) {
		_, c := quitEchoClient(t, m, 15*time.Second)
		mustWrite(t, c, pipeline(m.cmd, n, size))
		if err := c.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		rd := bufio.NewReader(c)
		readReplies(t, rd, n, size)
		wantEOF(t, rd, "the replies")
	})
}

// TestQuitAfterPendingOutput: QUIT's +OK and the close come after
// the output pending before it.
func TestQuitAfterPendingOutput(t *testing.T) {
	setWriteTimeout(t, 5*time.Second)
	const n, size = 500, 8 << 10
	forEachMode(t, func(t *testing.T, m outputMode) {
		_, c := quitEchoClient(t, m, 15*time.Second)
		mustWrite(t, c, append(pipeline(m.cmd, n, size), "QUIT\r\n"...))
		time.Sleep(200 * time.Millisecond)
		rd := bufio.NewReader(c)
		readReplies(t, rd, n, size)
		if line, err := rd.ReadString('\n'); line != "+OK\r\n" || err != nil {
			t.Fatalf("QUIT: %q, %v", line, err)
		}
		wantEOF(t, rd, "QUIT")
	})
}

// TestOutputResetEndsPromptly: a client that resets its connection while
// output waits for it has its session's context canceled at once, not at
// the write timeout, and the connection's goroutines end.
func TestOutputResetEndsPromptly(t *testing.T) {
	setWriteTimeout(t, 20*time.Second)
	const n, size = 500, 8 << 10
	forEachMode(t, func(t *testing.T, m outputMode) {
		srv, h, addr := quitEchoServer(t, m.loop, 0)
		base := runtime.NumGoroutine()
		c := dialSmall(t, addr, 0)
		mustWrite(t, c, pipeline(m.cmd, n, size))
		waitServed(h, n)
		s := h.sess.Load()
		_ = c.(*net.TCPConn).SetLinger(0)
		c.Close() // RST
		select {
		case <-s.Context().Done():
		case <-time.After(3 * time.Second):
			t.Fatalf("session context not canceled 3s after the client reset")
		}
		if !waitUntil(time.Now().Add(3*time.Second), 10*time.Millisecond, func() bool { return connsGone(srv, base) && h.closed.Load() != 0 }) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d clients, %d goroutines (%d before); closed %d\n%s", srv.Clients(), runtime.NumGoroutine(), base, h.closed.Load(), buf[:runtime.Stack(buf, true)])
		}
	})
}

// TestOutputTrimmed: once a burst is read, the connection keeps at
// most maxKeptOutput of output buffer.
func TestOutputTrimmed(t *testing.T) {
	setWriteTimeout(t, 5*time.Second)
	const n, size = 500, 8 << 10
	forEachMode(t, func(t *testing.T, m outputMode) {
		h, c := quitEchoClient(t, m, 15*time.Second)
		mustWrite(t, c, pipeline(m.cmd, n, size))
		waitServed(h, n)
		rd := bufio.NewReader(c)
		readReplies(t, rd, n, size)
		s := h.sess.Load()
		var flushing bool
		var kept int
		if !waitUntil(time.Now().Add(3*time.Second), 10*time.Millisecond, func() bool {
			s.writeMu.Lock()
			flushing, kept = s.obuf.flushing, cap(s.obuf.pend)
			s.writeMu.Unlock()
			return !flushing && kept <= maxKeptOutput
		}) {
			t.Fatalf("flushing %v, output buffer cap %d; want at most %d kept", flushing, kept, maxKeptOutput)
		}
	})
}

// TestOutputSlowSteadyReader: a client that reads slowly but steadily is
// not dropped for the write timeout, however long the whole takes.
func TestOutputSlowSteadyReader(t *testing.T) {
	setWriteTimeout(t, 400*time.Millisecond)
	const n, size = 200, 8 << 10 // 1.6 MB, read at ~800 KB/s
	forEachMode(t, func(t *testing.T, m outputMode) {
		_, c := quitEchoClient(t, m, 15*time.Second)
		mustWrite(t, c, pipeline(m.cmd, n, size))
		readRepliesEvery(t, c, n, size, 10*time.Millisecond)
	})
}

// numbered is n commands cmd whose arguments are their number, padded to
// size bytes (MIXED as pipeline).
func numbered(cmd string, n, size int) []byte {
	var b []byte
	for i := range n {
		arg := strconv.Itoa(i) + ":" + strings.Repeat("v", size-len(strconv.Itoa(i))-1)
		b = appendCommand(b, commandName(cmd, i, n), arg)
	}
	return b
}

// TestOutputPushesWithPendingOutput: push frames from another goroutine
// while output waits for the client all arrive, once each, in order,
// between replies, and the replies in order.
func TestOutputPushesWithPendingOutput(t *testing.T) {
	setWriteTimeout(t, 5*time.Second)
	const n, size = 1000, 4 << 10
	forEachMode(t, func(t *testing.T, m outputMode) {
		h, c := quitEchoClient(t, m, 20*time.Second)
		rd := bufio.NewReader(c)
		echo(t, c, rd, "hi")
		s := h.sess.Load()
		var pushed atomic.Int64
		stop := make(chan struct{})
		pdone := make(chan struct{})
		go func() {
			defer close(pdone)
			for i := 0; ; {
				select {
				case <-stop:
					return
				default:
				}
				num := strconv.Itoa(i)
				if s.Push([]byte(">2\r\n$4\r\npush\r\n$" + strconv.Itoa(len(num)) + "\r\n" + num + "\r\n")) {
					i++
					pushed.Store(int64(i))
				}
				time.Sleep(200 * time.Microsecond)
			}
		}()
		mustWrite(t, c, numbered(m.cmd, n, size))
		time.Sleep(200 * time.Millisecond)
		nextPush, nextReply := 0, 0
		readPush := func(line string) {
			t.Helper()
			var l [4]string
			for k := range l {
				var err error
				l[k], err = rd.ReadString('\n')
				if err != nil {
					t.Fatalf("push: %v", err)
				}
			}
			if got, want := strings.TrimSpace(l[3]), strconv.Itoa(nextPush); got != want {
				t.Fatalf("push %s after push %d; want %s (replies read %d)", got, nextPush-1, want, nextReply)
			}
			nextPush++
		}
		for nextReply < n {
			line, err := rd.ReadString('\n')
			if err != nil {
				t.Fatalf("after %d replies and %d pushes: %v", nextReply, nextPush, err)
			}
			if line == ">2\r\n" {
				readPush(line)
				continue
			}
			if line != "$"+strconv.Itoa(size)+"\r\n" {
				t.Fatalf("after %d replies and %d pushes: %q; want a reply or a push", nextReply, nextPush, line)
			}
			b := make([]byte, size+2)
			if _, err := io.ReadFull(rd, b); err != nil {
				t.Fatal(err)
			}
			if want := strconv.Itoa(nextReply) + ":"; !strings.HasPrefix(string(b), want) || strings.Contains(string(b), ">") {
				t.Fatalf("reply %d: %.40q", nextReply, b)
			}
			nextReply++
		}
		close(stop)
		<-pdone
		total := int(pushed.Load())
		for nextPush < total {
			line, err := rd.ReadString('\n')
			if err != nil || line != ">2\r\n" {
				t.Fatalf("push %d of %d: %q, %v", nextPush, total, line, err)
			}
			readPush(line)
		}
		if total < 10 {
			t.Errorf("only %d pushes taken", total)
		}
	})
}

// TestTLSPushWriteTimeout: over TLS a push frame, written from
// another goroutine, waits at most pushWriteTimeout for a client that does
// not read, not the replies' write timeout: with Server.TLSConfig it does
// not wait at all (tls_output.go, TestTLSPushNeverWaits); on a listener
// that does TLS itself (tls.NewListener), written blocking, it waits at
// most pushWriteTimeout.
func TestTLSPushWriteTimeout(t *testing.T) {
	setWriteTimeout(t, 15*time.Second)
	for _, own := range []bool{false, true} {
		name := "Server.TLSConfig"
		if own {
			name = "tls.NewListener"
		}
		t.Run(name, func(t *testing.T) {
			ln, server, cfg := tlsListener(t)
			h := &quitEchoHandler{}
			srv := &Server{Handler: h, TLSConfig: server}
			if own {
				ln, srv.TLSConfig = tls.NewListener(ln, server), nil
			}
			serveUntilEnd(t, srv, ln, 0)
			raw := dialSmall(t, ln.Addr().String(), 0)
			c := tls.Client(raw, cfg)
			_ = c.SetDeadline(time.Now().Add(30 * time.Second))
			echo(t, c, bufio.NewReader(c), "hi")
			s := h.sess.Load()
			if got := s.tsock != nil; got == own {
				t.Fatalf("the session has a tlsSock: %v; want %v", got, !own)
			}
			frame := append([]byte(">2\r\n$4\r\npush\r\n$33554432\r\n"), make([]byte, 32<<20)...)
			frame = append(frame, "\r\n"...)
			start := time.Now()
			s.Push(frame) // the client reads nothing
			if d := time.Since(start); d > pushWriteTimeout+2*time.Second {
				t.Errorf("the push write to a client that does not read took %v; want at most pushWriteTimeout (%v)", d, pushWriteTimeout)
			}
		})
	}
}

// TestCloseDuringHandOver: a connection closed (Session.Close: the
// output limit, a write error, CLIENT KILL) while the event loop hands its
// socket to Go's poller is closed all the same: the client sees the end,
// and the session ends.
func TestCloseDuringHandOver(t *testing.T) {
	srv, h, addr := quitEchoServer(t, true, 0)
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; i < 400 && time.Now().Before(deadline); i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		rd := bufio.NewReader(c)
		echo(t, c, rd, "x")
		s := h.sess.Load()
		spin := time.Duration(i%40) * 3 * time.Microsecond
		go func() {
			for t0 := time.Now(); time.Since(t0) < 20*time.Microsecond+spin; {
			}
			s.Close()
		}()
		if _, err := c.Write([]byte("MOVE\r\n")); err != nil {
			t.Fatal(err)
		}
		for {
			line, err := rd.ReadString('\n')
			if err == io.EOF || errors.Is(err, syscall.ECONNRESET) {
				break
			}
			if err != nil {
				t.Fatalf("trial %d: %v after Session.Close; want the connection closed", i, err)
			}
			if line != "-ERR unknown command\r\n" {
				t.Fatalf("trial %d: %q", i, line)
			}
		}
		c.Close()
		if !waitUntil(deadline.Add(2*time.Second), time.Millisecond, func() bool { return srv.Clients() == 0 }) {
			t.Fatalf("trial %d: %d clients left", i, srv.Clients())
		}
	}
}
