package zookeeper

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// tightBackend is a backend whose drift allowance (no factor, driftMin)
// leaves a lease of ttl ttl−driftMin before any time is spent, in a
// session whose horizon (5/12 of it, 12.5 s) is past the leases.
func tightBackend(t *testing.T, root string, driftMin time.Duration) *Backend {
	t.Helper()
	b, err := New(Config{Servers: []string{zkAddr}, Root: root, SessionTimeout: 30 * time.Second,
		DriftMin: driftMin, StartTimeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// nodeHolds is the write and read holds of key's one node.
func nodeHolds(t *testing.T, b *Backend, key string) (write, read int64) {
	t.Helper()
	ctx := ctxT(t, 10*time.Second)
	dir := keyDir(b.cfg.Root, key)
	kids, err := b.children(ctx, dir)
	if err != nil || len(kids) != 1 {
		t.Fatalf("children of %q = %v, %v; want its one node", key, kids, err)
	}
	g, ok, err := b.get(ctx, dir+"/"+kids[0].name)
	if err != nil || !ok {
		t.Fatalf("node of %q: %v, %v", key, ok, err)
	}
	return int64(g.data.write), int64(g.data.read)
}

// TestValidityUnderOneMsRefused: replies give validities in whole
// milliseconds, so a grant with a validity under 1 ms would answer
// validity_ms 0 and a renewal RENEW 0 ("no longer held") while counted
// as held. Here every grant or renewal with the TTL short leaves less
// than 1 ms (its drift allowance leaves 0.999 ms before any time is
// spent; PX 3 under the default drift leaves 0.97 ms), and long is a
// TTL that leaves seconds. A grant must be refused, its hold taken back
// (a first grant's node deleted, a reentry's hold, a reentry made before
// the grant's own), a renewal answer 0, through either instance. Before,
// a reentry or renewal reported 1 ms, whatever the time spent.
func TestValidityUnderOneMsRefused(t *testing.T) {
	root := testRoot(t)
	const short, long = time.Second, 30 * time.Second
	const driftMin = short - 999*time.Microsecond
	a := tightBackend(t, root, driftMin)
	b := tightBackend(t, root, driftMin)
	ctx := ctxT(t, 60*time.Second)
	refused := func(l backends.Lease, err error) error {
		if !errors.Is(err, backends.ErrNotAcquired) {
			return fmt.Errorf("LOCK = %+v, %v; want refused (ErrNotAcquired)", l, err)
		}
		return nil
	}
	zero := func(v time.Duration, err error) error {
		if err != nil || v != 0 {
			return fmt.Errorf("renewal = %v, %v; want 0", v, err)
		}
		return nil
	}
	for _, tc := range []struct {
		name  string
		first []backends.Mode // T's holds before the try
		try   func(key string) error
		// holds wanted after the try: T's write and read holds of the
		// key's one node; -1: no node (a first grant), or not checked
		// (RENEW sets the lease to short: its timer may delete it).
		write, read int64
	}{
		{"first grant", nil, func(key string) error {
			return refused(lock(t, a, key, "T", short, 0, backends.Write))
		}, -1, -1},
		{"write reentry", []backends.Mode{backends.Write}, func(key string) error {
			return refused(lock(t, a, key, "T", short, 0, backends.Write))
		}, 1, 0},
		{"write reentry through the other instance", []backends.Mode{backends.Write}, func(key string) error {
			return refused(lock(t, b, key, "T", short, 0, backends.Write))
		}, 1, 0},
		{"read reentry", []backends.Mode{backends.Read}, func(key string) error {
			return refused(lock(t, a, key, "T", short, 0, backends.Read))
		}, 0, 1},
		{"downgrade", []backends.Mode{backends.Write}, func(key string) error {
			return refused(lock(t, a, key, "T", short, 0, backends.Read))
		}, 1, 0},
		{"Renew", []backends.Mode{backends.Write}, func(key string) error {
			return zero(a.Renew(ctx, key, "T", short))
		}, -1, -1},
		{"Renew through the other instance", []backends.Mode{backends.Write}, func(key string) error {
			return zero(b.Renew(ctx, key, "T", short))
		}, -1, -1},
		{"RenewHold", []backends.Mode{backends.Write}, func(key string) error {
			return zero(a.RenewHold(ctx, key, "T", backends.Write, short))
		}, 1, 0},
		{"RenewHold through the other instance", []backends.Mode{backends.Read}, func(key string) error {
			return zero(b.RenewHold(ctx, key, "T", backends.Read, short))
		}, 0, 1},
		{"reentered before the grant", nil, func(key string) error {
			// A LOCK of T whose node was reentered (one more write hold,
			// the long lease), by another LOCK of T, after nothing blocked
			// it and before its grant was read, which comes too late.
			dir := keyDir(root, key)
			want := lockData{ttl: long, startMS: time.Now().UnixMilli(), token: "T", write: 1, gated: true}
			prefix := childPrefix(kindWrite, tokenHash("T"), newNonce())
			path, err := a.createNode(ctx, dir, prefix, want.encode(), gatePath(root, dir, prefix))
			if err != nil {
				return err
			}
			re := want
			re.write = 2
			if _, err := a.conn.Set(path, re.encode(), 0); err != nil {
				return err
			}
			kids, err := a.children(ctx, dir)
			if err != nil || len(kids) != 1 {
				return fmt.Errorf("children = %v, %v", kids, err)
			}
			// Begun so long ago that 0.999 ms of the validity is left
			// (the lease capped by the session's horizon, less the drift).
			t0 := time.Now().Add(-(a.sessionHorizon() - short))
			l, err := a.granted(ctx, backends.LockRequest{Key: key, Token: "T", TTL: long}, path, want, t0, kids, 0)
			if err == nil {
				err = errors.New("granted")
			}
			if !errors.Is(err, backends.ErrNotAcquired) {
				return fmt.Errorf("grant = %+v, %v; want refused (ErrNotAcquired)", l, err)
			}
			a.abandon(path) // as Lock does: the reentered node must stay
			return nil
		}, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "k-" + tc.name
			for _, mode := range tc.first {
				if l := mustLock(t, a, key, "T", long, mode); l.Validity < time.Second {
					t.Fatalf("LOCK PX %v = %+v; want seconds of validity", long, l)
				}
			}
			if err := tc.try(key); err != nil {
				t.Fatalf("with a validity under 1 ms: %v", err)
			}
			switch {
			case tc.write >= 0:
				if w, r := nodeHolds(t, a, key); w != tc.write || r != tc.read {
					t.Errorf("T's holds after = %d write, %d read; want %d, %d", w, r, tc.write, tc.read)
				}
			case tc.name == "first grant":
				if kids, err := a.children(ctx, keyDir(root, key)); err != nil || len(kids) != 0 {
					t.Errorf("children after = %v, %v; want none", kids, err)
				}
			}
		})
	}
	// With time left, as before: the validity through the instance that
	// made the node, 1 ms (held, nothing promised) through the other.
	mustLock(t, a, "control", "T", long, backends.Write)
	if v, err := a.Renew(ctx, "control", "T", long); err != nil || v < 5*time.Second {
		t.Errorf("RENEW PX %v = %v, %v; want seconds", long, v, err)
	}
	if v, err := b.Renew(ctx, "control", "T", long); err != nil || v != time.Millisecond {
		t.Errorf("RENEW PX %v through the other instance = %v, %v; want 1ms", long, v, err)
	}
}
