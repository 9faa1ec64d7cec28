package relay

import (
	"bytes"
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestGateNoStranding: the event loop's queue (with the batch gate), the
// reader's sendDeferred and goroutine-served clients' send() on one
// upstream connection, for one second behind an upstream whose latency
// crosses gateMaxRTT now and then: every call must be answered. It runs
// queue's double check against the reader's count and sendDeferred against
// other writers, but the windows are narrow: with sendDeferred left out it
// fails at once, while a mark set after the check (a lost wake-up) went
// unnoticed in 20 runs. That ordering is argued in queue's comment.
func TestGateNoStranding(t *testing.T) {
	f := newGateFixture(t)
	c, peer := f.c, f.peer
	const req = "*1\r\n$4\r\nPING\r\n"
	go func() { // the upstream: +PONG per PING, sometimes slow
		buf := make([]byte, 64<<10)
		var pend []byte
		r := rand.New(rand.NewSource(1))
		for {
			n, err := peer.Read(buf)
			if err != nil {
				return
			}
			pend = append(pend, buf[:n]...)
			k := bytes.Count(pend, []byte(req))
			pend = pend[k*len(req):]
			if r.Intn(50) == 0 {
				time.Sleep(time.Duration(r.Intn(2000)) * time.Microsecond)
			}
			if _, err := peer.Write(bytes.Repeat([]byte("+PONG\r\n"), k)); err != nil {
				return
			}
		}
	}()
	deadline := time.Now().Add(time.Second)
	var outstanding, done atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 3; g++ { // goroutine-served clients on the same conn
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				cl := newCall()
				cl.n = 1 + rand.Intn(3)
				if err := c.send(bytes.Repeat([]byte(req), cl.n), cl, true); err != nil {
					t.Error(err)
					return
				}
				select {
				case <-cl.done:
				case <-time.After(5 * time.Second):
					t.Error("goroutine call stranded")
					return
				}
				time.Sleep(time.Duration(rand.Intn(300)) * time.Microsecond)
			}
		}()
	}
	// the loop: up to 32 clients, one call each in flight
	var later []func()
	issued := int64(0)
	for time.Now().Before(deadline) {
		for i := 0; i < 1+rand.Intn(4) && outstanding.Load() < 32; i++ {
			cl := newCall()
			cl.n = 1 + rand.Intn(2)
			outstanding.Add(1)
			issued++
			cl.deliver = func([]byte) { outstanding.Add(-1); done.Add(1) }
			if err := c.queue(bytes.Repeat([]byte(req), cl.n), cl, func(fn func()) { later = append(later, fn) }); err != nil {
				t.Fatal(err)
			}
		}
		for _, fn := range later {
			fn()
		}
		later = later[:0]
		time.Sleep(time.Duration(rand.Intn(100)) * time.Microsecond)
	}
	wg.Wait()
	end := time.Now().Add(5 * time.Second)
	for outstanding.Load() > 0 && time.Now().Before(end) {
		time.Sleep(time.Millisecond)
	}
	if n := outstanding.Load(); n != 0 {
		t.Fatalf("%d loop calls stranded (of %d)", n, issued)
	}
	t.Logf("%d loop calls answered, rtt estimate %v", issued, time.Duration(c.rtt.Load()))
}
