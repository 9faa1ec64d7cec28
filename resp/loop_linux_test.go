//go:build linux

package resp

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockproxy/lockproxy/relay"
)

// loopHandler stands in for the command layer on the event loop:
//
//	ASYNC size delay_ms  a bulk reply of size bytes, written by another
//	                     goroutine delay_ms after the batch (as the relay's
//	                     upstream reader does); loop-safe
//	LOCAL x              x, from memory; loop-safe in a batch of its own kind
//	BLOCK delay_ms       "+blocked", after sleeping on the connection's
//	                     goroutine: not loop-safe
//
// Every reply starts with where it was served: "loop" or "goroutine".
type loopHandler struct {
	closed atomic.Int64
}

type loopState struct {
	replies []byte
	delay   time.Duration
}

func where(s *Session) string {
	if s.Later() != nil {
		return "loop"
	}
	return "goroutine"
}

func asyncReply(s *Session, size int) []byte {
	w := NewWriter()
	b := []byte(where(s))
	for len(b) < size {
		b = append(b, 'x')
	}
	w.Bulk(b)
	return w.Bytes()
}

func (h *loopHandler) LoopReady(*Session) bool { return true }

func (h *loopHandler) LoopSafe(s *Session, cmds [][][]byte) bool {
	async, local := 0, 0
	for _, c := range cmds {
		switch string(c[0]) {
		case "ASYNC":
			async++
		case "LOCAL":
			local++
		default:
			return false
		}
	}
	return async == 0 || local == 0
}

func (h *loopHandler) ServeLoop(s *Session, cmds [][][]byte) bool { return serveBatch(h, s, cmds) }

func (h *loopHandler) ServeRESP(s *Session, args [][]byte) {
	st, _ := s.Data.(*loopState)
	if st == nil {
		st = &loopState{}
		s.Data = st
	}
	switch string(args[0]) {
	case "ASYNC":
		size, _ := strconv.Atoi(string(args[1]))
		ms, _ := strconv.Atoi(string(args[2]))
		if s.Later() == nil {
			// On a goroutine: in order, from here.
			time.Sleep(time.Duration(ms) * time.Millisecond)
			s.W.Raw(asyncReply(s, size))
			return
		}
		st.replies = append(st.replies, asyncReply(s, size)...)
		st.delay = max(st.delay, time.Duration(ms)*time.Millisecond)
	case "LOCAL":
		s.W.Bulk([]byte(where(s) + ":" + string(args[1])))
	case "BLOCK":
		ms, _ := strconv.Atoi(string(args[1]))
		time.Sleep(time.Duration(ms) * time.Millisecond)
		s.W.Simple("blocked " + where(s))
	default:
		s.W.Error("ERR unknown command")
	}
}

func (h *loopHandler) EndBatch(s *Session) {
	st, _ := s.Data.(*loopState)
	if st == nil || len(st.replies) == 0 {
		return
	}
	b, delay := st.replies, st.delay
	st.replies, st.delay = nil, 0
	write, ok := s.BeginAsync()
	if !ok {
		s.W.Raw(b)
		return
	}
	go func() {
		time.Sleep(delay)
		write(b)
	}()
}

func (h *loopHandler) Closed(*Session) { h.closed.Add(1) }

// serveLoop serves a loopHandler on an event loop; done gets Serve's
// error.
func serveLoop(t *testing.T) (srv *Server, h *loopHandler, addr string, done chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h = &loopHandler{}
	srv = &Server{Handler: h, EventLoop: true}
	done = make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	return srv, h, ln.Addr().String(), done
}

// loopServer is serveLoop with a cleanup that shuts the server down and
// checks that every connection was closed once.
func loopServer(t *testing.T) (*Server, *loopHandler, string) {
	t.Helper()
	srv, h, addr, done := serveLoop(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-done; err != ErrServerClosed {
			t.Errorf("Serve = %v", err)
		}
		if n := srv.Clients(); n != 0 {
			t.Errorf("%d clients left after shutdown", n)
		}
	})
	return srv, h, addr
}

// testClient speaks RESP to a server.
type testClient struct {
	t  *testing.T
	c  net.Conn
	rd *bufio.Reader
}

func dialTest(t *testing.T, addr string) *testClient {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	return &testClient{t: t, c: c, rd: bufio.NewReaderSize(c, 64<<10)}
}

