package backends

import (
	"context"
	"testing"
	"time"
)

// plainBackend is a Backend without HoldKeeper, recording what is called.
type plainBackend struct {
	Backend
	calls []string
}

func (b *plainBackend) Unlock(context.Context, string, string) (bool, error) {
	b.calls = append(b.calls, "unlock")
	return true, nil
}

func (b *plainBackend) Renew(_ context.Context, _, _ string, ttl time.Duration) (time.Duration, error) {
	b.calls = append(b.calls, "renew")
	return ttl, nil
}

// keeperBackend is plainBackend with HoldKeeper.
type keeperBackend struct {
	plainBackend
}

func (b *keeperBackend) UnlockHold(_ context.Context, _, _ string, mode Mode) (bool, error) {
	b.calls = append(b.calls, "unlock "+mode.String())
	return true, nil
}

func (b *keeperBackend) RenewHold(_ context.Context, _, _ string, mode Mode, ttl time.Duration) (time.Duration, error) {
	b.calls = append(b.calls, "renew "+mode.String())
	return ttl, nil
}

// TestHoldHelpers: UnlockHold and RenewHold go to a backend's HoldKeeper
// with the kind of hold, and to Unlock and Renew on a backend without one.
func TestHoldHelpers(t *testing.T) {
	ctx := context.Background()
	plain, keeper := &plainBackend{}, &keeperBackend{}
	for _, b := range []Backend{plain, keeper} {
		if ok, err := UnlockHold(ctx, b, "k", "t", Read); !ok || err != nil {
			t.Errorf("UnlockHold = %v, %v", ok, err)
		}
		if v, err := RenewHold(ctx, b, "k", "t", Write, time.Second); v != time.Second || err != nil {
			t.Errorf("RenewHold = %v, %v", v, err)
		}
	}
	for _, tc := range []struct {
		name string
		got  []string
		want []string
	}{
		{"without HoldKeeper", plain.calls, []string{"unlock", "renew"}},
		{"with HoldKeeper", keeper.calls, []string{"unlock read", "renew write"}},
	} {
		if len(tc.got) != len(tc.want) || tc.got[0] != tc.want[0] || tc.got[1] != tc.want[1] {
			t.Errorf("%s: calls %q; want %q", tc.name, tc.got, tc.want)
		}
	}
}
