package resp

import (
	"bufio"
	"io"
	"net"
	"strconv"
	"testing"
	"time"
)

// benchHandler answers every command with +PONG, from memory, on the event
// loop or on the connection's goroutine: what is measured is the server's
// own path (read, parse, reply, write), not a command's.
type benchHandler struct{}

func (benchHandler) ServeRESP(s *Session, args [][]byte) { s.W.Simple("PONG") }
func (benchHandler) Closed(*Session)                     {}
func (benchHandler) LoopReady(*Session) bool             { return true }
func (benchHandler) LoopSafe(*Session, [][][]byte) bool  { return true }
func (h benchHandler) ServeLoop(s *Session, cmds [][][]byte) bool {
	for _, args := range cmds {
		h.ServeRESP(s, args)
	}
	return true
}

// BenchmarkReplies: commands answered through a real loopback connection,
// one at a time and pipelined, on goroutines and on the event loop. The
// reply write is on this path once per batch: its cost, and whether it
// allocates, shows here (ns/op and allocs/op are per command).
func BenchmarkReplies(b *testing.B) {
	for _, loop := range []bool{false, true} {
		for _, depth := range []int{1, 64} {
			name := "goroutine"
			if loop {
				name = "loop"
			}
			b.Run(name+"/pipeline="+strconv.Itoa(depth), func(b *testing.B) {
				ln := listenLocal(b)
				serveUntilEnd(b, &Server{Handler: benchHandler{}, EventLoop: loop}, ln, 5*time.Second)
				c, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				var req []byte
				for range depth {
					req = append(req, "*1\r\n$4\r\nPING\r\n"...)
				}
				const reply = "+PONG\r\n"
				rd := bufio.NewReaderSize(c, 64<<10)
				buf := make([]byte, depth*len(reply))
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i += depth {
					if _, err := c.Write(req); err != nil {
						b.Fatal(err)
					}
					if _, err := io.ReadFull(rd, buf); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
