package resp

import (
	"bufio"
	"context"
	"net"
	"strconv"
	"testing"
	"time"
)

// TestPushHeldKeepsEveryFrame proves that PushHeld drops no frame while a
// batch's replies are not written yet (serving), past the room Push has
// (16): every frame is written, in order, when the batch ends; and that
// past maxHeldPushes frames waiting the connection is closed rather than a
// frame dropped.
func TestPushHeldKeepsEveryFrame(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var lines []string
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			lines = append(lines, sc.Text())
		}
		got <- lines
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := newSession(context.Background(), 1, c)
	const n = 100
	s.serving.Store(true)
	for i := 0; i < n; i++ {
		if !s.PushHeld([]byte("+" + strconv.Itoa(i) + "\r\n")) {
			t.Fatalf("PushHeld %d = false", i)
		}
	}
	if !s.PushHeld([]byte("+x\r\n")) || s.Push([]byte("+y\r\n")) {
		t.Fatal("with pushes full: PushHeld should keep the frame and Push refuse it")
	}
	if err := s.endBatch(); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	var lines []string
	select {
	case lines = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("no output")
	}
	if len(lines) != n+1 {
		t.Fatalf("%d frames written; want %d", len(lines), n+1)
	}
	for i := 0; i < n; i++ {
		if lines[i] != "+"+strconv.Itoa(i) {
			t.Fatalf("frame %d = %q; want +%d (in order)", i, lines[i], i)
		}
	}

	// Past the bound: the connection is closed.
	c2, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	s2 := newSession(context.Background(), 2, c2)
	s2.serving.Store(true)
	for i := 0; i < 16+maxHeldPushes; i++ {
		if !s2.PushHeld([]byte("+p\r\n")) {
			t.Fatalf("PushHeld %d = false; want the frame kept", i)
		}
	}
	if s2.PushHeld([]byte("+p\r\n")) {
		t.Fatal("PushHeld past the bound = true; want false and the connection closed")
	}
	if s2.Context().Err() == nil {
		t.Error("the session's context is not canceled past the bound")
	}
}
