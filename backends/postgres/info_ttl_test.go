package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestInfoTTLNotAboveValidity: LOCKINFO's ttl_ms (the key's and each
// holder's) must never exceed what the holder may still rely on, as on
// RedLock (TestInfoTTLNotAboveHonoured) and ZooKeeper
// (TestInfoTTLCappedBySession). A client that reads ttl_ms to decide how
// long it may still act would otherwise act past its lease. The bound is
// counted from the grant's reply (the row's lease began before it, at the
// INSERT): the lease left then, less the drift allowance for that span,
// plus 1 ms for the rounding to whole milliseconds.
func TestInfoTTLNotAboveValidity(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 4)
	ctx := context.Background()
	for _, tt := range []struct {
		name string
		mode backends.Mode
		ttl  time.Duration
	}{
		{"write 10 s", backends.Write, 10 * time.Second},
		{"read 10 s", backends.Read, 10 * time.Second},
		{"write 60 s", backends.Write, 60 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			key := "info-ttl-" + tt.name
			if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "A", TTL: tt.ttl, Mode: tt.mode}); err != nil {
				t.Fatal(err)
			}
			told := time.Now()
			info, ok, err := b.Info(ctx, key)
			if err != nil || !ok {
				t.Fatalf("Info = %+v, %v, %v", info, ok, err)
			}
			left := tt.ttl - time.Since(told)
			relied := left - time.Duration(float64(left)*b.cfg.DriftFactor) - b.cfg.DriftMin + time.Millisecond
			if info.TTL > relied {
				t.Errorf("LOCKINFO ttl_ms = %v; the lease has at most %v left, %v after the drift allowance", info.TTL, left, relied)
			}
			for _, h := range info.Holders {
				if h.TTL > relied {
					t.Errorf("LOCKINFO holder ttl_ms = %v; the lease has at most %v left, %v after the drift allowance", h.TTL, left, relied)
				}
			}
		})
	}
}
