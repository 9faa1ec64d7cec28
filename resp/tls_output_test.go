package resp

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// The output tests of output_test.go and output_cases_test.go over TLS
// (Server.TLSConfig, tls_output.go), with crypto/tls clients. TLS
// connections are served on goroutines, never on the event loop.

// subHandler is quitEchoHandler with SUB, which marks the client
// subscribed (Session.SetPubSub), as SUBSCRIBE does in the command layer.
type subHandler struct{ quitEchoHandler }

func (h *subHandler) ServeRESP(s *Session, args [][]byte) {
	if string(args[0]) == "SUB" {
		h.sess.Store(s)
		s.SetPubSub(true)
		s.W.Simple("OK")
		return
	}
	h.quitEchoHandler.ServeRESP(s, args)
}

// tlsModes are the ways a TLS connection serves a pipeline: replies
// written by its goroutine, or handed to another (AECHO: BeginAsync, which
// a TLS connection refuses, so that they go to W after all).
var tlsModes = []outputMode{
	{"reply", false, "ECHO"},
	{"async reply", false, "AECHO"},
}

// tlsOutputServer serves a subHandler over TLS with the output bounds
// given until the test ends, and returns the client configuration and the
// observer of its warnings, once it served one client and has none left.
func tlsOutputServer(t *testing.T, maxOutput, maxPubSub int) (*Server, *subHandler, string, *tls.Config, *observer.ObservedLogs) {
	t.Helper()
	ln, server, client := tlsListener(t)
	core, logs := observer.New(zap.WarnLevel)
	h := &subHandler{}
	srv := &Server{Handler: h, TLSConfig: server, MaxOutput: maxOutput, MaxOutputPubSub: maxPubSub, Logger: zap.New(core)}
	serveUntilEnd(t, srv, ln, 0)
	addr := ln.Addr().String()
	c := dialTLSSmall(t, addr, client, 5*time.Second)
	echo(t, c, bufio.NewReader(c), "x")
	c.Close()
	for srv.Clients() > 0 {
		time.Sleep(time.Millisecond)
	}
	h.served.Store(0)
	h.closed.Store(0)
	return srv, h, addr, client, logs
}

// dialTLSSmall is dialSmall over TLS: the TCP connection has small socket
// buffers, so that a few MB fill both ends.
func dialTLSSmall(t *testing.T, addr string, cfg *tls.Config, timeout time.Duration) *tls.Conn {
	t.Helper()
	c := tls.Client(dialSmall(t, addr, 0), cfg)
	t.Cleanup(func() { c.Close() })
	if timeout != 0 {
		_ = c.SetDeadline(time.Now().Add(timeout))
	}
	if err := c.Handshake(); err != nil {
		t.Fatal(err)
	}
	return c
}

// tlsSession is the server's session of the client last served.
func tlsSession(t *testing.T, h *subHandler) *Session {
	t.Helper()
	s := h.sess.Load()
	if s == nil {
		t.Fatal("no session served")
	}
	if s.tsock == nil {
		t.Fatal("the TLS session has no tlsSock: its output is written blocking")
	}
	return s
}

