package redis

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
)

// TestReadPastDeadlineTakesArrivedAnswer: a batch's answers that arrived
// in time but were not read before the connection's deadline passed (the
// process was stopped: SIGSTOP, a VM pause, a long stall) are read, not
// taken for a silent node's, over TCP as under TLS. Go checks the
// deadline before it reads the socket, so without a look at what the
// socket holds the read failed with a timeout although the answer was
// there. What has not arrived still fails at once.
func TestReadPastDeadlineTakesArrivedAnswer(t *testing.T) {
	overTCPAndTLS(t, func(t *testing.T, _ *harness.Redis, cfg NodeConfig) {
		n := NewNode(cfg)
		defer n.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := n.connect(ctx)
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		defer c.close()

		// A write whose deadline passed before it was made (a stop
		// between the batch's SetDeadline and its write) goes out.
		_ = c.nc.SetDeadline(time.Now().Add(-time.Millisecond))
		c.add("PING")
		c.add("ECHO", "after the stop")
		if err := c.flush(); err != nil {
			t.Fatalf("write past its deadline: %v; want it written", err)
		}
		// The node answers at once; the reader runs only after the
		// deadline.
		time.Sleep(100 * time.Millisecond)
		var r reply
		if err := c.read(&r); err != nil {
			t.Fatalf("read of an answer that arrived before the deadline passed: %v; want PONG", err)
		}
		if r.kind != '+' || string(r.s) != "PONG" {
			t.Fatalf("read = %q %q; want +PONG", r.kind, r.s)
		}
		if err := c.read(&r); err != nil || r.kind != '$' || string(r.s) != "after the stop" {
			t.Fatalf("second read = %q %q, %v; want the ECHO", r.kind, r.s, err)
		}

		// Nothing more is on its way: past the deadline, the read
		// fails at once rather than waiting.
		start := time.Now()
		if err := c.read(&r); err == nil {
			t.Fatalf("read with nothing sent = %q; want a timeout", r.kind)
		}
		if d := time.Since(start); d > 50*time.Millisecond {
			t.Errorf("read past the deadline with nothing there took %v; want at once", d)
		}
	})
}