// serverInq is how many bytes the client at addr sent that the server has
// not read yet (its socket's receive queue), and whether it was found.
func serverInq(srv *Server, addr string) (int, bool) {
	for _, sess := range srv.Sessions() {
		if sess.remoteAddr != addr {
			continue
		}
		q, err := -1, error(nil)
		if fc, ok := sess.netConn().(*fdConn); ok {
			fc.mu.RLock()
			if fc.fd >= 0 {
				q, err = unix.IoctlGetInt(fc.fd, unix.SIOCINQ)
			}
			fc.mu.RUnlock()
		} else if sc, ok := sess.netConn().(syscall.Conn); ok {
			rc, rerr := sc.SyscallConn()
			if rerr != nil {
				return 0, false
			}
			_ = rc.Control(func(fd uintptr) { q, err = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
		}
		if q < 0 || err != nil {
			return 0, false // between sockets (a hand-off): look again
		}
		return q, true
	}
	return 0, false
}

// readByServer waits until srv has read everything tc sent, so that what
// tc sends next reaches the server in a read of its own: on a loaded
// machine a sleep does not ensure that.
func (tc *testClient) readByServer(srv *Server) {
	tc.t.Helper()
	addr := tc.c.LocalAddr().String()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if q, ok := serverInq(srv, addr); ok && q == 0 {
			return
		}
		if time.Now().After(deadline) {
			tc.t.Fatalf("the server did not read what %s sent in 10s", addr)
		}
		time.Sleep(time.Millisecond)
	}
}

func encodeCmds(cmds ...string) []byte {
	var b []byte
	for _, cmd := range cmds {
		var args [][]byte
		for _, a := range strings.Fields(cmd) {
			args = append(args, []byte(a))
		}
		b = relay.AppendCommand(b, args)
	}
	return b
}

func (tc *testClient) send(cmds ...string) {
	tc.t.Helper()
	if _, err := tc.c.Write(encodeCmds(cmds...)); err != nil {
		tc.t.Fatal(err)
	}
}

// reply reads one reply: a bulk string's content, or a status or error
// line with its type byte.
func (tc *testClient) reply() string {
	tc.t.Helper()
	line, err := tc.rd.ReadString('\n')
	if err != nil {
		tc.t.Fatalf("reading a reply: %v", err)
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line[0] != '$' {
		return line
	}
	n, _ := strconv.Atoi(line[1:])
	b := make([]byte, n+2)
	if _, err := io.ReadFull(tc.rd, b); err != nil {
		tc.t.Fatal(err)
	}
	return string(b[:n])
}

func (tc *testClient) want(prefixes ...string) {
	tc.t.Helper()
	for _, p := range prefixes {
		if got := tc.reply(); !strings.HasPrefix(got, p) {
			tc.t.Fatalf("reply %.60q; want it to start with %q", got, p)
		}
	}
}

// TestLoopServes: batches the loop can run are served there, replies keep
// the order of the commands across batches that stall for an earlier
// reply, and the first batch the loop cannot run moves the connection to
// a goroutine for good, commands pipelined behind it included.
func TestLoopServes(t *testing.T) {
	srv, _, addr := loopServer(t)
	for _, tc := range []struct {
		name  string
		sends [][]string // each one write
		want  []string   // reply prefixes, in order
	}{
		{"async", [][]string{{"ASYNC 10 0"}}, []string{"loop"}},
		{"local", [][]string{{"LOCAL a", "LOCAL b"}}, []string{"loop:a", "loop:b"}},
		{"pipelined async", [][]string{{"ASYNC 10 5", "ASYNC 20 0", "ASYNC 5 1"}}, []string{"loop", "loop", "loop"}},
		{"next batch waits for a slow reply", [][]string{{"ASYNC 10 50"}, {"ASYNC 10 0"}, {"ASYNC 5 0"}},
			[]string{"loop", "loop", "loop"}},
		// Read while the first reply is in flight (long enough for a
		// loaded machine), the two arrive as one batch, a mixed one.
		{"batches read while stalled", [][]string{{"ASYNC 10 300"}, {"ASYNC 10 0"}, {"LOCAL c"}},
			[]string{"loop", "goroutine", "goroutine:c"}},
		{"mixed batch moves", [][]string{{"ASYNC 10 20", "LOCAL d"}, {"ASYNC 10 0"}},
			[]string{"goroutine", "goroutine:d", "goroutine"}},
		{"blocking command moves", [][]string{{"ASYNC 10 30"}, {"BLOCK 1", "ASYNC 8 0", "LOCAL e"}},
			[]string{"loop", "+blocked goroutine", "goroutine", "goroutine:e"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialTest(t, addr)
			for _, s := range tc.sends {
				c.send(s...)
				c.readByServer(srv) // each write a read of its own
			}
			c.want(tc.want...)
			// Still served afterwards.
			c.send("LOCAL z")
			c.want(tc.want[len(tc.want)-1][:4])
		})
	}
}

// TestLoopSlowReader: a client that does not read gets a reply bigger
// than the socket takes at once later, in full and in order, and the loop
// goes on serving others meanwhile.
func TestLoopSlowReader(t *testing.T) {
	srv, _, addr := loopServer(t)
	slow := dialTest(t, addr)
	const big = 8 << 20
	slow.send("ASYNC "+strconv.Itoa(big)+" 0", "ASYNC 10 0")
	// Read apart from the ASYNCs: in one batch with them it would be a
	// mixed one, which moves to a goroutine.
	slow.readByServer(srv)
	slow.send("LOCAL after") // stalls behind the big reply

	other := dialTest(t, addr)
	for i := range 100 {
		other.send("ASYNC 100 0")
		other.want("loop")
		other.send("LOCAL " + strconv.Itoa(i))
		other.want("loop:" + strconv.Itoa(i))
	}

	time.Sleep(100 * time.Millisecond)
	if got := slow.reply(); len(got) != big || !strings.HasPrefix(got, "loop") {
		t.Fatalf("big reply: %d bytes, %.10q", len(got), got)
	}
	slow.want("loop", "loop:after")
}

// TestLoopClientGoes: a client that closes with replies in flight, or
// half-closes after its last request, leaves no connection behind; the
// half-closed one still gets its replies.
func TestLoopClientGoes(t *testing.T) {
	srv, h, addr := loopServer(t)
	// The loop starts with Serve: count goroutines once it runs.
	probe := dialTest(t, addr)
	probe.send("LOCAL probe")
	probe.want("loop:probe")
	probe.c.Close()
	for h.closed.Load() != 1 {
		time.Sleep(time.Millisecond)
	}
	before := runtime.NumGoroutine()

	gone := dialTest(t, addr)
	gone.send("ASYNC 100 50", "ASYNC 100 0")
	gone.c.Close()

	half := dialTest(t, addr)
	half.send("ASYNC 10 20", "ASYNC 10 0")
	half.readByServer(srv)
	half.send("LOCAL last")
	if err := half.c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	half.want("loop", "loop")
	if got := half.reply(); !strings.HasSuffix(got, ":last") {
		t.Fatalf("last reply %q", got)
	}
	if _, err := half.rd.ReadByte(); err != io.EOF {
		t.Fatalf("after the last reply: %v; want EOF", err)
	}

	deadline := time.Now().Add(10 * time.Second)
	for srv.Clients() != 0 || h.closed.Load() != 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d clients open, %d closed; want 0 and 3", srv.Clients(), h.closed.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		t.Errorf("goroutines: %d after, %d before\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}

// TestLoopProtocolError: malformed input is answered after the commands
// before it, as Redis does, and the connection closed.
func TestLoopProtocolError(t *testing.T) {
	srv, _, addr := loopServer(t)
	c := dialTest(t, addr)
	c.send("ASYNC 10 10")
	c.readByServer(srv)
	if _, err := c.c.Write([]byte("*1\r\n$4\r\nLOCAL\r\n")); err != nil { // bad bulk end
		t.Fatal(err)
	}
	c.want("loop", "-ERR Protocol error")
	if _, err := c.rd.ReadByte(); err != io.EOF {
		t.Fatalf("after the error: %v; want EOF", err)
	}
}

// TestLoopShutdown: shutting down lets a reply in flight out, closes idle
// connections on the loop, and returns.
func TestLoopShutdown(t *testing.T) {
	srv, h, addr, done := serveLoop(t)
	idle := dialTest(t, addr)
	idle.send("LOCAL hi")
	idle.want("loop:hi")
	busy := dialTest(t, addr)
	busy.send("ASYNC 10 200")
	busy.readByServer(srv)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	<-done
	busy.want("loop")
	for _, c := range []*testClient{idle, busy} {
		if _, err := c.rd.ReadByte(); err != io.EOF {
			t.Errorf("after shutdown: %v; want EOF", err)
		}
	}
	if h.closed.Load() != 2 {
		t.Errorf("%d connections closed; want 2", h.closed.Load())
	}
}

// TestLoopManyClients: many clients pipelining at once, some moving to
// goroutines midway, all get their replies in order.
func TestLoopManyClients(t *testing.T) {
	_, _, addr := loopServer(t)
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(60 * time.Second))
			rd := bufio.NewReader(c)
			for round := range 200 {
				cmds := []string{"ASYNC 20 0", "ASYNC 30 0"}
				if i%4 == 0 && round == 100 {
					cmds = append(cmds, "BLOCK 0")
				}
				if _, err := c.Write(encodeCmds(cmds...)); err != nil {
					errs <- err
					return
				}
				for _, cmd := range cmds {
					line, err := rd.ReadString('\n')
					if err != nil {
						errs <- err
						return
					}
					if cmd == "BLOCK 0" {
						if !strings.HasPrefix(line, "+blocked") {
							errs <- fmt.Errorf("client %d: %q for %s", i, line, cmd)
							return
						}
						continue
					}
					size, _ := strconv.Atoi(strings.Fields(cmd)[1])
					body := make([]byte, size+2)
					if _, err := io.ReadFull(rd, body); err != nil || line != "$"+strconv.Itoa(size)+"\r\n" {
						errs <- fmt.Errorf("client %d round %d: %q %v", i, round, line, err)
						return
					}
					if !bytes.HasPrefix(body, []byte("loop")) && !bytes.HasPrefix(body, []byte("goroutine")) {
						errs <- fmt.Errorf("client %d: body %q", i, body)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestLoopBigCommand: one command bigger than what the loop reads ahead
// for a stalled connection (1 MB) is read on and served, with and without
// a reply in flight before it.
func TestLoopBigCommand(t *testing.T) {
	srv, _, addr := loopServer(t)
	big := strings.Repeat("x", 3<<20)
	for _, tc := range []struct {
		name   string
		before []string
	}{
		{"alone", nil},
		{"behind a slow reply", []string{"ASYNC 10 100"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialTest(t, addr)
			if tc.before != nil {
				c.send(tc.before...)
				c.readByServer(srv)
			}
			c.send("LOCAL " + big)
			if tc.before != nil {
				c.want("loop")
			}
			if got := c.reply(); got != "loop:"+big {
				t.Fatalf("reply of %d bytes; want the 3 MB argument back", len(got))
			}
		})
	}
}

// TestLoopReturns: a connection moved to a goroutine comes back to the
// loop after 16 batches in a row that the loop could have served, and
// one that keeps sending batches the loop cannot run stays where it is.
func TestLoopReturns(t *testing.T) {
	srv, _, addr := loopServer(t)
	c := dialTest(t, addr)
	c.send("BLOCK 0")
	c.want("+blocked goroutine")
	for i := range loopReturnAfter {
		c.send("ASYNC 8 0")
		if got := c.reply(); !strings.HasPrefix(got, "goroutine") {
			t.Fatalf("batch %d after the move: %q; want it still on the goroutine", i, got)
		}
	}
	c.send("ASYNC 8 0")
	c.want("loop")
	c.send("LOCAL back")
	c.want("loop:back")
	if _, _, back := srv.LoopStats(); back != 1 {
		t.Errorf("returns = %d; want 1", back)
	}

	// Moving again works the same way, and a connection that blocks
	// every few batches stays on its goroutine.
	for i := range 3 * loopReturnAfter {
		if i%8 == 0 {
			c.send("BLOCK 0")
			c.want("+blocked goroutine")
		}
		c.send("ASYNC 8 0")
		c.want("goroutine")
	}
	if _, _, back := srv.LoopStats(); back != 1 {
		t.Errorf("returns = %d after batches that kept blocking; want still 1", back)
	}
}

// TestLoopPausedResumes: a client that pipelines megabytes behind a slow
// reply is read up to a bound, then left unread (out of the epoll set)
// until the reply is out; then every reply comes, in order.
func TestLoopPausedResumes(t *testing.T) {
	srv, _, addr := loopServer(t)
	c := dialTest(t, addr)
	c.send("ASYNC 10 300")
	c.readByServer(srv)
	arg := strings.Repeat("p", 1000)
	const n = 3000 // 3 MB of requests
	cmds := make([]string, n)
	for i := range cmds {
		cmds[i] = "LOCAL " + strconv.Itoa(i) + arg
	}
	wrote := make(chan error, 1)
	go func() { _, err := c.c.Write(encodeCmds(cmds...)); wrote <- err }()
	c.want("loop")
	for i := range n {
		if got := c.reply(); got != where0(got)+":"+strconv.Itoa(i)+arg {
			t.Fatalf("reply %d: %.40q", i, got)
		}
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
}

// where0 is the prefix a LOCAL reply starts with.
func where0(reply string) string {
	w, _, _ := strings.Cut(reply, ":")
	return w
}

// TestLaterDoesNotAllocate: the relay asks for Later on every batch the
// loop serves.
func TestLaterDoesNotAllocate(t *testing.T) {
	l := &eventLoop{}
	l.laterFn = l.addLater
	s := &Session{loop: l}
	if n := testing.AllocsPerRun(1000, func() { _ = s.Later() }); n != 0 {
		t.Errorf("Later allocates %v times per call; want 0", n)
	}
}
