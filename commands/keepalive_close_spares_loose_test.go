package commands

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestKeepaliveCloseSparesLooseHold proves that the close of the last
// KEEPALIVE holder's connection releases only the KEEPALIVE holds its
// watchdog counts, not a hold of the same token granted without KEEPALIVE
// (a loose hold: another connection's plain LOCK … TOKEN t, still open,
// whose holder was told a validity of its own and sent no UNLOCK). Before,
// the watchdog's end released the loose hold with the rest, and a rival
// could be granted the key within the validity that holder was told.
func TestKeepaliveCloseSparesLooseHold(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode backends.Mode // the loose hold's kind
	}{
		{"loose write hold", backends.Write},
		{"loose read hold beside a write KEEPALIVE hold", backends.Read},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &fakeBackend{}
			k := newTestKeepalives(t, b, time.Minute)
			a := newTestConn(t, 3)
			if !k.start(a.ctx, a.ka, "k", "tok", 300*time.Millisecond, 0) {
				t.Fatal("start = false")
			}
			if !k.grantedHold(context.Background(), nil, "k", "tok", tc.mode, true) {
				t.Fatal("grantedHold (no KEEPALIVE) = false; want the plain hold counted as loose")
			}
			a.cancel()
			waitEnded(t, a)
			waitStopped(t, k)
			if _, unlocks := b.kinds(); len(unlocks) != 1 || unlocks[0] != "write" {
				t.Errorf("releases on the KEEPALIVE holder's close: %q; want only its own write hold (the loose %v hold keeps its lease)",
					unlocks, tc.mode)
			}
		})
	}
}
