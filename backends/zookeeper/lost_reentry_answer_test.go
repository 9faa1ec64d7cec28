package zookeeper

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestLostReentryAnswerLeavesNoHold: a reentrant LOCK whose write is
// applied but whose answer is lost (the connection given up while it
// waits) adds no hold its client is not told of: once the instance
// reconnects it finds its write made, and answers it as the grant it is,
// or, too late to be of use (as here: the wait for the connection outlasts
// the session's horizon), takes the hold back and answers not acquired.
// Before, it answered NOQUORUM connection lost and left the node with one
// hold more than the holder was told of: after the holder's UNLOCK of
// every hold it had, the key stayed held until the lease ended (30 s
// here). A renewal through the instance as soon as the session is back (a
// KEEPALIVE watchdog's) waits until the LOCK has looked: before, it could
// change the node first, and the LOCK, no longer able to tell whether its
// write was made, left the hold as before. A first grant's lost create is
// cleaned up by its nonce (TestLostCreateAnswerLeavesNoNode).
func TestLostReentryAnswerLeavesNoHold(t *testing.T) {
	t.Parallel() // mostly waits for the connection to be given up
	root := testRoot(t)
	const session = 2 * time.Second // the LOCK's connection is given up after 2/3 of it
	b := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	for _, tc := range []struct {
		name    string
		renewed bool // a renewal comes as soon as the session is back
	}{
		{"alone", false},
		{"renewed meanwhile", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key := "lost-reentry-" + strings.ReplaceAll(tc.name, " ", "-")
			d := startReplyDropper(t, zkAddr)
			a := newBackend(t, []string{d.ln.Addr().String()}, root, session)
			mustLock(t, a, key, "A", 30*time.Second, backends.Write)
			told := 1 // holds the holder was told of
			if tc.renewed {
				a.testBeforeApplied = func() {
					// Waits for the LOCK's look, which waits for this: bounded,
					// it gives up.
					_, err := a.RenewHold(ctxT(t, 300*time.Millisecond), key, "A", backends.Write, 30*time.Second)
					t.Logf("renewal while the LOCK looks for its write = %v", err)
				}
			}
			d.dropOpen()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			l, err := a.Lock(ctx, backends.LockRequest{Key: key, Token: "A", TTL: 30 * time.Second})
			if err == nil {
				told++
				if l.Holds != 2 {
					t.Errorf("reentrant LOCK whose answer was lost = %+v; want 2 holds", l)
				}
			}
			t.Logf("reentrant LOCK whose answer was lost = %+v, %v", l, err)
			waitFor(t, "a reconnected", func() bool { return a.connected.Load() })
			for i := range told {
				ok, err := a.Unlock(ctxT(t, 10*time.Second), key, "A")
				if err != nil || !ok {
					t.Fatalf("UNLOCK %d of the %d holds told = %v, %v", i+1, told, ok, err)
				}
			}
			if _, err := lock(t, b, key, "B", time.Second, 3*time.Second, backends.Write); err != nil {
				w, r := nodeHolds(t, b, key)
				t.Fatalf("rival after the holder's UNLOCK of its %d holds = %v; want a grant (the node still has %d write and %d read holds)",
					told, err, w, r)
			}
		})
	}
}
