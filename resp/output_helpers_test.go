package resp

import (
	"bufio"
	"context"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest/observer"
)

// listenLocal is a TCP listener on a free loopback port.
func listenLocal(tb testing.TB) net.Listener {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	return ln
}

// serveUntilEnd serves srv on ln until the test (or benchmark run) ends,
// then closes ln, shuts srv down with grace to finish (0: none, the
// connections are closed at once) and waits for Serve to return.
func serveUntilEnd(tb testing.TB, srv *Server, ln net.Listener, grace time.Duration) {
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	tb.Cleanup(func() {
		ln.Close()
		ctx, cancel := context.WithTimeout(context.Background(), grace)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	})
}

// startServer serves srv on a free loopback port until the test ends
// (serveUntilEnd), and returns its address once it has served one client
// and has no clients left: so that the server's own goroutines (the
// event loop's) run before the test counts goroutines.
func startServer(t *testing.T, srv *Server, grace time.Duration) string {
	t.Helper()
	ln := listenLocal(t)
	serveUntilEnd(t, srv, ln, grace)
	addr := ln.Addr().String()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	echo(t, c, bufio.NewReader(c), "x")
	c.Close()
	for srv.Clients() > 0 {
		time.Sleep(time.Millisecond)
	}
	return addr
}

// dialSmall dials addr with small socket buffers (smallBuffers) and, for
// a timeout other than 0, a deadline that far ahead. The connection is
// closed when the test ends.
func dialSmall(t *testing.T, addr string, timeout time.Duration) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	smallBuffers(t, c)
	if timeout != 0 {
		_ = c.SetDeadline(time.Now().Add(timeout))
	}
	return c
}

// mustWrite writes b to c, or fails the test.
func mustWrite(t *testing.T, c io.Writer, b []byte) {
	t.Helper()
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
}

// echo sends ECHO arg on c and reads its reply, to the end of the line,
// from rd.
func echo(t *testing.T, c io.Writer, rd *bufio.Reader, arg string) {
	t.Helper()
	mustWrite(t, c, []byte("ECHO "+arg+"\r\n"))
	if line, err := rd.ReadString(arg[len(arg)-1]); err != nil {
		t.Fatalf("ECHO %s: %q, %v", arg, line, err)
	}
	_, _ = rd.ReadString('\n')
}

// readReplies reads n bulk replies of size bytes of 'v'.
func readReplies(t *testing.T, r io.Reader, n, size int) {
	t.Helper()
	readRepliesEvery(t, r, n, size, 0)
}

// readRepliesEvery is readReplies waiting pause before each reply.
func readRepliesEvery(t *testing.T, r io.Reader, n, size int, pause time.Duration) {
	t.Helper()
	want := "$" + strconv.Itoa(size) + "\r\n" + strings.Repeat("v", size) + "\r\n"
	got := make([]byte, len(want))
	for i := range n {
		if pause > 0 {
			time.Sleep(pause)
		}
		if _, err := io.ReadFull(r, got); err != nil || string(got) != want {
			t.Fatalf("reply %d: %.20q, %v; want the %d bytes sent", i, got, err, size)
		}
	}
}

// waitUntil checks cond every interval until it holds, and reports
// whether it did by deadline.
func waitUntil(deadline time.Time, every time.Duration, cond func() bool) bool {
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(every)
	}
	return true
}

// connsGone is whether srv has no clients left and no more goroutines run
// than base, counted before the client connected.
func connsGone(srv *Server, base int) bool {
	return srv.Clients() == 0 && runtime.NumGoroutine() <= base
}

