package resp

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/relay"
)

// batchHandler answers "R n" with a bulk string of n bytes and anything
// else with +OK, and records, at the end of each batch, how many commands
// it ran and how many reply bytes were buffered.
type batchHandler struct {
	mu       sync.Mutex
	n        int
	maxCmds  int
	maxBytes int
}

func (h *batchHandler) ServeRESP(s *Session, args [][]byte) {
	h.mu.Lock()
	h.n++
	h.mu.Unlock()
	if string(args[0]) == "R" {
		n, _ := strconv.Atoi(string(args[1]))
		s.W.Bulk(bytes.Repeat([]byte{'r'}, n))
		return
	}
	s.W.Simple("OK")
}

func (h *batchHandler) EndBatch(s *Session) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.maxCmds = max(h.maxCmds, h.n)
	h.maxBytes = max(h.maxBytes, s.W.Len())
	h.n = 0
}

func (h *batchHandler) Closed(*Session) {}

// TestBatchBounds: however the input arrives, a batch runs at most
// maxBatchCommands commands and builds about maxBatchReply reply bytes
// before they are written, and every reply still comes, in order. Before
// the caps, a buffer grown by one big command took hundreds of thousands
// of small ones as one batch, and their replies were all built in memory
// before the first was written (gigabytes from a few MB of input).
func TestBatchBounds(t *testing.T) {
	const replySize = 64 << 10
	for _, tc := range []struct {
		name  string
		input func() []byte
		bulks int // "R" replies expected, in order
		oks   int // then +OK replies
	}{
		{
			// A big command grows the read buffer; the small ones after it
			// arrive many to a read.
			name: "many small commands behind a big one",
			input: func() []byte {
				b := relay.AppendCommand(nil, [][]byte{[]byte("BIG"), bytes.Repeat([]byte{'a'}, 1<<20)})
				for range 20000 {
					b = append(b, "P\r\n"...)
				}
				return b
			},
			oks: 1 + 20000,
		},
		{
			// Few input bytes, large replies.
			name: "small commands with large replies",
			input: func() []byte {
				var b []byte
				for range 100 {
					b = relay.AppendCommand(b, [][]byte{[]byte("R"), []byte(strconv.Itoa(replySize))})
				}
				return b
			},
			bulks: 100,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &batchHandler{}
			c, err := net.Dial("tcp", serveTest(t, h))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(60 * time.Second))
			go func() { _, _ = c.Write(tc.input()) }()

			rd := bufio.NewReader(c)
			for i := range tc.bulks {
				line, err := rd.ReadString('\n')
				if err != nil || line != "$"+strconv.Itoa(replySize)+"\r\n" {
					t.Fatalf("reply %d: %q, %v", i, line, err)
				}
				if _, err := io.CopyN(io.Discard, rd, replySize+2); err != nil {
					t.Fatal(err)
				}
			}
			for i := range tc.oks {
				if line, err := rd.ReadString('\n'); err != nil || line != "+OK\r\n" {
					t.Fatalf("reply %d: %q, %v", i, line, err)
				}
			}
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.maxCmds > maxBatchCommands {
				t.Errorf("a batch ran %d commands; want at most %d", h.maxCmds, maxBatchCommands)
			}
			if h.maxBytes > maxBatchReply+replySize+16 {
				t.Errorf("a batch built %d reply bytes; want at most about %d", h.maxBytes, maxBatchReply)
			}
		})
	}
}

// serveTest serves h on a free loopback port until the test ends, and
// returns the address.
func serveTest(t *testing.T, h Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &Server{Handler: h}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	})
	return ln.Addr().String()
}
