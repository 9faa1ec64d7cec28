//go:build linux

package resp

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// TestIdleConnectionGivesBackBigReplyMemory: once a big reply (a large
// value, COMMAND DOCS's 170 KB, which redis-cli asks for as it starts) is
// written and the client goes idle, the connection keeps no more of the
// reply buffer (Session.W) than it keeps of its read buffer or its output
// buffer (maxKeptBuffer, maxKeptOutput: 64 KB), on the loop as on a
// goroutine. Before, the reply buffer kept up to 1 MB for the life of the
// connection: a pool of clients that each once read a value of a few
// hundred KB held that much each while it idled, tens of GB at max
// clients.
func TestIdleConnectionGivesBackBigReplyMemory(t *testing.T) {
	const clients = 16
	for _, size := range []int{200 << 10, 900 << 10} {
		for _, loop := range []bool{true, false} {
			t.Run(fmt.Sprintf("%d KB reply, loop %v", size>>10, loop), func(t *testing.T) {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				srv := &Server{Handler: &loopHandler{}, EventLoop: loop}
				done := make(chan error, 1)
				go func() { done <- srv.Serve(ln) }()
				defer func() {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					_ = srv.Shutdown(ctx)
					<-done
				}()
				var cs []*testClient
				for range clients {
					c := dialTest(t, ln.Addr().String())
					c.send("LOCAL warm")
					c.reply()
					cs = append(cs, c)
				}
				before := heapAfterGC()
				big := "LOCAL " + strings.Repeat("x", size)
				for _, c := range cs {
					c.send(big)
					if got := c.reply(); len(got) < size {
						t.Fatalf("reply of %d bytes; want %d", len(got), size)
					}
				}
				// Each per connection: the read buffer, its argument
				// scratch and the output buffer are each given back past
				// 64 KB; allow twice that in all.
				const maxHeld = 128 << 10
				var held int64
				for try := 0; try < 20; try++ {
					time.Sleep(50 * time.Millisecond)
					if held = (int64(heapAfterGC()) - int64(before)) / clients; held < maxHeld {
						break
					}
				}
				t.Logf("held per idle connection: %d KB", held>>10)
				if held >= maxHeld {
					// The connections idle: their reply buffers are not
					// written meanwhile.
					var wcap int
					for _, s := range srv.Sessions() {
						wcap = max(wcap, cap(s.W.b))
					}
					t.Errorf("an idle connection holds %d KB after a %d KB reply (reply buffer %d KB); want less than %d KB",
						held>>10, size>>10, wcap>>10, maxHeld>>10)
				}
			})
		}
	}
}
