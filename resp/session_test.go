package resp

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"strconv"
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
