package commands

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/relay"
)

// TestConnResetEndsKeepaliveHolds proves that RESET's end of a
// connection's KEEPALIVE holds (keepalives.connReset) is its close's: the
// watchdog releases that connection's holds, and only those (not a loose
// hold, nor another connection's of the same token, which stays renewed),
// the connection no longer counts them toward its bound, and a KEEPALIVE
// lock it takes after the RESET is kept and released on its close as any.
// Before, RESET left the holds renewed for as long as the connection
// lived, for the next user of a pooled connection.
func TestConnResetEndsKeepaliveHolds(t *testing.T) {
	const ttl = 300 * time.Millisecond
	for _, tc := range []struct {
		name     string
		holds    int  // the reset connection's KEEPALIVE holds of k
		loose    bool // a plain hold of k with the token besides
		other    bool // another connection holds k with the token, KEEPALIVE
		releases int  // releases the RESET brings
	}{
		{"only holder", 1, false, false, 1},
		{"reentrant holds", 3, false, false, 3},
		{"loose hold keeps its lease", 1, true, false, 1},
		{"other connection keeps its hold", 2, false, true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &fakeBackend{}
			k := newTestKeepalives(t, b, time.Minute)
			a, o := newTestConn(t, 3), newTestConn(t, 3)
			if !k.start(a.ctx, a.ka, "k", "tok", ttl, 0) {
				t.Fatal("start = false")
			}
			for i := 1; i < tc.holds; i++ {
				if !k.granted(a.ctx, a.ka, "k", "tok") {
					t.Fatal("granted (reentrant) = false")
				}
			}
			if tc.loose && !k.grantedHold(context.Background(), nil, "k", "tok", backends.Write, true) {
				t.Fatal("grantedHold (no KEEPALIVE) = false")
			}
			if tc.other && !k.granted(o.ctx, o.ka, "k", "tok") {
				t.Fatal("granted (other connection) = false")
			}
			k.connReset(a.ka)
			if n := a.ka.live.Load(); n != 0 {
				t.Errorf("the reset connection's keepalive count = %d; want 0 (nothing toward its bound)", n)
			}
			waitFor(t, func() bool { _, u := b.counts(); return u >= tc.releases }, "the RESET's releases")
			if tc.other {
				renews, _ := b.counts()
				waitFor(t, func() bool { r, _ := b.counts(); return len(r) >= len(renews)+2 }, "renewals for the other connection")
				if n := k.count(); n != 1 {
					t.Fatalf("watchdogs after the RESET = %d; want 1, kept for the other connection", n)
				}
				o.cancel()
				waitEnded(t, o)
			}
			waitStopped(t, k)
			want := tc.releases
			if tc.other {
				want++ // the other connection's hold, on its close
			}
			if _, u := b.counts(); u != want {
				t.Errorf("%d releases; want %d (the reset connection's %d KEEPALIVE holds, then the other's on its close; no loose hold)",
					u, want, tc.holds)
			}
			if p := a.pushed(); len(p) != 0 {
				t.Errorf("pushes to the reset connection: %q; want none (nothing was lost)", p)
			}

			// The connection's next KEEPALIVE lock: kept, counted,
			// released on its close.
			_, before := b.counts()
			if !k.start(a.ctx, a.ka, "k2", "tok2", ttl, 0) {
				t.Fatal("start after RESET = false")
			}
			renews, _ := b.counts()
			waitFor(t, func() bool { r, _ := b.counts(); return len(r) >= len(renews)+2 }, "renewals of the lock taken after the RESET")
			if n := a.ka.live.Load(); n != 1 {
				t.Errorf("keepalive count after a lock taken after the RESET = %d; want 1", n)
			}
			a.cancel()
			waitEnded(t, a)
			waitStopped(t, k)
			if _, u := b.counts(); u != before+1 {
				t.Errorf("releases on close of the lock taken after the RESET = %d; want 1", u-before)
			}
		})
	}
}

// TestConnResetDropsLossNotices proves that RESET drops the connection's
// lost-lock notices: the ones waiting, and one whose owners were taken
// before the RESET and that is told after it (a watchdog counts the
// holders under the registry's lock, then tells them without it). Before,
// the next user's LOCK of the key without TOKEN was answered -LOCKLOST
// for a loss it never had.
func TestConnResetDropsLossNotices(t *testing.T) {
	for _, tc := range []struct {
		name  string
		raced bool // the loss is told after the RESET, its owners taken before
	}{
		{"waiting notice", false},
		{"loss told across the RESET", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &fakeBackend{}
			k := newTestKeepalives(t, b, time.Minute)
			a := newTestConn(t, 3)
			if !k.start(a.ctx, a.ka, "k", "tok", time.Minute, 0) {
				t.Fatal("start = false")
			}
			k.mu.Lock()
			w := k.m[heldKey{"k", "tok"}]
			owners := w.owners()
			k.mu.Unlock()
			if !tc.raced {
				k.tell(w, owners, lostRenewFailed, nil, "why")
			}
			k.connReset(a.ka)
			if tc.raced {
				k.tell(w, owners, lostRenewFailed, nil, "why")
			}
			if why, lost := a.ka.takeLost([]byte("k")); lost {
				t.Errorf("a notice (%q) after the RESET; want none: the loss was not the new user's", why)
			}
			a.ka.mu.Lock()
			n := a.ka.nLost
			a.ka.mu.Unlock()
			if n != 0 {
				t.Errorf("notices waiting after the RESET = %d; want 0", n)
			}
			if tc.raced && len(a.pushed()) != 0 {
				t.Errorf("pushes after the RESET: %q; want none", a.pushed())
			}
		})
	}
}

