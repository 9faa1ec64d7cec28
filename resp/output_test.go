package resp

import (
	"bufio"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// echoHandler answers ECHO x with x, from memory, and AECHO x with x
// written by another goroutine after the batch (BeginAsync, as the relay
// does); a batch of one kind runs on the event loop. served counts the
// commands run.
type echoHandler struct{ served atomic.Int64 }

type echoState struct{ async []byte }

func (h *echoHandler) ServeRESP(s *Session, args [][]byte) {
	h.served.Add(1)
	switch string(args[0]) {
	case "ECHO":
		s.W.Bulk(args[1])
	case "AECHO":
		st, _ := s.Data.(*echoState)
		if st == nil {
			st = &echoState{}
			s.Data = st
		}
		w := Writer{b: st.async, proto: 2}
		w.Bulk(args[1])
		st.async = w.b
	default:
		s.W.Error("ERR unknown command")
	}
}

func (h *echoHandler) EndBatch(s *Session) {
	st, _ := s.Data.(*echoState)
	if st == nil || len(st.async) == 0 {
		return
	}
	b := st.async
	st.async = nil
	write, ok := s.BeginAsync()
	if !ok {
		s.W.Raw(b)
		return
	}
	go write(b)
}

func (h *echoHandler) Closed(*Session)         {}
func (h *echoHandler) LoopReady(*Session) bool { return true }

func (h *echoHandler) LoopSafe(s *Session, cmds [][][]byte) bool {
	for _, c := range cmds {
		if string(c[0]) != string(cmds[0][0]) {
			return false
		}
	}
	return true
}

func (h *echoHandler) ServeLoop(s *Session, cmds [][][]byte) bool {
	return serveBatch(h, s, cmds)
}

// outputServer serves an echoHandler, on the event loop or not, with
// output bounded by maxOutput, and logs to the returned observer.
func outputServer(t *testing.T, loop bool, maxOutput int) (*Server, *echoHandler, string, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.WarnLevel)
	h := &echoHandler{}
	srv := &Server{Handler: h, EventLoop: loop, MaxOutput: maxOutput, Logger: zap.New(core)}
	addr := startServer(t, srv, 5*time.Second)
	h.served.Store(0)
	return srv, h, addr, logs
}

// setWriteTimeout sets replyWriteTimeout for one test.
func setWriteTimeout(t *testing.T, d time.Duration) {
	old := replyWriteTimeout
	replyWriteTimeout = d
	t.Cleanup(func() { replyWriteTimeout = old })
}

// pipeline is n commands cmd <size bytes>, in one buffer. cmd "MIXED" is
// ECHO for the first half, then ECHO and AECHO in turn: batches the event
// loop serves, then ones it hands to a goroutine.
func pipeline(cmd string, n, size int) []byte {
	arg := strings.Repeat("v", size)
	var b []byte
	for i := range n {
		b = appendCommand(b, commandName(cmd, i, n), arg)
	}
	return b
}

// smallBuffers makes c's socket buffers small, so that a few MB fill
// both ends.
func smallBuffers(t *testing.T, c net.Conn) {
	tc := c.(*net.TCPConn)
	if err := tc.SetReadBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	if err := tc.SetWriteBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
}

// outputMode is a way to serve a pipeline: on the event loop or not,
// with the replies of cmd (see pipeline).
type outputMode struct {
	name string
	loop bool
	cmd  string
}

var outputModes = []outputMode{
	{"goroutine/reply", false, "ECHO"},
	{"goroutine/async reply", false, "AECHO"},
	{"loop/reply", true, "ECHO"},
	{"loop/async reply", true, "AECHO"},
	// Moved off the loop with output pending: it goes on on Go's poller.
	{"loop/moved to a goroutine", true, "MIXED"},
}

// TestOutputPipelineBeforeRead: a client that writes a whole pipeline
// before it reads any reply (go-redis's Pipeline), commands and replies
// both bigger than the sockets hold, gets every reply, in order, as from
// Redis, which reads on while the client does not read and keeps the
// replies. Before the output buffer, the server stopped reading while a
// reply waited for the client, which waited for the server to read the
// rest of its pipeline, until the write timeout closed the connection.
func TestOutputPipelineBeforeRead(t *testing.T) {
	setWriteTimeout(t, 3*time.Second)
	// 16 MB each way: more than a few MB stalled the event loop's
	// connections too.
	const n, size = 2000, 8 << 10
	forEachMode(t, func(t *testing.T, m outputMode) {
		srv, h, addr, _ := outputServer(t, m.loop, 0)
		c := dialSmall(t, addr, 10*time.Second)
		if _, err := c.Write(pipeline(m.cmd, n, size)); err != nil {
			t.Fatalf("writing %d %s of %d bytes (served %d): %v; want the server to read on", n, m.cmd, size, h.served.Load(), err)
		}
		readReplies(t, bufio.NewReader(c), n, size)
		if _, moved, _ := srv.LoopStats(); m.cmd == "MIXED" && moved != 1 {
			t.Errorf("moved off the loop %d times; want once", moved)
		}
	})
}

// TestOutputLimits: output is bounded. A client past MaxOutput is closed
// with a log line, as Redis closes one past client-output-buffer-limit; a
// client that reads nothing for the write timeout is closed too, after
// the server went on reading its commands meanwhile. Either way the
// connection's goroutines end with it.
func TestOutputLimits(t *testing.T) {
	for _, tc := range []limitCase{
		// 16 MB of replies, past a 1 MB limit (and what the sockets
		// hold), long before the timeout.
		{"past the limit", 1 << 20, 5 * time.Second, 2048, true},
		// 16 MB, no limit: closed at the timeout, all read (the
		// timeout leaves time to write 16 MB under the race detector).
		{"no reader", 0, 2 * time.Second, 2048, false},
	} {
		for _, m := range outputModes {
			t.Run(tc.name+"/"+m.name, func(t *testing.T) {
				setWriteTimeout(t, tc.timeout)
				srv, h, addr, logs := outputServer(t, m.loop, tc.maxOutput)
				checkLimitClose(t, srv, &h.served, logs, tc, m.cmd, func(d time.Duration) net.Conn { return dialSmall(t, addr, d) })
			})
		}
	}
}
