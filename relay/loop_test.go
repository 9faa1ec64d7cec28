package relay

import (
	"bytes"
	"context"
	"io"
	"net"
	"testing"
	"time"
)

// drainedUpConn is an upstream connection whose peer reads and drops
// everything; the cleanup closes both ends.
func drainedUpConn(t *testing.T) *upConn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	go func() { _, _ = io.Copy(io.Discard, peer) }()
	return newUpConn(nc, 2, 0, 0)
}

// TestFlushLoopSpare: after the event loop's flush wrote a buffer of more
// than 1 MB, the write buffer and the spare one are never one array, or
// requests queued next would be written into bytes still being sent.
func TestFlushLoopSpare(t *testing.T) {
	c := drainedUpConn(t)
	var later []func()
	run := func(b []byte) {
		if err := c.queue(b, nil, func(f func()) { later = append(later, f) }); err != nil {
			t.Fatal(err)
		}
		for _, f := range later {
			f()
		}
		later = later[:0]
		deadline := time.Now().Add(10 * time.Second)
		for { // a partial write finishes on a goroutine
			c.mu.Lock()
			writing := c.writing
			c.mu.Unlock()
			if !writing {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("write never finished")
			}
			time.Sleep(time.Millisecond)
		}
	}
	run(bytes.Repeat([]byte{'a'}, 64<<10))
	run(bytes.Repeat([]byte{'b'}, 1100<<10))
	run(bytes.Repeat([]byte{'c'}, 1100<<10))
	c.mu.Lock()
	defer c.mu.Unlock()
	if cap(c.spare) > 0 && cap(c.wbuf) > 0 && &c.spare[:1][0] == &c.wbuf[:1][0] {
		t.Fatal("the write buffer and the spare one share an array")
	}
}

// TestLiveDoesNotWaitForDial: while a dial holds the shared connection's
// slot (here an upstream that accepts and never answers the handshake),
// the event loop's CollectAsync returns at once; the dial is waited for on
// a goroutine, and the replies say the upstream is unavailable.
func TestLiveDoesNotWaitForDial(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			// Never answered; closed after a while, so that the
			// handshake fails then.
			time.AfterFunc(500*time.Millisecond, func() { c.Close() })
		}
	}()
	r := New(Config{Addr: ln.Addr().String(), PoolSize: 1, DialTimeout: 300 * time.Millisecond})
	defer r.Close()
	later := func(f func()) { f() }

	replies := make(chan []byte, 2)
	for i, key := range []string{"a", "b"} {
		p := r.NewPipe(int64(i+1), nil, nil)
		p.Add([][]byte{[]byte("GET"), []byte(key)})
		start := time.Now()
		p.CollectAsync(context.Background(), 2, func(b []byte) { replies <- append([]byte(nil), b...) }, later)
		if d := time.Since(start); d > 200*time.Millisecond {
			t.Errorf("CollectAsync %d blocked %v while the slot was being dialed", i, d)
		}
		time.Sleep(50 * time.Millisecond) // the first dial is under way
	}
	for range 2 {
		select {
		case b := <-replies:
			if !bytes.Contains(b, []byte("upstream unavailable")) {
				t.Errorf("reply %q; want upstream unavailable", b)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("no reply")
		}
	}
}

// TestLoopFlushDoesNotAllocate: queuing a request for the event loop and
// its flush after the round allocate nothing once the buffers have grown.
func TestLoopFlushDoesNotAllocate(t *testing.T) {
	c := drainedUpConn(t)
	var flush func()
	later := func(f func()) { flush = f }
	req := []byte("*2\r\n$3\r\nGET\r\n$1\r\nk\r\n")
	round := func() {
		if err := c.queue(req, nil, later); err != nil {
			t.Fatal(err)
		}
		flush()
	}
	round() // buffers grow once
	if n := testing.AllocsPerRun(1000, round); n != 0 {
		t.Errorf("a queued request and its flush allocate %v times; want 0", n)
	}
}
