package redis

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestStaleDialErrorNotReplayed: a writer's connection is made in the
// background (writer.get). When the operation that started it gives up
// first and the dial then fails, that failure must not be the answer of
// an operation queued long after, once the node answers again: it says
// nothing of the node as it is then, and costs that operation its vote.
func TestStaleDialErrorNotReplayed(t *testing.T) {
	harness.RequireBinary(t, "redis-server", "redis-server")
	r := harness.StartRedis(t, harness.RedisOptions{})
	p := newHoleProxy(t, r.Addr)
	p.holed.Store(true)
	n := NewNode(NodeConfig{Addr: p.ln.Addr().String(), KeyPrefix: "lp:", Timeout: 100 * time.Millisecond,
		DialTimeout: 300 * time.Millisecond, Metrics: NewMetrics(nil)})
	t.Cleanup(func() { n.Close() })

	// The node does not answer: the operation gives up at its node
	// timeout; the dial it started runs on to its dial timeout and fails.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_, err := n.Release(ctx, "k", "t", quorum.AnyHold)
	cancel()
	if err == nil {
		t.Fatal("release through a blackholed node succeeded")
	}
	time.Sleep(500 * time.Millisecond) // the dial has failed by now
	p.holed.Store(false)
	time.Sleep(200 * time.Millisecond)

	// The node answers again: the next operation should reach it.
	ctx, cancel = context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	ok, err := n.Release(ctx, "k", "t", quorum.AnyHold)
	if err != nil {
		t.Fatalf("release with the node answering again: %v (ok %v); want it sent, not the earlier dial's failure", err, ok)
	}
}

// holeProxy accepts connections; while holed it never answers them,
// else it relays them to the server.
type holeProxy struct {
	ln    net.Listener
	holed atomic.Bool
}

func newHoleProxy(t *testing.T, server string) *holeProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holeProxy{ln: ln}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			if p.holed.Load() {
				continue // read nothing, answer nothing
			}
			s, err := net.Dial("tcp", server)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, s)
			mu.Unlock()
			go func() { _, _ = io.Copy(s, c) }()
			go func() { _, _ = io.Copy(c, s) }()
		}
	}()
	return p
}
