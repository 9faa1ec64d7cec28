package relay

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// drainedUpConn is an upstream connection whose peer reads and drops
// everything; the cleanup closes both ends.
func drainedUpConn(t *testing.T) *upConn {
	t.Helper()
	nc, peer := loopbackPair(t)
	go func() { _, _ = io.Copy(io.Discard, peer) }()
	return newUpConn(nc, 2, 0, 0)
}

// loopbackPair is a connected loopback TCP pair: lockproxy's end and the
// upstream's. The cleanup closes both.
func loopbackPair(t *testing.T) (nc, peer net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	nc, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	peer, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	return nc, peer
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

// gateFixture is an upstream connection over loopback TCP to a peer the
// test plays the upstream on, with the event loop's side of queueing
// (later: the flushes the loop would run after its round).
type gateFixture struct {
	t       *testing.T
	c       *upConn
	peer    net.Conn
	replies chan string
	later   []func()
}

func newGateFixture(t *testing.T) *gateFixture {
	nc, peer := loopbackPair(t)
	c := newUpConn(nc, 2, 0, 0)
	go c.readLoop()
	t.Cleanup(func() {
		peer.Close()
		c.close()
		<-c.closed
	})
	return &gateFixture{t: t, c: c, peer: peer, replies: make(chan string, 4)}
}

// queue queues req as the loop would, for a call of one reply.
func (f *gateFixture) queue(req string) {
	f.t.Helper()
	cl := newCall()
	cl.n = 1
	cl.deliver = func(b []byte) { f.replies <- string(b) }
	if err := f.c.queue([]byte(req), cl, func(fn func()) { f.later = append(f.later, fn) }); err != nil {
		f.t.Fatal(err)
	}
}

// runLater runs the flushes queue scheduled, as the loop does after its
// round.
func (f *gateFixture) runLater() {
	for _, fn := range f.later {
		fn()
	}
	f.later = f.later[:0]
}

// expect reads want from the upstream's side.
func (f *gateFixture) expect(want string) {
	f.t.Helper()
	_ = f.peer.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, len(want))
	if _, err := io.ReadFull(f.peer, got); err != nil || string(got) != want {
		f.t.Fatalf("upstream read %q, %v; want %q", got, err, want)
	}
}

// nothingSent checks that the upstream got nothing for 100 ms.
func (f *gateFixture) nothingSent(why string) {
	f.t.Helper()
	_ = f.peer.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, err := f.peer.Read(make([]byte, 64)); err == nil {
		f.t.Fatalf("upstream got %d bytes %s", n, why)
	}
}

// answer writes replies from the upstream's side.
func (f *gateFixture) answer(b string) {
	f.t.Helper()
	if _, err := f.peer.Write([]byte(b)); err != nil {
		f.t.Fatal(err)
	}
}

// reply waits for the next reply a call got.
func (f *gateFixture) reply(want string) {
	f.t.Helper()
	select {
	case got := <-f.replies:
		if got != want {
			f.t.Fatalf("reply %q; want %q", got, want)
		}
	case <-time.After(10 * time.Second):
		f.t.Fatalf("no reply; want %q", want)
	}
}

const ping, echo, get = "*1\r\n$4\r\nPING\r\n", "*2\r\n$4\r\nECHO\r\n$1\r\nx\r\n", "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"

