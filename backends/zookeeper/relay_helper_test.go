package zookeeper

import (
	"net"
	"sync"
	"testing"
)

// startRelay listens on a free loopback port and, for every connection
// accepted, dials up and runs serve(client, server) on a goroutine of its
// own (serve closes both when done). At the end of the test it stops
// accepting, closes every connection and waits for every serve.
func startRelay(t *testing.T, up string, serve func(c, s net.Conn)) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", up)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				serve(c, s)
			}()
		}
	}()
	return ln
}
