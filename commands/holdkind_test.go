package commands

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/relay"
)

// TestWatchdogKeepsItsKindOfHold: a token may hold a key both for writing
// and for reading (a downgrade), and a watchdog must release and renew
// exactly the kinds of hold it keeps. A watchdog that keeps only a read
// hold (RLOCK … TOKEN t KEEPALIVE after LOCK … TOKEN t without it) must
// renew the read hold, not reset the token's write lease to the read TTL,
// and on its connection's close release the read hold, not the write hold
// UNLOCK's release would take first: the write hold is not tied to that
// connection, and its holder was told it has it for its whole validity.
// Before, the watchdog used Renew and Unlock, which have no kind.
func TestWatchdogKeepsItsKindOfHold(t *testing.T) {
	const ttl = 60 * time.Millisecond
	for _, tc := range []struct {
		name string
		// then runs after the watchdog started with a hold of mode first,
		// on connection c.
		first       backends.Mode
		then        func(k *keepalives, c *testConn)
		renew       string   // the kind every renewal after then is for
		wantUnlocks []string // the releases when c closes
	}{
		{"read hold of a downgrade", backends.Read, func(*keepalives, *testConn) {},
			"read", []string{"read"}},
		{"write hold", backends.Write, func(*keepalives, *testConn) {},
			"write", []string{"write"}},
		// The write renewal carries the read hold along (never shortening
		// it); the close releases each.
		{"write and read KEEPALIVE holds", backends.Write, func(k *keepalives, c *testConn) {
			k.grantedHold(c.ctx, c.ka, "k", "tok", backends.Read, true)
		}, "write", []string{"write", "read"}},
		// A write hold granted without KEEPALIVE while a read watchdog
		// runs keeps the lease it was granted (renewing it with the read
		// TTL would cut it), and is not released with the watchdog: its
		// holder, whose connection may be open, was told that lease
		// (TestKeepaliveCloseSparesLooseHold; before, it was released).
		{"read KEEPALIVE hold, loose write hold", backends.Read, func(k *keepalives, c *testConn) {
			k.grantedHold(context.Background(), nil, "k", "tok", backends.Write, true)
		}, "read", []string{"read"}},
		// UNLOCK releases the write hold: what is left is a read hold.
		{"write hold UNLOCKed, read hold left", backends.Write, func(k *keepalives, c *testConn) {
			k.grantedHold(c.ctx, c.ka, "k", "tok", backends.Read, true)
			op := k.beginUnlock("k", "tok")
			if op == nil || op.mode != backends.Write {
				t.Fatalf("beginUnlock = %+v; want the write hold", op)
			}
			k.endUnlock(op, true, c.ka)
		}, "read", []string{"read"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &fakeBackend{}
			k := newTestKeepalives(t, b, time.Second)
			c := newTestConn(t, 3)
			if !k.startHold(c.ctx, c.ka, "k", "tok", ttl, 0, tc.first, true) {
				t.Fatal("startHold = false")
			}
			tc.then(k, c)
			renews, _ := b.kinds()
			from := len(renews)
			waitFor(t, func() bool { r, _ := b.kinds(); return len(r) >= from+3 }, "three renewals")
			c.cancel()
			waitEnded(t, c)
			waitStopped(t, k)
			renews, unlocks := b.kinds()
			// The renewal under way when then ran may be of the kind before.
			for i, kind := range renews[from+1:] {
				if kind != tc.renew {
					t.Errorf("renewal %d is for a %s hold; want %s (all: %q)", from+1+i, kind, tc.renew, renews)
					break
				}
			}
			if !slices.Equal(unlocks, tc.wantUnlocks) {
				t.Errorf("releases on close = %q; want %q", unlocks, tc.wantUnlocks)
			}
		})
	}
}

// TestLockDelayKeepsItsKindOfHold: a lock-delay set on a watchdog's lock
// when its connection closes is set on the kind of hold it kept: a read
// watchdog's delay must not reset the token's write lease.
func TestLockDelayKeepsItsKindOfHold(t *testing.T) {
	b := &fakeBackend{}
	k := newTestKeepalives(t, b, time.Second)
	k.delayFor = (&Limits{LockDelays: []LockDelay{{Pattern: "k", Delay: 5 * time.Second}}}).lockDelay
	c := newTestConn(t, 3)
	k.startHold(c.ctx, c.ka, "k", "tok", time.Second, 0, backends.Read, true)
	c.cancel()
	waitEnded(t, c)
	waitStopped(t, k)
	renews, unlocks := b.kinds()
	if !slices.Equal(renews, []string{"read"}) || len(unlocks) != 0 {
		t.Errorf("renewals %q, releases %q; want one renewal of the read hold (the delay) and no release", renews, unlocks)
	}
}

// orphanBackend grants a LOCK … WAIT only once its client has gone, so
// that the grant is orphaned.
type orphanBackend struct {
	fakeBackend
}

func (b *orphanBackend) Lock(ctx context.Context, req backends.LockRequest) (backends.Lease, error) {
	<-ctx.Done()
	return backends.Lease{Token: req.Token, Validity: req.TTL, Fence: 1}, nil
}

// TestOrphanGrantReleasesItsKind: a grant that lands after its client
// left is released, and only the kind of hold it added: the orphaned read
// grant of a downgrade must not end the token's write hold, which UNLOCK's
// release would take first. Before, releaseOrphan used Unlock.
func TestOrphanGrantReleasesItsKind(t *testing.T) {
	for _, tc := range []struct {
		cmd  string
		want string
	}{
		{"RLOCK", "read"},
		{"LOCK", "write"},
	} {
		t.Run(tc.cmd, func(t *testing.T) {
			b := &orphanBackend{}
			conn := dialHandler(t, b)
			var cmd [][]byte
			for _, a := range []string{tc.cmd, "k", "PX", "10000", "TOKEN", "t", "WAIT", "5000"} {
				cmd = append(cmd, []byte(a))
			}
			if _, err := conn.Write(relay.AppendCommand(nil, cmd)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond) // the LOCK waits in the backend
			_ = conn.Close()
			waitFor(t, func() bool { _, u := b.kinds(); return len(u) > 0 }, "the orphaned grant released")
			time.Sleep(50 * time.Millisecond)
			if _, u := b.kinds(); !slices.Equal(u, []string{tc.want}) {
				t.Errorf("releases = %q; want %q", u, []string{tc.want})
			}
		})
	}
}

// dialHandler serves a Handler on backend b on a loopback port for the
// test's life and returns a connection to it.
func dialHandler(t *testing.T, b backends.Backend) net.Conn {
	t.Helper()
	_, conn := serveHandler(t, b, nil)
	return conn
}