// waitServed waits until h has served n commands, then 100 ms more, for
// their replies to fill the sockets and the output buffer.
func waitServed(h *quitEchoHandler, n int64) {
	for h.served.Load() < n {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
}

// forEachMode runs f as a subtest for each of outputModes.
func forEachMode(t *testing.T, f func(t *testing.T, m outputMode)) {
	for _, m := range outputModes {
		t.Run(m.name, func(t *testing.T) { f(t, m) })
	}
}

// batchServer is a Handler's part that serveBatch runs a batch with.
type batchServer interface {
	LoopSafe(s *Session, cmds [][][]byte) bool
	ServeRESP(s *Session, args [][]byte)
	EndBatch(s *Session)
}

// serveBatch is ServeLoop for h: the batch's commands, if h.LoopSafe
// takes them, then h.EndBatch.
func serveBatch(h batchServer, s *Session, cmds [][][]byte) bool {
	if !h.LoopSafe(s, cmds) {
		return false
	}
	for _, args := range cmds {
		h.ServeRESP(s, args)
	}
	h.EndBatch(s)
	return true
}

// commandName is the name of command i of n sent for cmd: cmd, but for
// "MIXED" ECHO for the first half, then ECHO and AECHO in turn (see
// pipeline).
func commandName(cmd string, i, n int) string {
	if cmd != "MIXED" {
		return cmd
	}
	if i >= n/2 && i%2 == 1 {
		return "AECHO"
	}
	return "ECHO"
}

// appendCommand appends the command name arg to b, as a RESP array.
func appendCommand(b []byte, name, arg string) []byte {
	return append(b, "*2\r\n$"+strconv.Itoa(len(name))+"\r\n"+name+"\r\n$"+strconv.Itoa(len(arg))+"\r\n"+arg+"\r\n"...)
}

// quitEchoClient starts a quitEchoServer for m and dials it (dialSmall).
func quitEchoClient(t *testing.T, m outputMode, timeout time.Duration) (*quitEchoHandler, net.Conn) {
	t.Helper()
	_, h, addr := quitEchoServer(t, m.loop, 0)
	return h, dialSmall(t, addr, timeout)
}

// wantEOF fails the test unless rd is at the end of the connection,
// after what was read.
func wantEOF(t *testing.T, rd *bufio.Reader, after string) {
	t.Helper()
	if b, err := rd.ReadByte(); err != io.EOF {
		t.Fatalf("after %s: %q, %v; want EOF", after, b, err)
	}
}

// limitCase is one case of TestOutputLimits and TestTLSOutputLimits: n
// commands of size-byte replies, written and not read.
type limitCase struct {
	name      string
	maxOutput int
	timeout   time.Duration
	n         int  // commands sent, not read
	limitLog  bool // closed for the limit, and logged
}

// checkLimitClose writes tc's commands on the connection dial makes and
// checks that srv closes it as tc says: at the limit, counted and logged
// once with the size it would have grown to, or after the write timeout,
// having read every command, without a log line; either way with the
// connection's goroutines gone. served counts the commands the handler
// served.
func checkLimitClose(t *testing.T, srv *Server, served *atomic.Int64, logs *observer.ObservedLogs, tc limitCase, cmd string, dial func(timeout time.Duration) net.Conn) {
	t.Helper()
	const size = 8 << 10
	base := runtime.NumGoroutine()
	// Generous bounds for a loaded host: the close is due at the limit,
	// or at the write timeout after the client's last read.
	c := dial(tc.timeout + 10*time.Second)
	start := time.Now()
	if _, err := c.Write(pipeline(cmd, tc.n, size)); err != nil && !tc.limitLog {
		t.Fatalf("writing %d commands (served %d): %v; want the server to read on", tc.n, served.Load(), err)
	}
	// The server closes the connection, the client reading nothing.
	if !waitUntil(start.Add(tc.timeout+10*time.Second), 5*time.Millisecond, func() bool { return srv.Clients() == 0 }) {
		t.Fatalf("connection still open after %v (served %d of %d); want it closed", time.Since(start), served.Load(), tc.n)
	}
	if tc.limitLog {
		if d := time.Since(start); d > tc.timeout/2 {
			t.Errorf("closed after %v; want it closed at the limit, not the timeout", d)
		}
		if got := srv.OutputLimitCloses(); got != 1 {
			t.Errorf("OutputLimitCloses = %d; want 1", got)
		}
		// The close is counted, and the client gone, before the line is
		// logged: wait for it.
		waitUntil(time.Now().Add(5*time.Second), 5*time.Millisecond, func() bool {
			return logs.FilterMessageSnippet("output buffer limit").Len() > 0
		})
		if got := logs.FilterMessageSnippet("output buffer limit").Len(); got != 1 {
			t.Errorf("%d log lines on the output limit; want 1 (logs: %v)", got, logs.All())
		}
		for _, e := range logs.FilterMessageSnippet("output buffer limit").All() {
			if got := e.ContextMap()["output_bytes"]; got.(int64) <= int64(tc.maxOutput) {
				t.Errorf("logged output_bytes %v; want past the limit, %d", got, tc.maxOutput)
			}
		}
	} else {
		if d := time.Since(start); d < tc.timeout {
			t.Errorf("closed after %v; want the client given the write timeout, %v", d, tc.timeout)
		}
		if got := served.Load(); got != int64(tc.n) {
			t.Errorf("served %d of %d commands before closing; want the server to have read them all", got, tc.n)
		}
		if got := logs.Len(); got != 0 {
			t.Errorf("log lines %v; want none", logs.All())
		}
	}
	if !waitUntil(time.Now().Add(5*time.Second), 10*time.Millisecond, func() bool { return connsGone(srv, base) }) {
		t.Fatalf("%d clients and %d goroutines (%d before the client) after the close; want the connection's goroutines gone", srv.Clients(), runtime.NumGoroutine(), base)
	}
}