// TestResetEndsKeepaliveLocksOnNodes proves on real redis-server nodes
// what RESET does to the connection's locks, from the client's side: its
// KEEPALIVE locks are released on the nodes within the release bound (a
// pipelined RESET right after the LOCK too), another connection's
// KEEPALIVE hold of the same token stays renewed, a plain lock keeps its
// lease, a notice of a loss before the RESET does not answer the next
// LOCK of the key, no push follows the RESET's reply, a KEEPALIVE lock
// taken after it is kept and released on close, and QUIT still releases
// as a close. Before, the locks stayed renewed for as long as the
// connection lived, and the next LOCK of the key answered -LOCKLOST.
func TestResetEndsKeepaliveLocksOnNodes(t *testing.T) {
	be, nodes := newRealRedLockNodes(t, 3)
	_, c0 := serveHandler(t, be, nil)
	addr := c0.RemoteAddr().String()
	var onNodes []*rawConn
	for _, n := range nodes {
		onNodes = append(onNodes, dialRaw(t, n.Addr))
	}
	// held is how many nodes have key's write lock.
	held := func(t *testing.T, key string) int {
		n := 0
		for _, c := range onNodes {
			if c.do(t, "EXISTS lp:lock:"+key) == ":1" {
				n++
			}
		}
		return n
	}
	// waitHeld waits until want nodes have key's lock: a release (or a
	// grant) is answered once a majority applied it, the last node gets
	// a moment more. within is far below a lease the watchdog renews.
	waitHeld := func(t *testing.T, key string, want int, within time.Duration, why string) {
		t.Helper()
		got := held(t, key)
		for end := time.Now().Add(within); got != want && time.Now().Before(end); {
			time.Sleep(20 * time.Millisecond)
			got = held(t, key)
		}
		if got != want {
			t.Fatalf("%d nodes hold %s after %v; want %d: %s", got, key, within, want, why)
		}
	}
	const releaseWithin = releaseTimeout + time.Second

	t.Run("pipelined RESET releases, RESP3, no push after it", func(t *testing.T) {
		c := dialResetClient(t, addr)
		c.send(t, []string{"HELLO", "3"}, []string{"LOCK", "rk1", "PX", "10000", "KEEPALIVE"}, []string{"RESET"}, []string{"PING"})
		frames := c.replies(t, 4)
		if f := frames[1]; f[0] != '%' {
			t.Fatalf("LOCK rk1 PX 10000 KEEPALIVE = %q; want the lease", f)
		}
		waitHeld(t, "rk1", 0, releaseWithin, "RESET ends the connection's KEEPALIVE lock as its close does")
		// Past two renewal periods of a short lease: nothing told of
		// the released lock, the connection RESP2 now.
		time.Sleep(500 * time.Millisecond)
		c.send(t, []string{"LOCK", "rk1", "PX", "10000"}, []string{"PING"})
		frames = append(frames, c.replies(t, 2)...)
		checkNoPushAfter(t, frames, "+RESET\r\n")
		if f := frames[len(frames)-2]; !bytes.HasPrefix(f, []byte("*6\r\n")) {
			t.Errorf("the next user's LOCK rk1 PX 10000 = %q; want the lease", f)
		}
	})

	t.Run("loss notice before RESET answers nothing after it", func(t *testing.T) {
		c := dialResetClient(t, addr)
		c.send(t, []string{"HELLO", "3"}, []string{"LOCK", "rk2", "PX", "600", "TOKEN", "t", "KEEPALIVE"})
		c.replies(t, 2)
		for _, n := range onNodes {
			n.do(t, "DEL lp:lock:rk2") // the watchdog's next renewal finds it gone
		}
		lost := c.rd.until(t, func(f []byte) bool { return f[0] == '>' })
		if f := lost[len(lost)-1]; !bytes.Contains(f, []byte("lock-lost")) {
			t.Fatalf("push after the lock was deleted = %q; want lock-lost", f)
		}
		c.send(t, []string{"RESET"}, []string{"LOCK", "rk2", "PX", "10000"})
		frames := c.replies(t, 2)
		if f := frames[len(frames)-1]; !bytes.HasPrefix(f, []byte("*6\r\n")) {
			t.Errorf("the next user's LOCK rk2 PX 10000 = %q; want the lease, not the last user's loss", f)
		}
	})

	t.Run("other connection of the token keeps its hold", func(t *testing.T) {
		a, b := dialResetClient(t, addr), dialResetClient(t, addr)
		for _, c := range []*resetClient{a, b} {
			c.send(t, []string{"LOCK", "rk3", "PX", "600", "TOKEN", "t", "KEEPALIVE"})
			if f := c.replies(t, 1)[0]; !bytes.HasPrefix(f, []byte("*6\r\n")) {
				t.Fatalf("LOCK rk3 PX 600 TOKEN t KEEPALIVE = %q; want the lease", f)
			}
		}
		a.send(t, []string{"RESET"})
		a.replies(t, 1)
		time.Sleep(1500 * time.Millisecond) // past two leases
		waitHeld(t, "rk3", 3, time.Second, "the other connection's KEEPALIVE hold is still renewed")
		b.send(t, []string{"UNLOCK", "rk3", "t"})
		if f := b.replies(t, 1)[0]; string(f) != ":1\r\n" {
			t.Fatalf("the other connection's UNLOCK rk3 t = %q; want :1", f)
		}
		waitHeld(t, "rk3", 0, releaseWithin, "the reset connection's hold was released, the other's UNLOCK took the last")
	})

	t.Run("plain lock keeps its lease", func(t *testing.T) {
		c := dialResetClient(t, addr)
		c.send(t, []string{"LOCK", "rk4", "PX", "10000"}, []string{"RESET"})
		c.replies(t, 2)
		time.Sleep(300 * time.Millisecond)
		waitHeld(t, "rk4", 3, time.Second, "a lock without KEEPALIVE keeps its lease through RESET, as through a close")
	})

	t.Run("KEEPALIVE lock after RESET kept, released on close", func(t *testing.T) {
		c := dialResetClient(t, addr)
		c.send(t, []string{"LOCK", "rk5a", "PX", "10000", "KEEPALIVE"}, []string{"RESET"},
			[]string{"LOCK", "rk5", "PX", "600", "KEEPALIVE"})
		frames := c.replies(t, 3)
		if f := frames[2]; !bytes.HasPrefix(f, []byte("*6\r\n")) {
			t.Fatalf("LOCK rk5 PX 600 KEEPALIVE after RESET = %q; want the lease", f)
		}
		waitHeld(t, "rk5a", 0, releaseWithin, "the lock before the RESET released")
		time.Sleep(1500 * time.Millisecond) // past two leases
		waitHeld(t, "rk5", 3, time.Second, "the KEEPALIVE lock taken after RESET is renewed")
		c.conn.Close()
		waitHeld(t, "rk5", 0, releaseWithin, "the KEEPALIVE lock taken after RESET is released on close")
	})

	t.Run("QUIT releases as a close", func(t *testing.T) {
		c := dialResetClient(t, addr)
		c.send(t, []string{"HELLO", "3"}, []string{"LOCK", "rk6", "PX", "10000", "KEEPALIVE"}, []string{"QUIT"})
		frames := c.replies(t, 3)
		if f := frames[2]; string(f) != "+OK\r\n" {
			t.Fatalf("QUIT = %q; want +OK", f)
		}
		waitHeld(t, "rk6", 0, releaseWithin, "QUIT closes the connection, which releases its KEEPALIVE lock")
	})
}

