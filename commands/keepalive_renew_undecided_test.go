package commands

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/backends/redis"
	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/resp"
)

// renewAppliedNoAnswer is a RedLock backend over real nodes whose Renew
// sets the lease on the nodes but answers an error, as a RENEW does when
// the nodes that applied it answered after its timeout: NOQUORUM, though a
// majority has the new lease.
// With zero set, it answers 0 instead, as RENEW does when the renewal
// reached a majority too late to leave 1 ms of validity.
type renewAppliedNoAnswer struct {
	*redis.Backend
	zero bool
}

func (b renewAppliedNoAnswer) Renew(ctx context.Context, key, token string, ttl time.Duration) (time.Duration, error) {
	if _, err := b.Backend.Renew(ctx, key, token, ttl); err != nil {
		return 0, err
	}
	if b.zero {
		return 0, nil
	}
	return 0, fmt.Errorf("renew of %q: %w", key, quorum.ErrNoQuorum)
}

// TestKeepaliveRenewsAfterUndecidedRenew: a RENEW of a KEEPALIVE lock that
// answers NOQUORUM may have set its lease on a majority all the same (the
// nodes that applied it answered late): "-NOQUORUM … when failed nodes
// leave it undecided (a KEEPALIVE lock is then retried, not dropped)". The
// holder relies on the watchdog, which must renew within that lease, as it
// does after a RENEW that answered. Before, only an answered RENEW woke the
// watchdog: a RENEW PX 1000 of a PX 9000 KEEPALIVE lock that answered
// NOQUORUM left the lease at 1 s on the nodes while the watchdog slept
// until its next renewal, 3 s after the grant, and a rival was granted the
// key meanwhile, the holder told nothing.
func TestKeepaliveRenewsAfterUndecidedRenew(t *testing.T) {
	t.Run("NOQUORUM", func(t *testing.T) { renewsAfterUndecidedRenew(t, false, "-NOQUORUM") })
	// A RENEW answered 0 ("when the renewal would leave under 1 ms") may
	// have set a lease too short to count on on a majority too, while the
	// lock's KEEPALIVE holder may be another connection of the client's.
	t.Run("answered 0", func(t *testing.T) { renewsAfterUndecidedRenew(t, true, ":0") })
}

func renewsAfterUndecidedRenew(t *testing.T, zero bool, want string) {
	be := newRealRedLock(t, 3)
	h := NewHandler(Options{Limits: testLimits, Backend: renewAppliedNoAnswer{be, zero}})
	addr := serveOn(t, &resp.Server{Handler: h})
	c, pooled := dialRaw(t, addr), dialRaw(t, addr)
	const key, tok = "undecided", "t-und"
	cmd := "LOCK " + key + " PX 9000 TOKEN " + tok + " KEEPALIVE"
	readLease(t, c, cmd, c.do(t, cmd))
	sent := time.Now()
	if got := pooled.do(t, "RENEW "+key+" "+tok+" PX 1000"); !strings.HasPrefix(got, want) {
		t.Fatalf("RENEW = %q; want %s (the backend answers so)", got, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// From past the RENEW's lease to well before the watchdog's own next
	// renewal (3 s after the grant), no rival may get the key.
	time.Sleep(time.Until(sent.Add(1300 * time.Millisecond)))
	for i := 0; time.Now().Before(sent.Add(2500 * time.Millisecond)); i++ {
		if i > 50 {
			t.Fatal("more than 50 rounds")
		}
		l, err := be.Lock(ctx, backends.LockRequest{Key: key, Token: "rival", TTL: 5 * time.Second, Mode: backends.Write, NoReentry: true})
		if err == nil {
			t.Fatalf("a rival was granted the key (fence %d) %v after a RENEW PX 1000 that answered %s, while the KEEPALIVE holder's connection is open and was told nothing",
				l.Fence, time.Since(sent).Round(time.Millisecond), want)
		}
		if !errors.Is(err, backends.ErrNotAcquired) {
			t.Logf("rival attempt: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := c.do(t, "UNLOCK "+key+" "+tok); got != ":1" {
		t.Errorf("the holder's UNLOCK = %q; want :1 (still held, kept alive)", got)
	}
}
