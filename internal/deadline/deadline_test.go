package deadline

import (
	"net"
	"testing"
	"time"
)

// recorder is a net.Conn that records the write deadlines set on it.
type recorder struct {
	net.Conn
	set []time.Time
}

func (r *recorder) SetWriteDeadline(t time.Time) error {
	r.set = append(r.set, t)
	return nil
}

func TestWriteArm(t *testing.T) {
	const timeout = 30 * time.Second
	for _, tc := range []struct {
		name    string
		last    time.Duration // the deadline set last, from now; 0: none
		wantSet bool
	}{
		{"none yet", 0, true},
		{"fresh", timeout - 100*time.Millisecond, false},
		{"just under a second old", timeout - 900*time.Millisecond, false},
		{"over a second old", timeout - 1100*time.Millisecond, true},
		{"passed", -time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &recorder{}
			var w Write
			if tc.last != 0 {
				w.at = time.Now().Add(tc.last)
			}
			before := time.Now()
			w.Arm(c, timeout)
			if got := len(c.set) == 1; got != tc.wantSet {
				t.Fatalf("deadline set: %v; want %v", got, tc.wantSet)
			}
			if tc.wantSet && (c.set[0].Before(before.Add(timeout)) || c.set[0].After(time.Now().Add(timeout))) {
				t.Errorf("deadline %v; want timeout from now", c.set[0])
			}
		})
	}
}

func TestWriteSetThenArm(t *testing.T) {
	c := &recorder{}
	var w Write
	w.Set(c, time.Now().Add(time.Second)) // a short bound for one write
	w.Arm(c, 30*time.Second)              // the next write must get its full timeout
	if len(c.set) != 2 {
		t.Fatalf("deadlines set: %v; want 2", c.set)
	}
}
