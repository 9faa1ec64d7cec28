package commands

import (
	"strconv"
	"testing"
	"time"
)

// TestAuthLimiter: failed authentications per address get a burst of
// authFailBurst, then authFailRate a second; other addresses are not held
// back; past authFailAddrs addresses, new ones share one budget until the
// old ones are paid back and forgotten.
func TestAuthLimiter(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	var a authLimiter
	for i := 0; i < authFailBurst; i++ {
		if !a.allowed("10.0.0.1", t0) {
			t.Fatalf("attempt %d within the burst refused", i)
		}
		a.failed("10.0.0.1", t0)
	}
	// One more failure, as when the pay-back let one attempt through:
	// 21 spent, so the next attempt waits for 1.x of them to be paid back.
	a.failed("10.0.0.1", t0)
	for _, tc := range []struct {
		name string
		from string
		at   time.Duration
		want bool
	}{
		{"burst spent", "10.0.0.1", 0, false},
		{"another address", "10.0.0.2", 0, true},
		{"not yet paid back below the burst", "10.0.0.1", 99 * time.Millisecond, false},
		{"paid back below the burst", "10.0.0.1", 101 * time.Millisecond, true},
	} {
		if got := a.allowed(tc.from, t0.Add(tc.at)); got != tc.want {
			t.Errorf("%s: allowed(%s, +%v) = %v; want %v", tc.name, tc.from, tc.at, got, tc.want)
		}
	}

	var b authLimiter
	for i := 0; i < authFailAddrs; i++ {
		b.failed("10.1."+strconv.Itoa(i/256)+"."+strconv.Itoa(i%256), t0)
	}
	for i := 0; i < authFailBurst; i++ {
		b.failed("192.0.2."+strconv.Itoa(i), t0) // new addresses, all on the shared budget
	}
	if b.allowed("192.0.2.250", t0) {
		t.Error("a new address past the table's bound was allowed with the shared budget spent")
	}
	if !b.allowed("10.1.0.1", t0) {
		t.Error("a tracked address with one failure was refused")
	}
	// A second later every tracked address is paid back: a new one gets
	// a bucket of its own again.
	if !b.allowed("192.0.2.251", t0.Add(time.Second)) || len(b.m) > authFailAddrs {
		t.Errorf("after the pay-back: %d addresses tracked; want room for new ones", len(b.m))
	}
}
