package commands

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestToldValidityLessTimeSinceMeasured: the validity a LOCK tells is the
// backend's less the time since the backend measured it (Lease.At), and
// a grant with nothing left is given back and answered nil. Time between
// the backend's answer and the reply (a goroutine's hand-off, a process
// paused) is lease gone by: test/fault's sigstop-lockproxy-past-ttl saw a
// grant told ~1.96 s after a 2.5 s pause, its lease long ended on the
// nodes and a later holder's fence above its own.
func TestToldValidityLessTimeSinceMeasured(t *testing.T) {
	for _, tc := range []struct {
		name     string
		age      time.Duration
		maxTold  time.Duration // the told validity at most; 0: nil
		releases int
	}{
		{"measured now", 0, 2000 * time.Millisecond, 0},
		{"measured 600 ms ago", 600 * time.Millisecond, 1400 * time.Millisecond, 0},
		{"lease ran out meanwhile", 3 * time.Second, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &fakeBackend{leaseAge: tc.age}
			conn := dialHandler(t, b)
			reply := string(do(t, conn, "LOCK", "k", "PX", "2000"))
			if tc.maxTold == 0 {
				if reply != "$-1\r\n" && reply != "_\r\n" {
					t.Fatalf("LOCK whose lease ran out before the reply = %q; want nil", reply)
				}
			} else {
				i := strings.Index(reply, "validity_ms\r\n:")
				if i < 0 {
					t.Fatalf("LOCK = %q; want a grant", reply)
				}
				rest := reply[i+len("validity_ms\r\n:"):]
				ms, err := strconv.Atoi(rest[:strings.Index(rest, "\r\n")])
				if err != nil || ms <= 0 || time.Duration(ms)*time.Millisecond > tc.maxTold {
					t.Errorf("told validity_ms %d (%v); want 1..%v", ms, err, tc.maxTold.Milliseconds())
				}
			}
			b.mu.Lock()
			got := b.unlocks
			b.mu.Unlock()
			if got != tc.releases {
				t.Errorf("releases: %d; want %d (a grant told nothing is given back)", got, tc.releases)
			}
		})
	}
}
