package zookeeper

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// infoTTL is the longest lease LOCKINFO shows for key through b: its
// ttl_ms or a holder's. It fails t when the key is not held.
func infoTTL(t *testing.T, b *Backend, key string) time.Duration {
	t.Helper()
	info, ok, err := b.Info(ctxT(t, 10*time.Second), key)
	if err != nil || !ok {
		t.Fatalf("Info(%q) = %+v, %v, %v; want held", key, info, ok, err)
	}
	longest := info.TTL
	for _, h := range info.Holders {
		longest = max(longest, h.TTL)
	}
	return longest
}

// waitFree polls until key is free through b, and fails t if it is still
// held at deadline.
func waitFree(t *testing.T, b *Backend, key string, deadline time.Time, why string) {
	t.Helper()
	for {
		_, ok, err := b.Info(ctxT(t, 10*time.Second), key)
		if err == nil && !ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q still held (err %v) %v past the deadline: %s", key, err, time.Since(deadline), why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestInfoTTLAfterPartialUnlock: an UNLOCK that removes one of several
// holds rewrites the node's data (which changes its mtime) without
// restarting the lease. LOCKINFO must still report what is left of the
// lease, not a fresh one (it used to measure the lease from mtime), and the
// node must still end when the lease said, whether the UNLOCK went through
// the instance that made the node or another one.
func TestInfoTTLAfterPartialUnlock(t *testing.T) {
	root := testRoot(t)
	a := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	b := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	const ttl = 3 * time.Second
	for _, tc := range []struct {
		name  string
		modes []backends.Mode // the grants of token A through a, in order
		via   *Backend        // the instance the UNLOCK of one hold goes through
	}{
		{"reentrant write", []backends.Mode{backends.Write, backends.Write}, a},
		{"reentrant read", []backends.Mode{backends.Read, backends.Read}, a},
		{"downgrade", []backends.Mode{backends.Write, backends.Read}, a},
		{"reentrant write, unlocked elsewhere", []backends.Mode{backends.Write, backends.Write}, b},
		{"downgrade, unlocked elsewhere", []backends.Mode{backends.Write, backends.Read}, b},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each on its own key; most of a row is waiting
			key := "k-" + tc.name
			for _, m := range tc.modes {
				mustLock(t, a, key, "A", ttl, m)
			}
			granted := time.Now() // after the last grant's lease began
			time.Sleep(2 * time.Second)
			if !unlock(t, tc.via, key, "A") {
				t.Fatal("UNLOCK of one hold = false")
			}
			for _, through := range []*Backend{a, b} {
				got := infoTTL(t, through, key)
				if left := ttl - time.Since(granted); got > left {
					t.Errorf("LOCKINFO ttl_ms %d after UNLOCK of one hold; the lease has at most %d ms left",
						got.Milliseconds(), left.Milliseconds())
				}
			}
			// The lease ends when it was set to (plus a few round trips):
			// one restarted by the UNLOCK would run until 2 s + ttl after
			// the grant, or, through another instance, 2 × ttl.
			waitFree(t, b, key, granted.Add(ttl+1500*time.Millisecond), "the partial UNLOCK restarted the lease")
		})
	}
}

// TestInfoTTLCappedBySession: a lock lives in its instance's session, so a
// grant's validity is capped by the session timeout; LOCKINFO's ttl_ms, on
// either instance, must not promise more than that validity (as on RedLock,
// where it never exceeds what a majority would honour less drift).
func TestInfoTTLCappedBySession(t *testing.T) {
	root := testRoot(t)
	const session = 4 * time.Second
	a := newBackend(t, []string{zkAddr}, root, session)
	b := newBackend(t, []string{zkAddr}, root, session)
	for _, tc := range []struct {
		name string
		take func(t *testing.T, key string) backends.Lease
	}{
		{"grant", func(t *testing.T, key string) backends.Lease {
			return mustLock(t, a, key, "A", 20*time.Second, backends.Write)
		}},
		{"reentry", func(t *testing.T, key string) backends.Lease {
			mustLock(t, a, key, "A", time.Second, backends.Write)
			return mustLock(t, a, key, "A", 20*time.Second, backends.Write)
		}},
		{"renewal", func(t *testing.T, key string) backends.Lease {
			mustLock(t, a, key, "A", time.Second, backends.Read)
			v, err := a.Renew(ctxT(t, 10*time.Second), key, "A", 20*time.Second)
			if err != nil || v <= 0 {
				t.Fatalf("RENEW = %v, %v", v, err)
			}
			return backends.Lease{Validity: v}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "cap-" + tc.name
			l := tc.take(t, key)
			got := time.Now()
			if l.Validity >= session {
				t.Fatalf("validity %v; want capped below the session timeout %v", l.Validity, session)
			}
			for _, through := range []*Backend{a, b} {
				ttl := infoTTL(t, through, key)
				if ttl <= 0 || ttl > l.Validity {
					t.Errorf("LOCKINFO ttl_ms %d %v after the grant; want in (0, validity_ms %d]",
						ttl.Milliseconds(), time.Since(got), l.Validity.Milliseconds())
				}
			}
			unlock(t, a, key, "A")
			for unlock(t, a, key, "A") {
			}
		})
	}
}

// encodeV1 is lockData as the previous format (version 1, no lease start)
// wrote it: nodes an instance not yet upgraded made or last changed.
func encodeV1(d lockData) []byte {
	b := make([]byte, 1+8+8+8, 1+8+8+8+len(d.token))
	b[0] = 1
	binary.BigEndian.PutUint64(b[1:], uint64(d.write))
	binary.BigEndian.PutUint64(b[9:], uint64(d.read))
	binary.BigEndian.PutUint64(b[17:], uint64(d.ttl.Milliseconds()))
	return append(b, d.token...)
}

// TestInfoTTLOldFormatNode: a node in the previous data format (no lease
// start; during a rolling upgrade an older instance writes these) is still
// read, its lease measured from its last change (mtime), and an UNLOCK of
// one of its holds through an upgraded instance does not restart that
// lease either.
func TestInfoTTLOldFormatNode(t *testing.T) {
	t.Parallel() // mostly waits on lease timers, in a root of its own
	root := testRoot(t)
	a := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	const ttl = 3 * time.Second
	const key = "old"
	dir := keyDir(root, key)
	made := time.Now()
	_, err := a.create(ctxT(t, 10*time.Second), dir, childPrefix(kindWrite, tokenHash("A"), newNonce()),
		encodeV1(lockData{write: 2, ttl: ttl, token: "A"}))
	if err != nil {
		t.Fatalf("create an old-format node: %v", err)
	}
	if got := infoTTL(t, a, key); got <= 0 || got > ttl {
		t.Errorf("LOCKINFO ttl_ms %d of a fresh old-format node; want in (0, %d]", got.Milliseconds(), ttl.Milliseconds())
	}
	time.Sleep(2 * time.Second)
	if !unlock(t, a, key, "A") {
		t.Fatal("UNLOCK of one hold of an old-format node = false")
	}
	// The server's clock and this one are the same host's: no skew.
	if got, left := infoTTL(t, a, key), ttl-time.Since(made); got > left {
		t.Errorf("LOCKINFO ttl_ms %d after UNLOCK of one hold of an old-format node; at most %d ms left",
			got.Milliseconds(), left.Milliseconds())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if ok, err := a.Unlock(ctx, key, "A"); err != nil || !ok {
		t.Errorf("UNLOCK of the last hold = %v, %v", ok, err)
	}
}