// TestLoopOneBatchInFlight: behind an upstream that answers fast, the
// event loop's requests wait while a batch is in flight on the
// connection, go out in one write once its replies are in, and get an
// error reply when the connection fails meanwhile.
func TestLoopOneBatchInFlight(t *testing.T) {
	f := newGateFixture(t)
	f.queue(ping)
	f.runLater()
	f.expect(ping)
	// A batch is in flight: the next requests wait, and nothing is left
	// for the loop to flush.
	f.queue(echo)
	f.queue(get)
	if len(f.later) != 0 {
		t.Fatalf("%d flushes scheduled while a batch is in flight; want none", len(f.later))
	}
	f.nothingSent("while the first batch was unanswered")
	f.answer("+PONG\r\n")
	f.reply("+PONG\r\n")
	f.expect(echo + get) // one write, sent by the reader
	f.answer("$1\r\nx\r\n$-1\r\n")
	f.reply("$1\r\nx\r\n")
	f.reply("$-1\r\n")

	// Nothing in flight: the next request is flushed by the loop again.
	f.queue(ping)
	if len(f.later) != 1 {
		t.Fatalf("%d flushes scheduled with nothing in flight; want 1", len(f.later))
	}
	f.runLater()
	f.expect(ping)
	f.queue(echo) // waits behind the PING
	if len(f.later) != 0 {
		// The first batch's 100 ms counted once, capped: 250 µs, under
		// gateMaxRTT.
		t.Fatalf("%d flushes scheduled behind the PING (estimate %v); want none", len(f.later), time.Duration(f.c.rtt.Load()))
	}
	f.peer.Close()
	for _, what := range []string{"the batch in flight", "the request waiting behind it"} {
		select {
		case got := <-f.replies:
			if !strings.HasPrefix(got, "-ERR upstream unavailable") {
				t.Fatalf("reply to %s %q; want an upstream unavailable error", what, got)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no reply to %s after the upstream went away", what)
		}
	}
}

// TestLoopGateOffBehindSlowUpstream: once batches take longer than
// gateMaxRTT to be answered (a distant or busy upstream), requests no
// longer wait for the batch in flight: holding one back would cost its
// client a round trip of that length. One slow batch is not enough.
func TestLoopGateOffBehindSlowUpstream(t *testing.T) {
	f := newGateFixture(t)
	slow := 0
	for f.c.gateOn.Load() {
		if slow == 10 {
			t.Fatalf("gate still on after %d batches answered 20 ms late (estimate %v)", slow, time.Duration(f.c.rtt.Load()))
		}
		f.queue(ping)
		f.runLater()
		f.expect(ping)
		time.Sleep(20 * time.Millisecond)
		f.answer("+PONG\r\n")
		f.reply("+PONG\r\n")
		slow++
	}
	// Each sample counts for at most rttSampleCap (2 ms): 250, 469, 660 µs.
	if slow != 3 {
		t.Fatalf("gate off after %d slow batches; want 3", slow)
	}

	f.queue(ping)
	f.runLater()
	f.expect(ping)
	// A batch is in flight, but the upstream is slow: the next request is
	// flushed by the loop at once, not held back.
	f.queue(echo)
	if len(f.later) != 1 {
		t.Fatalf("%d flushes scheduled behind a slow upstream; want 1", len(f.later))
	}
	f.runLater()
	f.expect(echo)
	f.answer("+PONG\r\n$1\r\nx\r\n")
	f.reply("+PONG\r\n")
	f.reply("$1\r\nx\r\n")
}

// TestRTTEstimate: the moving average of the round trip, its cap per
// sample, the gate's hysteresis (off at gateMaxRTT, on again under
// gateMinRTT), the seed from the dial, and samples taken only for the
// first call of the last batch.
func TestRTTEstimate(t *testing.T) {
	c := newUpConn(nil, 2, 0, 0)
	var n int64
	// sample answers a batch whose first reply came d after its write.
	sample := func(d time.Duration) {
		n++
		c.sentAt.Store(int64(time.Since(clockBase) - d))
		c.batchFirst.Store(n)
		c.sampleRTT(n)
	}
	// check takes one sample of d and checks the estimate against the
	// moving average (the sample may come out a little longer than d: the
	// time between storing sentAt and sampling) and the gate against the
	// hysteresis on the estimate.
	check := func(d time.Duration) {
		t.Helper()
		prev, wasOn := c.rtt.Load(), c.gateOn.Load()
		sample(d)
		want := prev + (min(max(int64(d), 0), int64(rttSampleCap))-prev)/8
		got := c.rtt.Load()
		if got < want-int64(time.Microsecond) || got > want+int64(200*time.Microsecond) {
			t.Fatalf("sample %v after %v: estimate %v, want about %v", d, time.Duration(prev), time.Duration(got), time.Duration(want))
		}
		wantOn := wasOn
		switch {
		case got >= int64(gateMaxRTT):
			wantOn = false
		case got < int64(gateMinRTT):
			wantOn = true
		}
		if c.gateOn.Load() != wantOn {
			t.Fatalf("sample %v: gate %v with estimate %v (was %v); want %v", d, c.gateOn.Load(), time.Duration(got), wasOn, wantOn)
		}
	}
	check(100 * time.Microsecond)
	// Slow samples count for at most rttSampleCap: one or two leave the
	// gate on, the third turns it off.
	for i := 0; i < 3; i++ {
		if !c.gateOn.Load() {
			t.Fatalf("gate off after %d slow samples; want 3", i)
		}
		check(time.Second)
	}
	if c.gateOn.Load() {
		t.Fatalf("gate on after 3 slow samples (estimate %v)", time.Duration(c.rtt.Load()))
	}
	// Fast samples bring it down; the gate stays off until under
	// gateMinRTT, then opens.
	check(-time.Second) // a sample below 0 counts as 0
	for i := 0; !c.gateOn.Load(); i++ {
		if i == 40 {
			t.Fatalf("gate still off after 40 fast samples (estimate %v)", time.Duration(c.rtt.Load()))
		}
		check(30 * time.Microsecond)
	}

	// A call that is not the first of the last batch taken is no sample.
	before := c.rtt.Load()
	c.batchFirst.Store(n + 5)
	c.sampleRTT(n + 1)
	if c.rtt.Load() != before {
		t.Fatal("a reply that is not its batch's first changed the estimate")
	}

	// The dial's round trip seeds the estimate, capped.
	for _, tc := range []struct {
		d      time.Duration
		gateOn bool
	}{{40 * time.Microsecond, true}, {5 * time.Millisecond, false}, {-time.Second, true}} {
		c.seedRTT(tc.d)
		if c.gateOn.Load() != tc.gateOn || time.Duration(c.rtt.Load()) > rttSampleCap || c.rtt.Load() < 0 {
			t.Fatalf("seedRTT(%v): estimate %v, gate %v; want gate %v, estimate within [0, %v]",
				tc.d, time.Duration(c.rtt.Load()), c.gateOn.Load(), tc.gateOn, rttSampleCap)
		}
	}
}
