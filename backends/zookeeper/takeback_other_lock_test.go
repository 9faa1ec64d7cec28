package zookeeper

import (
	"errors"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockproxy/lockproxy/backends"
)

// TestTakeBackSparesAnotherLocksHold: a reentry that comes too late to be
// of use (a validity under 1 ms) has its hold taken back. Its lease is then
// about to end (the validity left is the lease less the drift): the node
// may go at the lease's end before the take-back reaches it, with the
// late hold in it, and the token may be granted the key again meanwhile
// through a new node (another LOCK with the token: another connection,
// another instance). The take-back must leave that node alone: its hold
// is the new LOCK's, which was told it holds the key. Taking it instead
// deletes the node, and another token is granted the key while the new
// LOCK's validity lasts: two holders.
func TestTakeBackSparesAnotherLocksHold(t *testing.T) {
	root := testRoot(t)
	const short = time.Second
	// a: a LOCK PX short leaves under 1 ms; PX 1.5 s leaves 0.5 s.
	a := tightBackend(t, root, short-999*time.Microsecond)
	c := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	ctx := ctxT(t, 60*time.Second)
	for _, tc := range []struct {
		name string
		mode backends.Mode
		// setup gives T a hold through a whose lease ends in a second or two,
		// and returns its node.
		setup func(t *testing.T, key string) string
		// late is the LOCK of T through a whose grant or reentry comes too
		// late (answered not acquired).
		late func(t *testing.T, key, path string) (backends.Lease, error)
	}{
		{"write reentry", backends.Write, heldThroughA(a, backends.Write), reentryThroughA(a, short, backends.Write)},
		{"read reentry", backends.Read, heldThroughA(a, backends.Read), reentryThroughA(a, short, backends.Read)},
		{"grant reentered before it", backends.Write, func(t *testing.T, key string) string {
			// T's waiting node, reentered (another LOCK of T) before its
			// grant, for a lease of short from now.
			dir := keyDir(root, key)
			want := lockData{ttl: short, startMS: time.Now().UnixMilli(), token: "T", write: 1, gated: true}
			prefix := childPrefix(kindWrite, tokenHash("T"), newNonce())
			path, err := a.createNode(ctx, dir, prefix, want.encode(), gatePath(root, dir, prefix))
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			re := want
			re.write = 2
			if _, err := a.conn.Set(path, re.encode(), 0); err != nil {
				t.Fatalf("reentry: %v", err)
			}
			return path
		}, func(t *testing.T, key, path string) (backends.Lease, error) {
			kids, err := a.children(ctx, keyDir(root, key))
			if err != nil || len(kids) != 1 {
				t.Fatalf("children = %v, %v", kids, err)
			}
			want := lockData{ttl: short, token: "T", write: 1, gated: true}
			l, err := a.granted(ctx, backends.LockRequest{Key: key, Token: "T", TTL: short}, path, want, time.Now(), kids, 0)
			if err != nil {
				a.abandon(path) // as Lock does
			}
			return l, err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "takeback-" + tc.name
			path := tc.setup(t, key)
			var regranted bool
			a.testBeforeTakeBack = func() {
				a.testBeforeTakeBack = nil
				// The node's lease ends (a's timer deletes it) before the
				// take-back gets to it...
				exists, _, ch, err := c.conn.ExistsW(path)
				if err != nil {
					t.Errorf("exists %s: %v", path, err)
					return
				}
				if exists {
					select {
					case ev := <-ch:
						if ev.Type != zk.EventNodeDeleted {
							t.Errorf("watch on T's node: %+v; want its deletion at its lease's end", ev)
							return
						}
					case <-time.After(20 * time.Second):
						t.Errorf("T's node %s outlived its lease by 20 s", path)
						return
					}
				}
				// ...and T is granted the key again, through c.
				if _, err := lock(t, c, key, "T", 30*time.Second, 0, tc.mode); err != nil {
					t.Errorf("LOCK T through c once the lease ended = %v; want a grant", err)
					return
				}
				regranted = true
			}
			if l, err := tc.late(t, key, path); !errors.Is(err, backends.ErrNotAcquired) {
				t.Fatalf("late grant = %+v, %v; want ErrNotAcquired", l, err)
			}
			if !regranted {
				t.Fatalf("the take-back did not run, or T was not granted again")
			}
			info, ok, err := c.Info(ctx, key)
			if err != nil || !ok || len(info.Holders) != 1 || info.Holders[0].Token != "T" {
				t.Errorf("LOCKINFO after the take-back = %+v, %v, %v; want T's 30 s hold granted through c", info, ok, err)
			}
			if l, err := lock(t, c, key, "X", 30*time.Second, 0, backends.Write); !errors.Is(err, backends.ErrNotAcquired) {
				t.Errorf("LOCK X while T holds through c = %+v, %v; want ErrNotAcquired (two holders)", l, err)
			}
		})
	}
}

// heldThroughA gives T a hold of mode through a for 1.5 s (0.5 s of
// validity) and returns its node.
func heldThroughA(a *Backend, mode backends.Mode) func(t *testing.T, key string) string {
	return func(t *testing.T, key string) string {
		mustLock(t, a, key, "T", 1500*time.Millisecond, mode)
		n, ok := a.cached(key, "T")
		if !ok {
			t.Fatalf("a does not track T's node")
		}
		return n.path
	}
}

// reentryThroughA is a LOCK of T through a (the node's instance) that
// leaves under 1 ms.
func reentryThroughA(a *Backend, ttl time.Duration, mode backends.Mode) func(t *testing.T, key, path string) (backends.Lease, error) {
	return func(t *testing.T, key, _ string) (backends.Lease, error) {
		return lock(t, a, key, "T", ttl, 0, mode)
	}
}
