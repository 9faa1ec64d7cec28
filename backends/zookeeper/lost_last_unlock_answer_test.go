package zookeeper

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestLostLastUnlockAnswerTellsReleased: an UNLOCK of a node's last hold
// whose delete is applied but whose answer is lost (the connection given
// up while it waits) answers released once the instance is back on its
// session and finds the node gone while its lease still runs. Before, it
// answered NOQUORUM connection lost, and the client's UNLOCK again was
// told 0, the answer for a lock lost before its release (Redisson throws
// on it), for a lock it released in time. When the lease may have ended
// before the instance could look, the node's going says nothing of the
// delete: the error stands, as before.
func TestLostLastUnlockAnswerTellsReleased(t *testing.T) {
	t.Parallel() // mostly waits for the connection to be given up
	root := testRoot(t)
	const session = 2 * time.Second // the UNLOCK's connection is given up after 2/3 of it
	b := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	for _, tc := range []struct {
		name     string
		mode     backends.Mode
		ttl      time.Duration
		released bool // the lost UNLOCK's answer: released, or an error
	}{
		{"write hold", backends.Write, 30 * time.Second, true},
		{"read hold", backends.Read, 30 * time.Second, true},
		{"write hold whose lease ends before the look", backends.Write, 500 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key := "lost-last-unlock-" + tc.name
			d := startReplyDropper(t, zkAddr)
			a := newBackend(t, []string{d.ln.Addr().String()}, root, session)
			mustLock(t, a, key, "A", tc.ttl, tc.mode)
			d.dropOpen()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ok, err := a.Unlock(ctx, key, "A")
			t.Logf("UNLOCK whose answer was lost = %v, %v", ok, err)
			if tc.released && (err != nil || !ok) {
				t.Fatalf("UNLOCK of the last hold, its delete made = %v, %v; want true", ok, err)
			}
			if !tc.released && (err == nil || ok) {
				t.Fatalf("UNLOCK of the last hold, lease over before the look = %v, %v; want an error (not known)", ok, err)
			}
			if kids, err := b.children(ctxT(t, 10*time.Second), keyDir(b.cfg.Root, key)); err != nil || len(kids) != 0 {
				t.Fatalf("after the UNLOCK: lock nodes %v, %v; want none", kids, err)
			}
		})
	}
}
