package commands

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/resp"
)

// lostDuringCmdBackend holds the client's RENEW and UNLOCK until gate is
// closed, so that the connection's KEEPALIVE lock can be lost while one
// runs; they then answer renewed and released. The watchdog's renewals
// are fakeBackend's.
type lostDuringCmdBackend struct {
	fakeBackend
	gate     chan struct{}
	entered  chan struct{} // cap 1: the client's RENEW or UNLOCK reached the backend
	renewed  time.Duration
	released bool
}

func (b *lostDuringCmdBackend) hold(ctx context.Context) error {
	b.entered <- struct{}{}
	select {
	case <-b.gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *lostDuringCmdBackend) Renew(ctx context.Context, key, token string, ttl time.Duration) (time.Duration, error) {
	if err := b.hold(ctx); err != nil {
		return 0, err
	}
	return b.renewed, nil
}

func (b *lostDuringCmdBackend) Unlock(ctx context.Context, key, token string) (bool, error) {
	if err := b.hold(ctx); err != nil {
		return false, err
	}
	return b.released, nil
}

// TestLossDuringRenewOrUnlockAnsweredByIt: a connection's KEEPALIVE lock
// is lost (a renewal finds it gone, or MAXHOLD runs out) while the
// client's RENEW or UNLOCK of it runs. "The connection's next UNLOCK or
// RENEW of that key with that token … answers -LOCKLOST": the command
// running when the loss is told is that next command, as a LOCK … TOKEN
// running then is (TestLockWithTokenAnsweredForLossDuringIt), so its
// reply is the notice, and the command after it runs as usual. Only an
// UNLOCK that released the connection's only hold of the lock itself (:1,
// the hold still there) is not told: the client released it, and no notice (no -LOCKLOST later, no
// RESP3 push) may come for a lock it released. Before, the RENEW answered
// :0 or its validity and the UNLOCK :1 or :0, and the notice was left for
// the connection's next lock command on the key: a LOCK … TOKEN taking
// the key again answered -LOCKLOST and was not run, and a RESP3 client
// that had released its lock was pushed that it was lost.
func TestLossDuringRenewOrUnlockAnsweredByIt(t *testing.T) {
	const key, tok = "lostcmd", "t-lc"
	for _, tc := range []struct {
		name string
		// lock: the grant; cmd: the command running when the loss is told.
		lock, cmd  string
		holds      int // KEEPALIVE holds taken (reentrant); 0: one
		reason     lostReason
		renewZero  bool // the watchdog's renewals find the lock gone
		renewed    time.Duration
		released   bool
		wantLost   bool // cmd answers -LOCKLOST (and the push comes)
		wantAnswer string
	}{
		{name: "RENEW, renewal finds the lock gone", lock: "PX 300", cmd: "RENEW " + key + " " + tok + " PX 300",
			reason: lostRenewFailed, renewZero: true, wantLost: true},
		{name: "RENEW, MAXHOLD runs out", lock: "PX 300 MAXHOLD 300", cmd: "RENEW " + key + " " + tok + " PX 300",
			reason: lostMaxHold, renewed: 290 * time.Millisecond, wantLost: true},
		{name: "UNLOCK finding nothing, MAXHOLD runs out", lock: "PX 300 MAXHOLD 300", cmd: "UNLOCK " + key + " " + tok,
			reason: lostMaxHold, wantLost: true},
		{name: "UNLOCK releasing, MAXHOLD runs out", lock: "PX 300 MAXHOLD 300", cmd: "UNLOCK " + key + " " + tok,
			reason: lostMaxHold, released: true, wantAnswer: ":1"},
		// The hold the UNLOCK did not release was lost.
		{name: "UNLOCK releasing one of two holds, MAXHOLD runs out", lock: "PX 300 MAXHOLD 300", holds: 2,
			cmd: "UNLOCK " + key + " " + tok, reason: lostMaxHold, released: true, wantLost: true},
	} {
		for _, proto := range []int{2, 3} {
			t.Run(tc.name+", RESP"+string(rune('0'+proto)), func(t *testing.T) {
				b := &lostDuringCmdBackend{gate: make(chan struct{}), entered: make(chan struct{}, 1),
					renewed: tc.renewed, released: tc.released}
				b.renewZero = tc.renewZero
				h, c := dialProto(t, b, proto)
				readGrant := func(cmd string) { t.Helper(); c.readGrant(t, cmd) }
				for range max(tc.holds, 1) {
					readGrant("LOCK " + key + " " + tc.lock + " TOKEN " + tok + " KEEPALIVE")
				}
				if _, err := c.c.Write([]byte(tc.cmd + "\r\n")); err != nil {
					t.Fatal(err)
				}
				select {
				case <-b.entered:
				case <-time.After(5 * time.Second):
					t.Fatalf("%s did not reach the backend", tc.cmd)
				}
				// The loss is counted once each holder has been told.
				waitFor(t, func() bool { return counterValue(t, h.keepalive.lost[tc.reason]) == 1 }, "the loss")
				close(b.gate)
				got := c.reply(t)
				if tc.wantLost {
					if !strings.HasPrefix(got, "-LOCKLOST") {
						t.Errorf("%s running when its lock was lost = %q; want -LOCKLOST", tc.cmd, got)
					}
					if proto == 3 {
						if push := c.reply(t); push != ">3" {
							t.Fatalf("after %s: %q; want the lock-lost push", tc.cmd, push)
						}
						for range 3 {
							c.reply(t)
						}
					}
				} else if got != tc.wantAnswer {
					t.Errorf("%s running when its lock was lost = %q; want %q", tc.cmd, got, tc.wantAnswer)
				}
				// No push comes for a lock the UNLOCK released, nor a
				// second one: the next reply is PING's.
				if got := c.do(t, "PING"); got != "+PONG" {
					t.Errorf("PING after %s = %q; want +PONG (no further push)", tc.cmd, got)
				}
				// The notice was given (or dropped) once: taking the key
				// again with the token is granted.
				readGrant("LOCK " + key + " PX 300 TOKEN " + tok)
			})
		}
	}
}

// TestUnlockFindingKeepaliveLockGoneLeavesNoLaterNotice: a connection's
// KEEPALIVE lock is gone from the nodes before its watchdog's next
// renewal, and the client UNLOCKs it: the UNLOCK answers :0 (no majority
// holds it), which tells the client it did not hold the lock, and the
// watchdog stops keeping the connection's hold. Before, the watchdog kept
// it, its next renewal found nothing, and the loss was told after the
// client had been answered: a lock-lost push after the :0 on RESP3, and
// on both versions -LOCKLOST for the connection's next lock command on
// the key, such as a LOCK … TOKEN taking it afresh, which was not run.
func TestUnlockFindingKeepaliveLockGoneLeavesNoLaterNotice(t *testing.T) {
	const key, tok = "gonelock", "t-gl"
	for _, proto := range []int{2, 3} {
		t.Run("RESP"+string(rune('0'+proto)), func(t *testing.T) {
			b := &lostDuringCmdBackend{gate: make(chan struct{}), entered: make(chan struct{}, 1)}
			close(b.gate)
			b.renewZero = true // the lock is gone: the renewals find nothing
			h, c := dialProto(t, b, proto)
			readGrant := func(cmd string) { t.Helper(); c.readGrant(t, cmd) }
			// The first renewal comes 100 ms in, after the UNLOCK.
			readGrant("LOCK " + key + " PX 300 TOKEN " + tok + " KEEPALIVE")
			if got := c.do(t, "UNLOCK "+key+" "+tok); got != ":0" {
				t.Errorf("UNLOCK of a lock gone from the nodes = %q; want :0", got)
			}
			// Whatever the watchdog does, it has done it once it ends.
			waitStopped(t, h.keepalive)
			if got := c.do(t, "PING"); got != "+PONG" {
				t.Errorf("PING after the UNLOCK = %q; want +PONG (no lock-lost push for the lock the UNLOCK was answered for)", got)
			}
			readGrant("LOCK " + key + " PX 300 TOKEN " + tok)
			if n := counterValue(t, h.keepalive.lost[lostRenewFailed]); n != 0 {
				t.Errorf("%v losses counted; want none: the UNLOCK told the client", n)
			}
		})
	}
}

// dialProto serves a handler on b and dials it, switched to RESP3 when
// proto is 3.
func dialProto(t *testing.T, b backends.Backend, proto int) (*Handler, *rawConn) {
	t.Helper()
	h := NewHandler(Options{Limits: testLimits, Backend: b})
	c := dialRaw(t, serveOn(t, &resp.Server{Handler: h}))
	if proto == 3 {
		helloRESP3(t, c)
	}
	return h, c
}

// readGrant sends cmd and reads the lease it must answer: token,
// validity_ms and fence, as an array (RESP2) or a map (RESP3).
func (c *rawConn) readGrant(t *testing.T, cmd string) {
	t.Helper()
	if got := c.do(t, cmd); got != "*6" && got != "%3" {
		t.Fatalf("%s = %q; want the lease", cmd, got)
	}
	for range 6 {
		c.reply(t)
	}
}
