package commands

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// cappedValidityBackend renews with a validity far below the TTL asked for,
// as the ZooKeeper backend does when the TTL is above the session's
// horizon (validity = min(ttl, horizon) - elapsed - drift), and fails
// every renewal after the first okRenews (the instance cut off from the
// ensemble: the session, and the lock node with it, ends one horizon
// after the last round trip that reached a server). A failing renewal
// answers after fail, or when its context ends.
type cappedValidityBackend struct {
	fakeBackend
	validity time.Duration
	okRenews int
	fail     time.Duration

	mu     sync.Mutex
	n      int
	lastOK time.Time // when the last successful renewal was sent
}

func (b *cappedValidityBackend) RenewHold(ctx context.Context, key, token string, mode backends.Mode, ttl time.Duration) (time.Duration, error) {
	sent := time.Now()
	b.mu.Lock()
	b.n++
	if b.n <= b.okRenews {
		b.lastOK = sent
		b.mu.Unlock()
		return b.validity, nil
	}
	b.mu.Unlock()
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(b.fail):
	}
	return 0, fmt.Errorf("extend: %w", quorum.ErrNoQuorum)
}

// TestRenewalRetriesEndWithAnsweredValidity proves that the watchdog
// tells a loss within the validity the lock store last answered, not
// within the TTL asked for: when that validity is far below the TTL
// (ZooKeeper: capped by the session's horizon), failed renewals are not
// retried past it, and a try that hangs is cut at its end. Before, the
// retries ran while lastOK + 0.9×TTL left time, and the holder was told
// of the loss long after the lock store said it could be counted on, when
// a rival on another instance may have been granted it.
func TestRenewalRetriesEndWithAnsweredValidity(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail time.Duration // how long a failing renewal takes to answer
	}{
		{"renewals fail fast", 20 * time.Millisecond},
		{"renewals hang to their timeout", time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const ttl = 3 * time.Second
			const validity = 300 * time.Millisecond // what the backend says each lease may be counted on
			b := &cappedValidityBackend{validity: validity, okRenews: 2, fail: tc.fail}
			k := newTestKeepalives(t, b, time.Minute)
			c := newTestConn(t, 3)
			if !k.startGrant(c.ctx, c.ka, "k", "tok", ttl, 0, backends.Write, true,
				grantTiming{sent: time.Now(), validity: validity}) {
				t.Fatal("startGrant = false")
			}
			told := waitEnded(t, c)
			waitStopped(t, k)
			b.mu.Lock()
			end := b.lastOK.Add(validity)
			b.mu.Unlock()
			if len(c.pushed()) != 1 {
				t.Fatalf("pushes %q; want one lock-lost push", c.pushed())
			}
			// waitEnded polls every 10 ms.
			if told.After(end.Add(15 * time.Millisecond)) {
				t.Errorf("holder told the lock is lost %v after the validity the last successful renewal answered (%v) had ended",
					told.Sub(end).Round(time.Millisecond), validity)
			}
		})
	}
}
