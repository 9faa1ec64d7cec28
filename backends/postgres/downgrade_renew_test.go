package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestDowngradeRenewOfWriteLeaseKeepsReadLease mirrors the RedLock test of
// the same name (README, Commands: "Renewing the write hold (RENEW, or a
// KEEPALIVE watchdog) extends the read hold with it but never shortens
// it"). The token downgrades (write 500 ms, read 10 s) and RENEWs with the
// write lease's 500 ms (as a client renewing its write hold does), then
// keeps or releases the write hold: a writer must stay out for the read
// hold's 10 s. Before, RENEW set both rows to 500 ms.
func TestDowngradeRenewOfWriteLeaseKeepsReadLease(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 4)
	ctx := context.Background()
	const writeTTL, readTTL = 500 * time.Millisecond, 10 * time.Second
	for _, tc := range []struct {
		name   string
		unlock bool
	}{
		{"write hold kept", false},
		{"write hold released after the renewal", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "dr-" + tc.name
			if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "a", TTL: writeTTL}); err != nil {
				t.Fatal(err)
			}
			r, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "a", TTL: readTTL, Mode: backends.Read})
			if err != nil || r.Validity < 5*time.Second {
				t.Fatalf("downgrade = %+v, %v; want a read hold of about 10 s", r, err)
			}
			readGranted := time.Now()
			if v, err := b.Renew(ctx, key, "a", writeTTL); err != nil || v <= 0 {
				t.Fatalf("RENEW of the write lease = %v, %v", v, err)
			}
			if tc.unlock {
				if ok, err := b.Unlock(ctx, key, "a"); !ok || err != nil {
					t.Fatalf("UNLOCK of the write hold = %v, %v", ok, err)
				}
			}
			time.Sleep(writeTTL + 300*time.Millisecond)
			if l, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "b", TTL: 10 * time.Second}); err == nil {
				t.Errorf("writer b granted (fence %d) %v after a's read grant, within its read validity of %v",
					l.Fence, time.Since(readGranted).Round(time.Millisecond), r.Validity.Round(time.Millisecond))
			}
		})
	}
}

// TestRenewOfReadOnlyTokenSetsItsLease: a token holding only a read row
// gets exactly the TTL RENEW asks for, shorter too: the never-shorten rule
// is for a downgrade's read row only, renewed with its write row.
func TestRenewOfReadOnlyTokenSetsItsLease(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 4)
	ctx := context.Background()
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "r", TTL: 10 * time.Second, Mode: backends.Read}); err != nil {
		t.Fatal(err)
	}
	if v, err := b.Renew(ctx, "k", "r", 300*time.Millisecond); err != nil || v <= 0 {
		t.Fatalf("RENEW of the read lease = %v, %v", v, err)
	}
	time.Sleep(500 * time.Millisecond)
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: "w", TTL: time.Second}); err != nil {
		t.Errorf("writer after the reader's RENEW to 300 ms ran out = %v; want granted", err)
	}
}