// TestTLSOutputPipelineBeforeRead: TestOutputPipelineBeforeRead over TLS.
// A client that writes a whole pipeline (4,000 ECHOs of 8 KB, 32 MB each
// way, as test/e2e TestPipelineWrittenBeforeRead) before it reads any
// reply gets every reply, promptly. Before, the connection's goroutine
// waited in crypto/tls's write for the client to read, the client for the
// server to read the rest of its pipeline, until the write timeout (30 s;
// 10 s here, which leaves the race detector's slow TLS time to write the
// pipeline) closed the connection.
func TestTLSOutputPipelineBeforeRead(t *testing.T) {
	setWriteTimeout(t, 10*time.Second)
	const n, size = 4000, 8 << 10
	for _, m := range tlsModes {
		t.Run(m.name, func(t *testing.T) {
			_, h, addr, cfg, _ := tlsOutputServer(t, 0, 0)
			c := dialTLSSmall(t, addr, cfg, 20*time.Second)
			start := time.Now()
			if _, err := c.Write(pipeline(m.cmd, n, size)); err != nil {
				t.Fatalf("writing %d %s of %d bytes (served %d): %v after %v; want the server to read on", n, m.cmd, size, h.served.Load(), err, time.Since(start).Round(time.Millisecond))
			}
			readReplies(t, bufio.NewReader(c), n, size)
			tlsSession(t, h)
			t.Logf("%d replies in %v", n, time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestTLSOutputLimits: TestOutputLimits over TLS. A client past MaxOutput
// is closed at the limit, logged and counted; one that reads nothing is
// closed at the write timeout, after the server read all its commands;
// either way the connection's goroutines (the flush's too) end.
func TestTLSOutputLimits(t *testing.T) {
	for _, tc := range []limitCase{
		{"past the limit", 1 << 20, 5 * time.Second, 2048, true},
		// 3 s, not TestOutputLimits's 2: time to encrypt and write 16 MB
		// under the race detector on a loaded host.
		{"no reader", 0, 3 * time.Second, 2048, false},
	} {
		for _, m := range tlsModes {
			t.Run(tc.name+"/"+m.name, func(t *testing.T) {
				setWriteTimeout(t, tc.timeout)
				srv, h, addr, cfg, logs := tlsOutputServer(t, tc.maxOutput, 0)
				checkLimitClose(t, srv, &h.served, logs, tc, m.cmd, func(d time.Duration) net.Conn { return dialTLSSmall(t, addr, cfg, d) })
			})
		}
	}
}

// pushFrame is a RESP3 push of one message of size bytes.
func pushFrame(size int) []byte {
	return []byte(">3\r\n$7\r\nmessage\r\n$3\r\nbig\r\n$" + strconv.Itoa(size) + "\r\n" + strings.Repeat("m", size) + "\r\n")
}

// TestTLSPubSubOutputLimit: a subscriber over TLS that stops reading is
// closed once the messages waiting for it pass MaxOutputPubSub, long
// before MaxOutput or the write timeout, with the log line saying it was
// a subscriber, and counted. Before, each push frame waited up to
// pushWriteTimeout in crypto/tls's write, and the subscriber was closed
// at the first that timed out: not for its limit, and neither logged nor
// counted.
func TestTLSPubSubOutputLimit(t *testing.T) {
	setWriteTimeout(t, 20*time.Second)
	srv, h, addr, cfg, logs := tlsOutputServer(t, 64<<20, 1<<20)
	base := runtime.NumGoroutine()
	c := dialTLSSmall(t, addr, cfg, 20*time.Second)
	rd := bufio.NewReader(c)
	mustWrite(t, c, []byte("SUB\r\n"))
	if line, err := rd.ReadString('\n'); line != "+OK\r\n" || err != nil {
		t.Fatalf("SUB: %q, %v", line, err)
	}
	s := tlsSession(t, h)
	frame := pushFrame(8 << 10)
	start := time.Now()
	var slowest time.Duration
	// 16 MB of messages, not read: Push drops a frame when a few wait,
	// so it is tried again.
	for sent := 0; sent < 2048 && s.Context().Err() == nil && time.Since(start) < 10*time.Second; {
		t0 := time.Now()
		if s.Push(frame) {
			sent++
		} else {
			time.Sleep(100 * time.Microsecond)
		}
		slowest = max(slowest, time.Since(t0))
	}
	if !waitUntil(time.Now().Add(5*time.Second), 5*time.Millisecond, func() bool { return srv.Clients() == 0 }) {
		t.Fatalf("subscriber still connected %v after 16 MB of messages it did not read", time.Since(start))
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("closed after %v; want it closed at the pub/sub limit", d)
	}
	if slowest > time.Second {
		t.Errorf("a Push took %v; want it never to wait for the client", slowest)
	}
	if got := srv.OutputLimitCloses(); got != 1 {
		t.Errorf("OutputLimitCloses = %d; want 1", got)
	}
	// The close is counted, and the client gone, before the line is
	// logged: wait for it.
	var lines []observer.LoggedEntry
	waitUntil(time.Now().Add(5*time.Second), 5*time.Millisecond, func() bool {
		lines = logs.FilterMessageSnippet("output buffer limit").All()
		return len(lines) > 0
	})
	if len(lines) != 1 {
		t.Fatalf("%d log lines on the output limit; want 1 (logs: %v)", len(lines), logs.All())
	}
	if f := lines[0].ContextMap(); f["pubsub"] != true || f["limit"] != int64(1<<20) {
		t.Errorf("log line %v; want pubsub true, limit %d", f, 1<<20)
	}
	if !waitUntil(time.Now().Add(5*time.Second), 10*time.Millisecond, func() bool { return connsGone(srv, base) }) {
		t.Fatalf("%d clients and %d goroutines (%d before the client); want the connection's goroutines gone", srv.Clients(), runtime.NumGoroutine(), base)
	}
}

// TestTLSPushNeverWaits: a push frame bigger than the sockets hold, to a
// TLS client that is not reading, is queued at once (before, Push waited
// up to pushWriteTimeout and closed the client when it passed), and the
// client that reads later gets the frame whole, then the replies after
// it.
func TestTLSPushNeverWaits(t *testing.T) {
	setWriteTimeout(t, 10*time.Second)
	_, h, addr, cfg, _ := tlsOutputServer(t, 0, 0)
	c := dialTLSSmall(t, addr, cfg, 20*time.Second)
	rd := bufio.NewReader(c)
	echo(t, c, rd, "hi")
	s := tlsSession(t, h)
	const size = 16 << 20
	frame := pushFrame(size)
	start := time.Now()
	if !s.Push(frame) {
		t.Fatal("Push refused the frame")
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Push of %d bytes to a client that does not read took %v; want it queued at once", len(frame), d)
	}
	if !s.outputPending() {
		t.Errorf("no output pending after %d bytes pushed to a client that does not read", len(frame))
	}
	time.Sleep(600 * time.Millisecond)
	mustWrite(t, c, []byte("ECHO after\r\n"))
	for _, want := range []string{">3\r\n", "$7\r\n", "message\r\n", "$3\r\n", "big\r\n", "$" + strconv.Itoa(size) + "\r\n"} {
		if line, err := rd.ReadString('\n'); line != want || err != nil {
			t.Fatalf("push: %q, %v; want %q", line, err, want)
		}
	}
	payload := make([]byte, size+2)
	if _, err := io.ReadFull(rd, payload); err != nil {
		t.Fatal(err)
	}
	if string(payload[size:]) != "\r\n" || strings.Trim(string(payload[:size]), "m") != "" {
		t.Fatalf("the push's payload is not the %d bytes pushed", size)
	}
	if line, err := rd.ReadString('\n'); line != "$5\r\n" || err != nil {
		t.Fatalf("ECHO after the push: %q, %v", line, err)
	}
	if line, err := rd.ReadString('\n'); line != "after\r\n" || err != nil {
		t.Fatalf("ECHO after the push: %q, %v", line, err)
	}
}

// TestTLSQuitAfterPendingOutput: TestQuitAfterPendingOutput and
// TestOutputHalfCloseGetsAllReplies over TLS: the output pending is all
// written before QUIT's +OK, and before the connection closes (with
// close_notify: the client reads EOF), after QUIT or after the client
// stopped sending (CloseWrite, which sends close_notify).
func TestTLSQuitAfterPendingOutput(t *testing.T) {
	setWriteTimeout(t, 10*time.Second)
	const n, size = 2000, 8 << 10
	for _, quit := range []bool{true, false} {
		for _, m := range tlsModes {
			name := "half-close/" + m.name
			if quit {
				name = "QUIT/" + m.name
			}
			t.Run(name, func(t *testing.T) {
				_, _, addr, cfg, _ := tlsOutputServer(t, 0, 0)
				c := dialTLSSmall(t, addr, cfg, 20*time.Second)
				b := pipeline(m.cmd, n, size)
				if quit {
					b = append(b, "QUIT\r\n"...)
				}
				mustWrite(t, c, b)
				if !quit {
					if err := c.CloseWrite(); err != nil {
						t.Fatal(err)
					}
				}
				time.Sleep(200 * time.Millisecond)
				rd := bufio.NewReader(c)
				readReplies(t, rd, n, size)
				if quit {
					if line, err := rd.ReadString('\n'); line != "+OK\r\n" || err != nil {
						t.Fatalf("QUIT: %q, %v", line, err)
					}
				}
				wantEOF(t, rd, "the replies")
			})
		}
	}
}

// TestTLSCloseDuringPendingOutput: a TLS connection closed while output
// waits for the client (Session.Close: CLIENT KILL, the relay losing the
// client's upstream state; or the client resetting the connection) ends
// at once, not at the write timeout: the flush goroutine, the
// connection's goroutine and its context all end.
func TestTLSCloseDuringPendingOutput(t *testing.T) {
	setWriteTimeout(t, 20*time.Second)
	const n, size = 2000, 8 << 10
	for _, how := range []string{"Session.Close", "client reset"} {
		t.Run(how, func(t *testing.T) {
			srv, h, addr, cfg, _ := tlsOutputServer(t, 0, 0)
			base := runtime.NumGoroutine()
			raw := dialSmall(t, addr, 0)
			c := tls.Client(raw, cfg)
			mustWrite(t, c, pipeline("ECHO", n, size))
			waitServed(&h.quitEchoHandler, n)
			s := tlsSession(t, h)
			if !s.outputPending() {
				t.Fatalf("no output pending after %d replies of %d bytes not read", n, size)
			}
			s.tsock.mu.Lock()
			done := s.tsock.obuf.flushed
			s.tsock.mu.Unlock()
			start := time.Now()
			if how == "client reset" {
				_ = raw.(*net.TCPConn).SetLinger(0)
				raw.Close()
			} else {
				s.Close()
			}
			select {
			case <-done:
			case <-time.After(3 * time.Second):
				t.Fatalf("the flush goroutine still runs 3s after %s", how)
			}
			select {
			case <-s.Context().Done():
			case <-time.After(3 * time.Second):
				t.Fatalf("session context not canceled 3s after %s", how)
			}
			if !waitUntil(time.Now().Add(3*time.Second), 10*time.Millisecond, func() bool { return connsGone(srv, base) && h.closed.Load() != 0 }) {
				buf := make([]byte, 1<<20)
				t.Fatalf("%d clients, %d goroutines (%d before); closed %d\n%s", srv.Clients(), runtime.NumGoroutine(), base, h.closed.Load(), buf[:runtime.Stack(buf, true)])
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("the connection ended %v after %s; want it at once", d, how)
			}
			if how == "Session.Close" {
				// The client sees the end after what was written.
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, err := io.Copy(io.Discard, c); err != nil && isTimeout(err) {
					t.Errorf("reading after Session.Close: %v; want the connection closed", err)
				}
			}
		})
	}
}

// TestTLSOutputTrimmed: TestOutputTrimmed over TLS: once a burst is read,
// the socket keeps at most maxKeptOutput of output buffer.
func TestTLSOutputTrimmed(t *testing.T) {
	setWriteTimeout(t, 5*time.Second)
	const n, size = 2000, 8 << 10
	_, h, addr, cfg, _ := tlsOutputServer(t, 0, 0)
	c := dialTLSSmall(t, addr, cfg, 15*time.Second)
	mustWrite(t, c, pipeline("ECHO", n, size))
	waitServed(&h.quitEchoHandler, n)
	s := tlsSession(t, h)
	if !s.outputPending() {
		t.Fatalf("no output pending after %d replies of %d bytes not read", n, size)
	}
	readReplies(t, bufio.NewReader(c), n, size)
	var flushing bool
	var kept int
	if !waitUntil(time.Now().Add(3*time.Second), 10*time.Millisecond, func() bool {
		s.tsock.mu.Lock()
		flushing, kept = s.tsock.obuf.flushing, cap(s.tsock.obuf.pend)
		s.tsock.mu.Unlock()
		return !flushing && kept <= maxKeptOutput
	}) {
		t.Fatalf("flushing %v, output buffer cap %d; want at most %d kept", flushing, kept, maxKeptOutput)
	}
}

// TestTLSOutputSlowSteadyReader: TestOutputSlowSteadyReader over TLS: a
// client that reads slowly but steadily is not dropped for the write
// timeout.
func TestTLSOutputSlowSteadyReader(t *testing.T) {
	setWriteTimeout(t, 400*time.Millisecond)
	const n, size = 200, 8 << 10
	_, _, addr, cfg, _ := tlsOutputServer(t, 0, 0)
	c := dialTLSSmall(t, addr, cfg, 15*time.Second)
	mustWrite(t, c, pipeline("ECHO", n, size))
	readRepliesEvery(t, c, n, size, 10*time.Millisecond)
}

// isTimeout is whether err is a net.Error that timed out.
func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
