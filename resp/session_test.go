package resp

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/relay"
)

// asyncHandler answers "ASYNC size delay_ms" with a bulk string of size
// bytes written by another goroutine after the delay (BeginAsync), or
// from the connection's goroutine when the session refuses, and "ECHO x"
// from the connection's goroutine.
type asyncHandler struct{ async chan bool }

func (h *asyncHandler) ServeRESP(s *Session, args [][]byte) {
	switch string(args[0]) {
	case "ASYNC":
		size, _ := strconv.Atoi(string(args[1]))
		delay, _ := strconv.Atoi(string(args[2]))
		w := NewWriter()
		w.Bulk(bytes.Repeat([]byte{'x'}, size))
		reply := w.Bytes()
		write, ok := s.BeginAsync()
		h.async <- ok
		if !ok {
			s.W.Raw(reply)
			return
		}
		go func() {
			time.Sleep(time.Duration(delay) * time.Millisecond)
			write(reply)
		}()
	default:
		s.W.Bulk(args[len(args)-1])
	}
}

func (h *asyncHandler) Closed(*Session) {}

// TestBeginAsync: replies written by another goroutine keep their place
// before the replies written after them, also when the client reads so
// slowly that the socket does not take the reply at once (the rest then
// goes out from a goroutine of its own), and a reply buffered in the same
// batch makes the session refuse.
func TestBeginAsync(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &asyncHandler{async: make(chan bool, 16)}
	srv := &Server{Handler: h}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		<-done
	}()

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	rd := bufio.NewReader(c)
	encode := func(b []byte, cmd ...string) []byte {
		args := make([][]byte, len(cmd))
		for i, a := range cmd {
			args[i] = []byte(a)
		}
		return relay.AppendCommand(b, args)
	}
	send := func(cmd ...string) {
		t.Helper()
		if _, err := c.Write(encode(nil, cmd...)); err != nil {
			t.Fatal(err)
		}
	}
	readBulk := func() []byte {
		t.Helper()
		line, err := rd.ReadString('\n')
		if err != nil || line[0] != '$' {
			t.Fatalf("reply header %q: %v", line, err)
		}
		n, _ := strconv.Atoi(line[1 : len(line)-2])
		b := make([]byte, n+2)
		if _, err := io.ReadFull(rd, b); err != nil {
			t.Fatal(err)
		}
		return b[:n]
	}
	wantAsync := func(want bool) {
		t.Helper()
		select {
		case ok := <-h.async:
			if ok != want {
				t.Fatalf("BeginAsync: got %v, want %v", ok, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("ASYNC not served")
		}
	}

	for _, tc := range []struct {
		name  string
		size  int
		delay string
		slow  bool // the client reads only after a while
	}{
		{"small, delayed", 10, "100", false},
		{"larger than the socket takes, slow reader", 8 << 20, "0", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			send("ASYNC", strconv.Itoa(tc.size), tc.delay)
			wantAsync(true)
			// A later batch: its reply must wait for the async one.
			send("ECHO", "after")
			if tc.slow {
				time.Sleep(300 * time.Millisecond)
			}
			if got := readBulk(); len(got) != tc.size || bytes.Count(got, []byte{'x'}) != tc.size {
				t.Fatalf("async reply: %d bytes, want %d x's", len(got), tc.size)
			}
			if got := readBulk(); string(got) != "after" {
				t.Fatalf("reply after the async one: %q", got)
			}
		})
	}

	// A reply already buffered in the batch: no async write. The two are
	// sent in one write, so they are almost always one batch; either way
	// the order holds.
	if _, err := c.Write(encode(encode(nil, "ECHO", "first"), "ASYNC", "3", "0")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.async:
	case <-time.After(30 * time.Second):
		t.Fatal("ASYNC not served")
	}
	if got := readBulk(); string(got) != "first" {
		t.Fatalf("first reply %q", got)
	}
	if got := readBulk(); string(got) != "xxx" {
		t.Fatalf("second reply %q", got)
	}
}

// pushAsyncHandler answers "ASYNC size" with a bulk string of size bytes
// through BeginAsync, and anything else with +OK; it keeps the session for
// the test to push to.
type pushAsyncHandler struct{ sess atomic.Pointer[Session] }

func (h *pushAsyncHandler) ServeRESP(s *Session, args [][]byte) {
	h.sess.Store(s)
	if string(args[0]) != "ASYNC" {
		s.W.Simple("OK")
		return
	}
	size, _ := strconv.Atoi(string(args[1]))
	w := NewWriter()
	w.Bulk(bytes.Repeat([]byte{'x'}, size))
	if write, ok := s.BeginAsync(); ok {
		write(w.Bytes())
	} else {
		s.W.Raw(w.Bytes())
	}
}

func (h *pushAsyncHandler) Closed(*Session) {}

// TestPushNotInsidePartialReply: a push frame (lock-lost) queued while an
// asynchronous reply is half written goes out after the whole reply, never
// inside it. The socket takes a 4 MB reply in parts, and pushes come every
// few tens of µs meanwhile.
func TestPushNotInsidePartialReply(t *testing.T) {
	h := &pushAsyncHandler{}
	addr := serveTest(t, h)

	push := []byte(">2\r\n$4\r\npush\r\n$1\r\nP\r\n")
	deadline := time.Now().Add(20 * time.Second)
	for trial := 0; trial < 20 && time.Now().Before(deadline); trial++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		rd := bufio.NewReader(c)
		if _, err := c.Write(relay.AppendCommand(nil, [][]byte{[]byte("HI")})); err != nil {
			t.Fatal(err)
		}
		if line, err := rd.ReadString('\n'); err != nil || line != "+OK\r\n" {
			t.Fatalf("HI: %q, %v", line, err)
		}
		s := h.sess.Load()
		stop, pushed := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(pushed)
			for {
				select {
				case <-stop:
					return
				default:
				}
				s.Push(push)
				for t0 := time.Now(); time.Since(t0) < 60*time.Microsecond; {
				}
			}
		}()
		const size = 4 << 20
		if _, err := c.Write(relay.AppendCommand(nil, [][]byte{[]byte("ASYNC"), []byte(strconv.Itoa(size))})); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond) // the socket fills: the reply goes out in parts
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				t.Fatalf("trial %d: %v", trial, err)
			}
			if line == ">2\r\n" {
				for range 4 {
					_, _ = rd.ReadString('\n')
				}
				continue
			}
			if line != "$"+strconv.Itoa(size)+"\r\n" {
				t.Fatalf("trial %d: %q; want the reply or a push", trial, line)
			}
			b := make([]byte, size+2)
			if _, err := io.ReadFull(rd, b); err != nil {
				t.Fatalf("trial %d: %v", trial, err)
			}
			if k := bytes.Index(b, []byte(">2\r\n")); k >= 0 {
				t.Fatalf("trial %d: a push frame inside the reply at offset %d", trial, k)
			}
			break
		}
		close(stop)
		<-pushed
		c.Close()
	}
}
