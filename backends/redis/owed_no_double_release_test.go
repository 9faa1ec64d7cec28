package redis

import (
	"fmt"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestOwedNoDoubleRelease: token T holds k on three nodes (one hold
// each); n1 and n2 are paused, so T's reentrant LOCK of k is granted by
// n0 alone, fails and is rolled back. Once the nodes resume and the
// writers have settled, T must still hold k on every node with its one
// hold, and another token's LOCK of k must be refused.
//
// On n1 and n2 the attempt's SET NX was sent and not answered, and its
// roll-back could not go out (no connection to a paused node): it was
// owed, and sent after the kill once the node resumed. But the SET NX,
// run on resume, found T's own key and did nothing (the reentrant script
// goes out only once its answer is read), so the owed plain release took
// T's only hold there: T, told it holds k, held n0 alone, and another
// token would be granted n1 and n2. Before the owed change the roll-back
// was lost and the nodes kept their hold. The roll-back of an acquire in
// doubt now removes only a hold its SET NX made (lateGrantReleaseScript).
func TestOwedNoDoubleRelease(t *testing.T) {
	// Mostly waits on paused nodes and the settle: beside the other
	// such tests, each case on nodes of its own.
	t.Parallel()
	for _, pause := range []time.Duration{300 * time.Millisecond, 1500 * time.Millisecond} {
		t.Run(fmt.Sprint("paused ", pause), func(t *testing.T) {
			t.Parallel()
			b, rs := newRealBackend(t, 3)
			ctx := ctxTimeout(t, 60*time.Second)
			const key = "double-release"
			const ttl = 20 * time.Second

			if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "T", TTL: ttl}); err != nil {
				t.Fatal(err)
			}
			holdsOnce := func(st nodeLockState) bool {
				return st.held && st.value == "T" && st.extraHolds == 0
			}
			// LOCK answers once a majority granted: the third node's grant
			// may come just after.
			for i := 0; ; i++ {
				sts := holdStates(t, ctx, b, key)
				if holdsOnce(sts[0]) && holdsOnce(sts[1]) && holdsOnce(sts[2]) {
					break
				}
				if i == 100 {
					t.Fatalf("1 s after T's LOCK: %+v; want T's one hold on every node", sts)
				}
				time.Sleep(10 * time.Millisecond)
			}

			rs[1].Pause()
			rs[2].Pause()
			_, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "T", TTL: ttl})
			time.Sleep(pause) // the roll-back's node timeout passes while paused
			rs[1].Resume()
			rs[2].Resume()
			if err == nil {
				t.Fatal("reentrant LOCK with n1, n2 paused granted; want it refused")
			}

			// Settle: whatever the writers still owe the nodes goes out
			// within a few retries once they are back. T's holds are
			// watched all along: a lost one is the failure.
			resumed := time.Now()
			for time.Since(resumed) < 3*time.Second {
				for i, st := range holdStates(t, ctx, b, key) {
					if !holdsOnce(st) {
						t.Fatalf("n%d %v after the nodes resumed: held %v by %q with %d extra holds; want T's one hold",
							i, time.Since(resumed).Round(time.Millisecond), st.held, st.value, st.extraHolds)
					}
				}
				time.Sleep(20 * time.Millisecond)
			}
			_, err = b.Lock(ctx, backends.LockRequest{Key: key, Token: "U", TTL: ttl})
			if err == nil {
				t.Fatal("another token granted k while T holds it (two holders)")
			}
			t.Logf("another token's LOCK: %v", err)
		})
	}
}
