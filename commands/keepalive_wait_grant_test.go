package commands

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/relay"
)

// waitedGrantBackend grants a LOCK … WAIT after waiting delay (the lock
// was held by someone else meanwhile), with the whole validity of a quick
// last attempt: the lease began at the attempt, not when the WAIT began.
type waitedGrantBackend struct {
	fakeBackend
	delay time.Duration
}

func (b *waitedGrantBackend) Lock(ctx context.Context, req backends.LockRequest) (backends.Lease, error) {
	time.Sleep(b.delay)
	return backends.Lease{Token: req.Token, Validity: req.TTL - 5*time.Millisecond, Fence: 1}, nil
}

// TestKeepaliveAfterLongWaitRetriesFailedRenewal: a KEEPALIVE lock granted
// after a WAIT longer than its TTL has its whole lease left; a first
// renewal that fails once (a node timeout) must be retried within that
// lease, as it is for a lock granted at once (README: "A renewal that errs
// is retried while the lease it extends has time left"). Before, the
// watchdog counted the lease from when Backend.Lock was called, the start
// of the wait, so it took the just-granted lease for spent and gave the
// lock up as lost at the first failed renewal.
func TestKeepaliveAfterLongWaitRetriesFailedRenewal(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delay time.Duration // how long the WAIT waited before the grant
	}{
		{"granted at once", 0},
		{"granted after waiting 1.5 s (> TTL)", 1500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &waitedGrantBackend{delay: tc.delay}
			b.renewErr, b.failFirst = errors.New("node timeout"), 1
			conn := dialHandler(t, b)
			defer conn.Close()
			send := func(line string) string {
				t.Helper()
				var cmd [][]byte
				for _, a := range strings.Fields(line) {
					cmd = append(cmd, []byte(a))
				}
				if _, err := conn.Write(relay.AppendCommand(nil, cmd)); err != nil {
					t.Fatal(err)
				}
				return string(readFrames(t, conn, 1)[0])
			}
			if got := send("LOCK k PX 600 WAIT 5000 TOKEN t KEEPALIVE"); got[0] != '*' && got[0] != '%' {
				t.Fatalf("LOCK reply %q; want the lease", got)
			}
			// First renewal at TTL/3 (200 ms, fails), its retry ~33 ms
			// later, then every 200 ms: 3 renewals by 700 ms when kept.
			for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
				if r, _ := b.counts(); len(r) >= 3 {
					break
				}
			}
			renews, _ := b.counts()
			if got := send("RENEW k t PX 600"); strings.HasPrefix(got, "-LOCKLOST") || len(renews) < 3 {
				t.Errorf("%d renewals, then RENEW = %q; want the failed first renewal retried and the lock kept",
					len(renews), strings.TrimSpace(got))
			}
		})
	}
}

// TestGrantSent: the lease of a grant is counted from no later than its
// granting attempt's send (the reply less what the validity told lacks of
// the TTL), never from before the LOCK began nor after the reply.
func TestGrantSent(t *testing.T) {
	start := time.Unix(1000, 0)
	const ttl = 600 * time.Millisecond
	for _, tc := range []struct {
		name     string
		elapsed  time.Duration // from start to the grant's reply
		validity time.Duration
		want     time.Duration // after start
	}{
		{"quick grant", 5 * time.Millisecond, ttl - 5*time.Millisecond, 0},
		{"slow grant: from the LOCK's start", 300 * time.Millisecond, 250 * time.Millisecond, 0},
		{"after a 1.5 s WAIT: from the last attempt", 1500 * time.Millisecond, ttl - 5*time.Millisecond, 1495 * time.Millisecond},
		{"after a WAIT, a slow last attempt", 1500 * time.Millisecond, 200 * time.Millisecond, 1100 * time.Millisecond},
		{"validity above the TTL: at the reply at the latest", 1500 * time.Millisecond, 2 * ttl, 1500 * time.Millisecond},
		{"the least validity", 1500 * time.Millisecond, time.Millisecond, 901 * time.Millisecond},
	} {
		got := grantSent(start, start.Add(tc.elapsed), ttl, tc.validity).Sub(start)
		if got != tc.want {
			t.Errorf("%s: grantSent = start+%v; want start+%v", tc.name, got, tc.want)
		}
	}
}