// resetClient is a raw client connection that pipelines commands and
// reads whole frames, pushes among them.
type resetClient struct {
	conn net.Conn
	rd   *frameReader
}

func dialResetClient(t *testing.T, addr string) *resetClient {
	conn := dialTest(t, addr)
	return &resetClient{conn: conn, rd: &frameReader{conn: conn}}
}

// send writes cmds in one write: one pipelined batch.
func (c *resetClient) send(t *testing.T, cmds ...[]string) {
	t.Helper()
	var out []byte
	for _, args := range cmds {
		var cmd [][]byte
		for _, a := range args {
			cmd = append(cmd, []byte(a))
		}
		out = relay.AppendCommand(out, cmd)
	}
	if _, err := c.conn.Write(out); err != nil {
		t.Fatal(err)
	}
}

// replies reads frames up to the nth that is not a push, and returns
// them all, pushes too.
func (c *resetClient) replies(t *testing.T, n int) [][]byte {
	t.Helper()
	seen := 0
	return c.rd.until(t, func(f []byte) bool {
		if f[0] != '>' {
			seen++
		}
		return seen == n
	})
}

// checkNoPushAfter fails when a push comes after the frame first.
func checkNoPushAfter(t *testing.T, frames [][]byte, first string) {
	t.Helper()
	at := -1
	for i, f := range frames {
		if at < 0 && string(f) == first {
			at = i
		}
		if at >= 0 && f[0] == '>' {
			t.Errorf("frame %d, after %q, is a push: %q (all: %q)", i, first, f, frames)
		}
	}
	if at < 0 {
		t.Fatalf("no %q among %q", first, frames)
	}
}
