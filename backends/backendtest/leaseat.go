package backendtest

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// RunLeaseTellsWhenMeasured checks that every kind of grant says when its
// validity was measured (Lease.At, inside the call): LOCK's reply takes
// the time from then off what it tells (commands: toldValidity), so a
// backend that leaves At zero tells the whole validity however long the
// grant took to come back after the measure (a pause of the process, a
// slow hand-off between goroutines). For each
// grant, a fresh write, a reentry, a fresh read and a read reentry, At
// must fall between the call and its return, and the validity must not
// exceed the TTL.
func RunLeaseTellsWhenMeasured(t *testing.T, ctx context.Context, b backends.Backend) {
	const ttl = 10 * time.Second
	for _, c := range []struct {
		name string
		mode backends.Mode
	}{
		{"write", backends.Write},
		{"read", backends.Read},
	} {
		t.Run(c.name, func(t *testing.T) {
			key := "at-" + c.name
			for _, grant := range []string{"fresh", "reentrant"} {
				start := time.Now()
				l, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "t", TTL: ttl, Mode: c.mode})
				end := time.Now()
				if err != nil {
					t.Fatalf("%s LOCK %s: %v", grant, key, err)
				}
				if l.At.Before(start) || l.At.After(end) {
					t.Errorf("%s %s grant: At = %v; want between the call (%v) and its return (%v)",
						grant, c.name, l.At.Format(time.StampMicro), start.Format(time.StampMicro), end.Format(time.StampMicro))
				}
				if l.Validity <= 0 || l.Validity > ttl {
					t.Errorf("%s %s grant: validity %v; want within (0, %v]", grant, c.name, l.Validity, ttl)
				}
			}
			for range 2 {
				if _, err := b.Unlock(ctx, key, "t"); err != nil {
					t.Errorf("UNLOCK %s: %v", key, err)
				}
			}
		})
	}
}
