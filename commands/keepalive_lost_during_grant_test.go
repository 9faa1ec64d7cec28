package commands

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/resp"
)

// lostDuringGrantBackend grants its first LOCK at once and holds every
// later one until gate is closed (a LOCK … WAIT while a rival holds the
// key); its renewals find nothing until then (the first grant's lock was
// lost) and succeed after.
type lostDuringGrantBackend struct {
	fakeBackend
	gate  chan struct{}
	locks atomic.Int32
	open  atomic.Bool
}

func (b *lostDuringGrantBackend) Lock(ctx context.Context, req backends.LockRequest) (backends.Lease, error) {
	if b.locks.Add(1) > 1 {
		select {
		case <-b.gate:
		case <-ctx.Done():
			return backends.Lease{}, backends.ErrNotAcquired
		}
	}
	return backends.Lease{Token: req.Token, Validity: req.TTL, Fence: uint64(b.locks.Load())}, nil
}

func (b *lostDuringGrantBackend) RenewHold(ctx context.Context, key, token string, mode backends.Mode, ttl time.Duration) (time.Duration, error) {
	if !b.open.Load() {
		return 0, nil
	}
	return b.fakeBackend.RenewHold(ctx, key, token, mode, ttl)
}

// TestLockWithTokenAnsweredForLossDuringIt: "the connection's next UNLOCK
// or RENEW of that key with that token, or LOCK/RLOCK of it with that
// TOKEN … answers -LOCKLOST … once (and is not run)". A LOCK … TOKEN t
// KEEPALIVE that is running (waiting) when the connection's KEEPALIVE
// lock of the key with t is lost is that next command: it must answer
// -LOCKLOST and leave nothing held, not be granted a lock of its own while
// the notice waits for the command after it. Before, the LOCK was granted
// and kept alive by a new watchdog, the UNLOCK after it was answered
// -LOCKLOST and not run, and the new watchdog went on renewing the lock
// the client had UNLOCKed, for as long as the connection lived.
func TestLockWithTokenAnsweredForLossDuringIt(t *testing.T) {
	b := &lostDuringGrantBackend{gate: make(chan struct{})}
	h := NewHandler(Options{Limits: testLimits, Backend: b})
	c := dialRaw(t, serveOn(t, &resp.Server{Handler: h}))
	const key, tok = "lostgrant", "t-lg"
	cmd := "LOCK " + key + " PX 300 TOKEN " + tok + " KEEPALIVE"
	readLease(t, c, cmd, c.do(t, cmd))
	if _, err := c.c.Write([]byte("LOCK " + key + " PX 300 WAIT 10000 TOKEN " + tok + " KEEPALIVE\r\n")); err != nil {
		t.Fatal(err)
	}
	// The first lock's watchdog finds it gone (at its first renewal,
	// 100 ms in) and tells its connection, whose second LOCK waits.
	waitFor(t, func() bool { return counterValue(t, h.keepalive.lost[lostRenewFailed]) == 1 },
		"the first lock's loss")
	time.Sleep(100 * time.Millisecond) // the notice is noted just after the count
	b.open.Store(true)
	close(b.gate)
	got := c.reply(t)
	if got == "*6" {
		for range 6 {
			c.reply(t)
		}
		got = "the lease"
	}
	if !strings.HasPrefix(got, "-LOCKLOST") {
		unlock := c.do(t, "UNLOCK "+key+" "+tok)
		time.Sleep(300 * time.Millisecond)
		t.Errorf("the LOCK … TOKEN %s KEEPALIVE running when the connection's lock of %s with %s was lost = %s; want -LOCKLOST. "+
			"The UNLOCK after it = %q; %d watchdog(s) still running after it", tok, key, tok, got, unlock, h.keepalive.count())
	}
	waitFor(t, func() bool { return h.keepalive.count() == 0 }, "no watchdog left")
	if _, unlocks := b.counts(); unlocks != 1 {
		t.Errorf("%d releases; want 1: the grant answered -LOCKLOST given back", unlocks)
	}
}
