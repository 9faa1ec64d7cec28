//go:build linux

package resp

import (
	"bytes"
	"context"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestIdleConnectionGivesBackBigCommandMemory: once a big command (one
// huge argument, or a million small ones) is served and the client goes
// idle, the connection holds no more than a few MB: the read buffer, the
// argument offsets and the event loop's argument views that the command
// grew are given back, on the loop as on a goroutine. A pool of clients
// that each once sent a big MSET or DEL must not keep tens of MB per
// connection. On the loop an idle client is never read again, so the
// memory must be given back when its batch is served, not at the next
// read.
func TestIdleConnectionGivesBackBigCommandMemory(t *testing.T) {
	manyArgs := func() []byte {
		var b bytes.Buffer
		b.WriteString("*1048576\r\n$5\r\nLOCAL\r\n")
		for i := 1; i < 1<<20; i++ {
			b.WriteString("$1\r\nx\r\n")
		}
		return b.Bytes()
	}
	bigArg := func() []byte { return encodeCmds("LOCAL " + strings.Repeat("x", 32<<20)) }
	// Loose enough that the heap's noise cannot reach it, tight enough
	// that any of the big command's buffers (16 MB or more) would.
	const maxHeld = 4 << 20
	for _, tc := range []struct {
		name  string
		loop  bool
		input func() []byte
	}{
		{"big argument on the loop", true, bigArg},
		{"big argument on a goroutine", false, bigArg},
		{"a million arguments on the loop", true, manyArgs},
		{"a million arguments on a goroutine", false, manyArgs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := &Server{Handler: &loopHandler{}, EventLoop: tc.loop}
			done := make(chan error, 1)
			go func() { done <- srv.Serve(ln) }()
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = srv.Shutdown(ctx)
				<-done
			}()
			c := dialTest(t, ln.Addr().String())
			c.send("LOCAL warm")
			c.reply()
			before := heapAfterGC()

			in := tc.input()
			if _, err := c.c.Write(in); err != nil {
				t.Fatal(err)
			}
			in = nil
			_ = c.reply()

			// The server is idle now; give it a moment to finish with the
			// reply (its write goroutine), then measure, a few times.
			var held int64
			for try := 0; try < 20; try++ {
				time.Sleep(50 * time.Millisecond)
				if held = int64(heapAfterGC()) - int64(before); held < maxHeld {
					break
				}
			}
			on, _, _ := srv.LoopStats()
			t.Logf("clients on the loop: %d; held after the command: %.1f MB", on, float64(held)/(1<<20))
			if (on == 1) != tc.loop {
				t.Fatalf("clients on the loop: %d; the test wants the connection on the loop: %v", on, tc.loop)
			}
			if held >= maxHeld {
				var rbuf, offs, vargs int
				for _, s := range srv.Sessions() {
					rbuf, offs, vargs = cap(s.rd.buf), cap(s.rd.offs), cap(s.rd.vargs)
				}
				t.Errorf("an idle connection holds %.1f MB after its big command (read buffer %d B, offsets cap %d, views cap %d); want less than %d MB",
					float64(held)/(1<<20), rbuf, offs, vargs, maxHeld>>20)
			}
		})
	}
}

// heapAfterGC is the live heap, garbage collected.
func heapAfterGC() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// feedReader hands out once in reads as big as asked, then repeat whole
// on every read (repeat must fit the reader's free buffer).
type feedReader struct{ once, repeat []byte }

func (r *feedReader) Read(p []byte) (int, error) {
	if len(r.once) > 0 {
		n := copy(p, r.once)
		r.once = r.once[n:]
		return n, nil
	}
	return copy(p, r.repeat), nil
}

// TestLoopBatchDoesNotAllocate: giving back what big commands grew costs
// the event loop's hot path nothing for ordinary batches (read, views,
// release), also once a 40 KB value has grown the read buffer to a size
// that is kept.
func TestLoopBatchDoesNotAllocate(t *testing.T) {
	var pipeline [][]string
	for range 50 {
		pipeline = append(pipeline, []string{"SET", "lock:a", "token", "PX", "10000"})
	}
	in := encode(pipeline)
	for _, tc := range []struct {
		name  string
		first []byte
	}{
		{"small buffer", nil},
		{"after a 40 KB value", encode([][]string{{"SET", "k", strings.Repeat("x", 40<<10)}})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewReader(&feedReader{once: tc.first, repeat: in})
			if tc.first != nil {
				for range 100 {
					if err := r.fill(r.need); err != nil {
						t.Fatal(err)
					}
					if cmds, err := r.parseViews(); err != nil || len(cmds) > 0 {
						r.release()
						break
					}
				}
				if len(r.buf) <= initialReadBuffer || len(r.buf) > maxKeptBuffer {
					t.Fatalf("read buffer %d B after the 40 KB value; want it grown and kept", len(r.buf))
				}
			}
			batch := func() {
				if err := r.fill(r.need); err != nil {
					t.Fatal(err)
				}
				if _, err := r.parseViews(); err != nil {
					t.Fatal(err)
				}
				r.release()
			}
			batch() // warm up the scratch
			if n := testing.AllocsPerRun(200, batch); n != 0 {
				t.Errorf("a batch on the loop allocates %v times; want 0", n)
			}
		})
	}
}
