package zookeeper

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestLostPartialUnlockAnswerReleasesOneHold: an UNLOCK of one of several
// holds whose write is applied but whose answer is lost (the connection
// given up while it waits) releases exactly one hold, however its client
// goes on: once the instance reconnects it finds its write made and
// answers the release it is. Before, it answered NOQUORUM connection lost
// with the hold already gone, and the client's UNLOCK again released a
// second one: the node lost a hold its holder still counted on (with two
// write holds, the whole lock). The write-to-read case ends the write
// holds of a gated node, a multi that also deletes the gate. A renewal
// through the instance as soon as the session is back (a KEEPALIVE
// watchdog's) waits until the UNLOCK has looked: before, it could change
// the node first, and the UNLOCK, no longer able to tell whether its
// write was made, answered NOQUORUM as before. A reentrant LOCK's lost
// answer is TestLostReentryAnswerLeavesNoHold.
func TestLostPartialUnlockAnswerReleasesOneHold(t *testing.T) {
	t.Parallel() // mostly waits for the connection to be given up
	root := testRoot(t)
	const session = 2 * time.Second // the UNLOCK's connection is given up after 2/3 of it
	b := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	for _, tc := range []struct {
		name         string
		holds        []backends.Mode // taken in this order
		wantW, wantR int64           // left after one UNLOCK
		renewed      bool            // a renewal comes as soon as the session is back
	}{
		{"two write holds", []backends.Mode{backends.Write, backends.Write}, 1, 0, false},
		{"two read holds", []backends.Mode{backends.Read, backends.Read}, 0, 1, false},
		{"write hold and read hold", []backends.Mode{backends.Write, backends.Read}, 0, 1, false},
		{"two write holds renewed meanwhile", []backends.Mode{backends.Write, backends.Write}, 1, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key := "lost-unlock-" + tc.name
			d := startReplyDropper(t, zkAddr)
			a := newBackend(t, []string{d.ln.Addr().String()}, root, session)
			for _, m := range tc.holds {
				mustLock(t, a, key, "A", 30*time.Second, m)
			}
			if tc.renewed {
				a.testBeforeApplied = func() {
					// Waits for the UNLOCK's look, which waits for this:
					// bounded, it gives up.
					_, err := a.RenewHold(ctxT(t, 300*time.Millisecond), key, "A", backends.Write, 30*time.Second)
					t.Logf("renewal while the UNLOCK looks for its write = %v", err)
				}
			}
			d.dropOpen()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ok, err := a.Unlock(ctx, key, "A")
			t.Logf("UNLOCK whose answer was lost = %v, %v", ok, err)
			if err != nil {
				// Not told whether it released: its client tries again.
				waitFor(t, "a reconnected", func() bool { return a.connected.Load() })
				ok, err = a.Unlock(ctxT(t, 10*time.Second), key, "A")
			}
			if err != nil || !ok {
				t.Fatalf("UNLOCK of one of %d holds = %v, %v; want true", len(tc.holds), ok, err)
			}
			if w, r := nodeHolds(t, b, key); w != tc.wantW || r != tc.wantR {
				t.Fatalf("after one UNLOCK told released: %d write and %d read holds; want %d and %d", w, r, tc.wantW, tc.wantR)
			}
		})
	}
}
