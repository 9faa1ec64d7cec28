package resp

import (
	"context"
	"io"
	"net"
	"testing"
)

// TestPlainWriteDoesNotAllocate: a reply written to a plain TCP
// socket that takes it costs no allocation (the hot path of output.go).
func TestPlainWriteDoesNotAllocate(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, _ = io.Copy(io.Discard, c)
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := newSession(context.Background(), 1, c)
	b := []byte("+OK\r\n")
	_ = s.write(b)
	if n := testing.AllocsPerRun(1000, func() {
		if err := s.write(b); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("a write allocates %v times; want 0", n)
	}
}
