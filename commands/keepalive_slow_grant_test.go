package commands

import (
	"bufio"
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/relay"
)

// slowGrantBackend answers a LOCK after delay with the validity told: a
// grant whose reply was slow (a slow COMMIT, a slow quorum) is worth
// less than its TTL, as its lease began when the LOCK was sent.
type slowGrantBackend struct {
	fakeBackend
	delay, validity time.Duration
}

func (b *slowGrantBackend) Lock(ctx context.Context, req backends.LockRequest) (backends.Lease, error) {
	time.Sleep(b.delay)
	return backends.Lease{Token: req.Token, Validity: b.validity, Fence: 1}, nil
}

// TestKeepaliveSlowGrantRenewsWithinValidity: a KEEPALIVE lock whose grant
// told a validity shorter than TTL/3 must be renewed before that validity
// runs out, counted from the reply: the holder relies on it until told it
// is lost, and its lease may end then. A grant with its whole validity is
// renewed first at TTL/3, as always. Before, the watchdog renewed first
// TTL/3 after the reply whatever the validity, after the lease had ended.
func TestKeepaliveSlowGrantRenewsWithinValidity(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cmd      string
		kind     string // of the renewal
		delay    time.Duration
		validity time.Duration
		// the first renewal's window, from the reply
		from, until time.Duration
	}{
		{"LOCK, slow grant with 400 ms of 3 s left", "LOCK", "write", 300 * time.Millisecond, 400 * time.Millisecond, 0, 400 * time.Millisecond},
		{"RLOCK, slow grant with 400 ms of 3 s left", "RLOCK", "read", 300 * time.Millisecond, 400 * time.Millisecond, 0, 400 * time.Millisecond},
		{"LOCK, quick grant: first renewal at TTL/3", "LOCK", "write", 0, 2950 * time.Millisecond, 900 * time.Millisecond, 1600 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &slowGrantBackend{delay: tc.delay, validity: tc.validity}
			conn := dialHandler(t, b)
			defer conn.Close()
			var cmd [][]byte
			for _, a := range []string{tc.cmd, "k", "PX", "3000", "TOKEN", "t", "KEEPALIVE"} {
				cmd = append(cmd, []byte(a))
			}
			if _, err := conn.Write(relay.AppendCommand(nil, cmd)); err != nil {
				t.Fatal(err)
			}
			_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			line, err := bufio.NewReader(conn).ReadString('\n')
			told := time.Now()
			if err != nil || line[0] != '*' {
				t.Fatalf("%s reply = %q, %v; want the lease", tc.cmd, line, err)
			}
			waitFor(t, func() bool { r, _ := b.counts(); return len(r) > 0 }, "the first renewal")
			renews, _ := b.counts()
			at := renews[0].at.Sub(told)
			if at < tc.from || at > tc.until || renews[0].kind != tc.kind {
				t.Errorf("first renewal (%s) %v after the reply that told validity %v of PX 3000; want a %s renewal within [%v, %v]",
					renews[0].kind, at.Round(time.Millisecond), tc.validity, tc.kind, tc.from, tc.until)
			}
		})
	}
}

// TestRenewAfter: the next renewal comes at the period, or halfway through
// a shorter validity told, never at a negative delay.
func TestRenewAfter(t *testing.T) {
	const period = time.Second
	for _, tc := range []struct {
		validity, want time.Duration
	}{
		{2950 * time.Millisecond, period},
		{2 * period, period},
		{800 * time.Millisecond, 400 * time.Millisecond},
		{0, 0},
		{-time.Second, 0},
	} {
		if got := renewAfter(period, tc.validity); got != tc.want {
			t.Errorf("renewAfter(%v, %v) = %v; want %v", period, tc.validity, got, tc.want)
		}
	}
}
