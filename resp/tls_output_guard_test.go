package resp

import (
	"bufio"
	"context"
	"crypto/tls"
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestTLSShutdownWithUnreadOutput: Shutdown with a TLS client that reads
// none of its pending replies ends at its deadline plus the grace, and
// leaves no goroutine behind.
func TestTLSShutdownWithUnreadOutput(t *testing.T) {
	setWriteTimeout(t, 20*time.Second)
	ln, server, client := tlsListener(t)
	h := &quitEchoHandler{}
	srv := &Server{Handler: h, TLSConfig: server}
	base := runtime.NumGoroutine()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	c := tls.Client(dialSmall(t, ln.Addr().String(), 0), client)
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	mustWrite(t, c, pipeline("ECHO", 2000, 8<<10))
	waitServed(h, 2000)
	if s := h.sess.Load(); s == nil || !s.outputPending() {
		t.Fatal("no output pending")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_ = srv.Shutdown(ctx)
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Shutdown took %v", d)
	}
	<-done
	if !waitUntil(time.Now().Add(5*time.Second), 10*time.Millisecond, func() bool { return runtime.NumGoroutine() <= base+1 }) {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines (%d before)\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
	}
}

// TestTLSConcurrentPushesAndClose: pushes from many goroutines, replies
// and Close, all at once, on a TLS client that reads slowly: no deadlock,
// everything ends.
func TestTLSConcurrentPushesAndClose(t *testing.T) {
	setWriteTimeout(t, 5*time.Second)
	for i := 0; i < 20; i++ {
		srv, h, addr, cfg, _ := tlsOutputServer(t, 256<<10, 0)
		base := runtime.NumGoroutine()
		c := dialTLSSmall(t, addr, cfg, 10*time.Second)
		rd := bufio.NewReader(c)
		echo(t, c, rd, "hi")
		s := tlsSession(t, h)
		go func() { _, _ = c.Write(pipeline("ECHO", 200, 4<<10)) }()
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := 0; k < 200 && s.Context().Err() == nil; k++ {
					s.Push(pushFrame(2 << 10))
				}
			}()
		}
		time.Sleep(time.Duration(i) * time.Millisecond)
		s.Close()
		wg.Wait()
		if !waitUntil(time.Now().Add(5*time.Second), 10*time.Millisecond, func() bool { return connsGone(srv, base) }) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d clients, %d goroutines (%d before)\n%s", srv.Clients(), runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		c.Close()
	}
}

// TestTLS12PipelineBeforeRead: TestTLSOutputPipelineBeforeRead with
// a TLS 1.2 client.
func TestTLS12PipelineBeforeRead(t *testing.T) {
	setWriteTimeout(t, 10*time.Second)
	const n, size = 2000, 8 << 10
	_, h, addr, cfg, _ := tlsOutputServer(t, 0, 0)
	cfg = cfg.Clone()
	cfg.MaxVersion = tls.VersionTLS12
	c := dialTLSSmall(t, addr, cfg, 20*time.Second)
	if v := c.ConnectionState().Version; v != tls.VersionTLS12 {
		t.Fatalf("version %x", v)
	}
	if _, err := c.Write(pipeline("ECHO", n, size)); err != nil {
		t.Fatal(err)
	}
	readReplies(t, bufio.NewReader(c), n, size)
	tlsSession(t, h)
}

// TestTLSAuthTimeoutWithPendingOutput: a TLS client that never
// authenticates is closed at AuthTimeout even with output pending, and
// its goroutines end.
func TestTLSAuthTimeoutWithPendingOutput(t *testing.T) {
	setWriteTimeout(t, 20*time.Second)
	ln, server, client := tlsListener(t)
	h := &quitEchoHandler{}
	srv := &Server{Handler: h, TLSConfig: server, AuthRequired: true, AuthTimeout: 500 * time.Millisecond}
	base := runtime.NumGoroutine()
	serveUntilEnd(t, srv, ln, 0)
	c := tls.Client(dialSmall(t, ln.Addr().String(), 0), client)
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	mustWrite(t, c, pipeline("ECHO", 500, 8<<10))
	start := time.Now()
	if !waitUntil(time.Now().Add(5*time.Second), 10*time.Millisecond, func() bool { return connsGone(srv, base+2) }) {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d clients, %d goroutines (%d before)\n%s", srv.Clients(), runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
	}
	t.Logf("closed after %v", time.Since(start))
}
