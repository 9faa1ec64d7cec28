package postgres

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// commitMsg is pgx's tx.Commit: a simple Query message "commit".
var commitMsg = append([]byte{'Q', 0, 0, 0, 11}, "commit\x00"...)

// commitFault is what commitProxy does to one COMMIT it sees: relay it
// (apply: it commits, and the server's replies on that connection are
// dropped from then on, so its reply is lost) or not (it never commits),
// then close every connection and refuse new ones for down. With a hook
// (apply only), the hook runs before the cut, and the outage lasts what it
// returns.
type commitFault struct {
	apply bool
	down  time.Duration
	hook  func() time.Duration
}

// commitProxy relays TCP to a database and, once armed, applies its
// faults to the COMMITs it sees, one each, in order.
type commitProxy struct {
	addr string

	mu        sync.Mutex
	conns     map[net.Conn]struct{}
	armed     bool
	plan      []commitFault
	downUntil time.Time
	done      int
}

func startCommitProxy(t *testing.T, upstream string, plan ...commitFault) *commitProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	px := &commitProxy{addr: ln.Addr().String(), conns: map[net.Conn]struct{}{}, plan: plan}
	var wg sync.WaitGroup
	// toServer relays the client's messages, watching for the COMMIT.
	toServer := func(c, s net.Conn, mute *atomic.Bool) {
		defer wg.Done()
		defer c.Close()
		defer s.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				data := buf[:n]
				i := bytes.Index(data, commitMsg)
				f, hit := px.take(i >= 0)
				if hit && !f.apply {
					data = data[:i] // the COMMIT never reaches the database
				}
				if hit && f.apply {
					// Its reply is lost: one read before the cut would
					// tell the client it committed.
					mute.Store(true)
				}
				if _, werr := s.Write(data); werr != nil {
					return
				}
				if hit {
					down := f.down
					if f.hook != nil {
						down = f.hook()
					}
					px.cut(down)
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	toClient := func(s, c net.Conn, mute *atomic.Bool) {
		defer wg.Done()
		defer c.Close()
		defer s.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := s.Read(buf)
			if n > 0 && !mute.Load() {
				if _, werr := c.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			px.mu.Lock()
			down := time.Now().Before(px.downUntil)
			px.mu.Unlock()
			if down {
				_ = c.Close()
				continue
			}
			s, err := net.DialTimeout("tcp", upstream, 2*time.Second)
			if err != nil {
				_ = c.Close()
				continue
			}
			px.mu.Lock()
			px.conns[c], px.conns[s] = struct{}{}, struct{}{}
			px.mu.Unlock()
			mute := new(atomic.Bool)
			wg.Add(2)
			go toServer(c, s, mute)
			go toClient(s, c, mute)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		px.mu.Lock()
		for c := range px.conns {
			_ = c.Close()
		}
		px.mu.Unlock()
		wg.Wait()
	})
	return px
}

func (px *commitProxy) arm() {
	px.mu.Lock()
	defer px.mu.Unlock()
	px.armed = true
}

// fired is how many faults were applied.
func (px *commitProxy) fired() int {
	px.mu.Lock()
	defer px.mu.Unlock()
	return px.done
}

// take is the fault for a COMMIT seen (commit true), when armed and one is
// left.
func (px *commitProxy) take(commit bool) (commitFault, bool) {
	px.mu.Lock()
	defer px.mu.Unlock()
	if !commit || !px.armed || len(px.plan) == 0 {
		return commitFault{}, false
	}
	f := px.plan[0]
	px.plan = px.plan[1:]
	px.done++
	return f, true
}

// cut closes every connection and refuses new ones for down.
func (px *commitProxy) cut(down time.Duration) {
	px.mu.Lock()
	defer px.mu.Unlock()
	px.downUntil = time.Now().Add(down)
	for c := range px.conns {
		_ = c.Close()
	}
	px.conns = map[net.Conn]struct{}{}
}
