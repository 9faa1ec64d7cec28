package zookeeper

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestNeverUsedContainerRemoved: a LOCK on a key never locked before
// makes the key's container znode first; when the container's create
// is applied but the LOCK fails before its lock node is made under it
// (here the answer is lost), the container must not stay. ZooKeeper
// deletes a container only once it has had a child (unless its servers
// set znode.container.maxNeverUsedIntervalMs, off by default), so such a
// container stayed for good: one znode per key for every such failure,
// memory on the ensemble growing with the keys. Once with the connection
// given up while the LOCK waits for the answer, once with the client
// gone (context done) before that; for a write and a read lock.
func TestNeverUsedContainerRemoved(t *testing.T) {
	t.Parallel() // mostly waits for the connection to be given up
	root := testRoot(t)
	const session = 2 * time.Second // the LOCK's connection is given up after 2/3 of it
	b := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	for _, tc := range []struct {
		name string
		ctx  time.Duration // the LOCK's context
		mode backends.Mode
	}{
		{"connection given up", 30 * time.Second, backends.Write},
		{"context ends first", 300 * time.Millisecond, backends.Write},
		{"read lock", 30 * time.Second, backends.Read},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "never-used-" + strings.ReplaceAll(tc.name, " ", "-")
			dir := keyDir(root, key)
			d := startContainerAnswerDropper(t, zkAddr)
			a := newBackend(t, []string{d.ln.Addr().String()}, root, session)
			ctx, cancel := context.WithTimeout(context.Background(), tc.ctx)
			defer cancel()
			if l, err := a.Lock(ctx, backends.LockRequest{Key: key, Token: "A", TTL: 30 * time.Second, Mode: tc.mode}); err == nil {
				t.Fatalf("LOCK whose container's answer was lost = %+v; want an error", l)
			}
			if !d.dropped() {
				t.Fatal("no createContainer request went through the dropper")
			}
			// The container was made: the server applied the request.
			waitFor(t, "the container made", func() bool {
				ok, _, err := b.conn.Exists(dir)
				return err == nil && ok
			})
			deadline := time.Now().Add(4 * session)
			for {
				ok, st, err := b.conn.Exists(dir)
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%v after the failed LOCK, its never-used container is still there (children %d, cversion %d)",
						4*session, st.NumChildren, st.Cversion)
				}
				time.Sleep(20 * time.Millisecond)
			}
			// The key works as before (through the other instance: a's
			// connections lose every answer from a container's create on).
			mustLock(t, b, key, "B", time.Second, backends.Write)
			unlock(t, b, key, "B")
		})
	}
}

// containerAnswerDropper relays a ZooKeeper client's connections to up,
// and on each connection drops every reply from the first createContainer
// request on: the container is made, and its creator never hears of it.
type containerAnswerDropper struct {
	ln net.Listener
	mu sync.Mutex
	n  int // connections whose replies are being dropped
}

func (d *containerAnswerDropper) dropped() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n > 0
}

func startContainerAnswerDropper(t *testing.T, up string) *containerAnswerDropper {
	d := &containerAnswerDropper{}
	d.ln = startRelay(t, up, func(c, s net.Conn) {
		var dropping sync.Once
		drop := make(chan struct{})
		done := make(chan struct{})
		defer func() { <-done }() // after the closes below
		defer c.Close()
		defer s.Close()
		go func() { // requests: forwarded frame by frame, watched for opCreateContainer
			defer close(done)
			defer s.Close()
			defer c.Close()
			first := true // the connect request has no request header
			for {
				frame, err := readFrame(c)
				if err != nil {
					return
				}
				if !first && len(frame) >= 12 && int32(binary.BigEndian.Uint32(frame[8:12])) == 19 {
					dropping.Do(func() {
						d.mu.Lock()
						d.n++
						d.mu.Unlock()
						close(drop)
					})
				}
				first = false
				if _, err := s.Write(frame); err != nil {
					return
				}
			}
		}()
		buf := make([]byte, 32<<10) // replies: forwarded until the drop begins
		for {
			k, err := s.Read(buf)
			select {
			case <-drop:
				k = 0
			default:
			}
			if k > 0 {
				if _, err := c.Write(buf[:k]); err != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
	return d
}

// readFrame reads one length-prefixed ZooKeeper frame, prefix included.
func readFrame(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > 1<<22 {
		return nil, errors.New("frame too large")
	}
	frame := make([]byte, 4+n)
	copy(frame, hdr[:])
	_, err := io.ReadFull(r, frame[4:])
	return frame, err
}
