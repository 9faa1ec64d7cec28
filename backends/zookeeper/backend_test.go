package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/test/harness"
)

// zkAddr is the standalone server every test in this package shares (a JVM
// start costs seconds on a loaded machine); tests keep apart by root.
var zkAddr string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "lockproxy-zk-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	z, err := harness.LaunchZooKeeper(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	zkAddr = z.Addr
	code := m.Run()
	z.Kill()
	os.RemoveAll(dir)
	os.Exit(code)
}

var roots sync.Map

// testRoot is a root of its own for t.
func testRoot(t *testing.T) string {
	name := "/t-" + strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
	if _, dup := roots.LoadOrStore(name, true); dup {
		t.Fatalf("root %s used twice", name)
	}
	return name
}

func newBackend(t *testing.T, servers []string, root string, session time.Duration) *Backend {
	t.Helper()
	b, err := New(Config{Servers: servers, Root: root, SessionTimeout: session,
		DriftFactor: 0.01, DriftMin: 2 * time.Millisecond, StartTimeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func lock(t *testing.T, b *Backend, key, token string, ttl, wait time.Duration, mode backends.Mode) (backends.Lease, error) {
	t.Helper()
	return b.Lock(ctxT(t, wait+30*time.Second), backends.LockRequest{Key: key, Token: token, TTL: ttl, Wait: wait, Mode: mode})
}

func mustLock(t *testing.T, b *Backend, key, token string, ttl time.Duration, mode backends.Mode) backends.Lease {
	t.Helper()
	l, err := lock(t, b, key, token, ttl, 0, mode)
	if err != nil {
		t.Fatalf("%v %q token %q = %v; want a grant", mode, key, token, err)
	}
	return l
}

func wantNotAcquired(t *testing.T, b *Backend, key, token string, mode backends.Mode) {
	t.Helper()
	if l, err := lock(t, b, key, token, time.Second, 0, mode); !errors.Is(err, backends.ErrNotAcquired) {
		t.Fatalf("%v %q token %q = %+v, %v; want ErrNotAcquired", mode, key, token, l, err)
	}
}

func unlock(t *testing.T, b *Backend, key, token string) bool {
	t.Helper()
	ok, err := b.Unlock(ctxT(t, 30*time.Second), key, token)
	if err != nil {
		t.Fatalf("Unlock %q %q: %v", key, token, err)
	}
	return ok
}

func TestKeyEncodingInjective(t *testing.T) {
	keys := []string{"", "a", "a/b", "a-b", "/", "..", ".", "\x00", "\r\n", "\xff\xfe", "k", "kk", "a\x00", "a\x00\x00",
		strings.Repeat("x", 1000)}
	seen := map[string]string{}
	for _, k := range keys {
		d := keyDir("/r", k)
		name := strings.TrimPrefix(d, "/r/")
		if strings.Contains(name, "/") || name == "." || name == ".." || name == "" {
			t.Errorf("keyDir(%q) = %q: not a single znode name", k, d)
		}
		if o, dup := seen[d]; dup {
			t.Errorf("keyDir(%q) = keyDir(%q) = %q", k, o, d)
		}
		seen[d] = k
	}
}

func TestChildNamesAndData(t *testing.T) {
	p := childPrefix(kindRead, tokenHash("tok"), "0a0b0c0d")
	c, ok := parseChild(p + "0000000042")
	if !ok || c.kind != kindRead || c.hash != tokenHash("tok") || c.nonce != "0a0b0c0d" || c.seq != 42 {
		t.Fatalf("parseChild = %+v, %v", c, ok)
	}
	for _, bad := range []string{"x-1-2-0000000001", "w-1-2-01", "w-1-0000000001", "lock"} {
		if _, ok := parseChild(bad); ok {
			t.Errorf("parseChild(%q) ok; want rejected", bad)
		}
	}
	d := lockData{write: 2, read: 1, ttl: 1500 * time.Millisecond, startMS: 1700000000123, token: "t\x00\r\n"}
	got, err := decodeData(d.encode())
	if err != nil || got != d {
		t.Fatalf("decode(encode(%+v)) = %+v, %v", d, got, err)
	}
	// The previous format (no lease start) is still read, during a rolling
	// upgrade: its start is unknown (0), and the lease runs from mtime.
	old := d
	old.startMS = 0
	if got, err := decodeData(encodeV1(d)); err != nil || got != old {
		t.Fatalf("decode(v1 %+v) = %+v, %v; want %+v", d, got, err, old)
	}
	if _, err := decodeData([]byte("hello")); err == nil {
		t.Fatal("decodeData(garbage) = nil error")
	}
}

// TestLockUnlockRenew walks one key through the basic life of a lock,
// through two instances (two sessions), with binary keys.
func TestLockUnlockRenew(t *testing.T) {
	root := testRoot(t)
	// Sessions whose horizon (5/12 of them, 12.5 s) is past the leases.
	a := newBackend(t, []string{zkAddr}, root, 30*time.Second)
	b := newBackend(t, []string{zkAddr}, root, 30*time.Second)
	for _, key := range []string{"plain", "a/b", "\x00\r\n\xff", strings.Repeat("k", 4096)} {
		t.Run(fmt.Sprintf("%.12q", key), func(t *testing.T) {
			l := mustLock(t, a, key, "A", 5*time.Second, backends.Write)
			if l.Validity <= 4*time.Second || l.Validity > 5*time.Second-50*time.Millisecond-2*time.Millisecond {
				t.Errorf("validity = %v; want in (4s, ttl − drift]", l.Validity)
			}
			if l.Holds != 1 || l.Fence == 0 || l.Token != "A" {
				t.Errorf("lease = %+v", l)
			}
			wantNotAcquired(t, b, key, "B", backends.Write)
			wantNotAcquired(t, b, key, "B", backends.Read)
			if unlock(t, b, key, "B") {
				t.Error("UNLOCK with another token = true")
			}
			v, err := b.Renew(ctxT(t, 30*time.Second), key, "B", time.Second)
			if err != nil || v != 0 {
				t.Errorf("RENEW with another token = %v, %v; want 0", v, err)
			}
			// The node lives in a's session, whose end b cannot see: held,
			// nothing promised (TestRenewThroughOtherInstancePromisesNothing).
			v, err = b.Renew(ctxT(t, 30*time.Second), key, "A", 8*time.Second)
			if err != nil || v != time.Millisecond {
				t.Errorf("RENEW through the other instance = %v, %v; want 1ms", v, err)
			}
			v, err = a.Renew(ctxT(t, 30*time.Second), key, "A", 8*time.Second)
			if err != nil || v <= 7*time.Second {
				t.Errorf("RENEW through the instance that made the node = %v, %v; want > 7s", v, err)
			}
			info, ok, err := b.Info(ctxT(t, 30*time.Second), key)
			if err != nil || !ok || info.Mode != backends.Write || len(info.Holders) != 1 ||
				info.Holders[0].Token != "A" || info.Fence != l.Fence {
				t.Errorf("Info = %+v, %v, %v", info, ok, err)
			}
			if !unlock(t, a, key, "A") {
				t.Fatal("UNLOCK by the holder = false")
			}
			if unlock(t, a, key, "A") {
				t.Error("second UNLOCK = true")
			}
			if _, ok, _ := b.Info(ctxT(t, 30*time.Second), key); ok {
				t.Error("Info after UNLOCK: held")
			}
			l2 := mustLock(t, b, key, "B", time.Second, backends.Write)
			if l2.Fence <= l.Fence {
				t.Errorf("fence %d after %d; want larger", l2.Fence, l.Fence)
			}
			unlock(t, b, key, "B")
		})
	}
}

// TestReentrancyAcrossInstances: the same token reenters through either
// instance, holds are counted in the node, and the lock is free at zero.
func TestReentrancyAcrossInstances(t *testing.T) {
	root := testRoot(t)
	a := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	b := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	l1 := mustLock(t, a, "r", "T", 5*time.Second, backends.Write)
	l2 := mustLock(t, b, "r", "T", 5*time.Second, backends.Write)
	l3 := mustLock(t, a, "r", "T", 5*time.Second, backends.Write)
	if l2.Fence != l1.Fence || l3.Fence != l1.Fence || l2.Holds != 2 || l3.Holds != 3 {
		t.Fatalf("reentrant leases %+v %+v %+v; want the same fence, holds 2 and 3", l1, l2, l3)
	}
	info, _, _ := a.Info(ctxT(t, 30*time.Second), "r")
	if len(info.Holders) != 1 || info.Holders[0].Holds != 3 {
		t.Errorf("Info = %+v; want one holder with 3 holds", info)
	}
	for i, via := range []*Backend{b, a, b} {
		if !unlock(t, via, "r", "T") {
			t.Fatalf("UNLOCK %d = false", i+1)
		}
		if i < 2 {
			wantNotAcquired(t, b, "r", "U", backends.Write)
		}
	}
	l := mustLock(t, b, "r", "U", time.Second, backends.Write)
	if l.Fence <= l1.Fence {
		t.Errorf("fence after release %d; want > %d", l.Fence, l1.Fence)
	}
	unlock(t, b, "r", "U")

	// Released through the other instance: the creator's cached copy is
	// stale, and neither a new LOCK nor an UNLOCK through it is fooled.
	l4 := mustLock(t, a, "r", "T", 5*time.Second, backends.Write)
	if !unlock(t, b, "r", "T") {
		t.Fatal("UNLOCK through the other instance = false")
	}
	if unlock(t, a, "r", "T") {
		t.Error("UNLOCK through the creator after the release = true")
	}
	l5 := mustLock(t, a, "r", "T", 5*time.Second, backends.Write)
	if l5.Holds != 1 || l5.Fence <= l4.Fence {
		t.Errorf("LOCK after the release through the other instance = %+v; want a first grant with a fence > %d", l5, l4.Fence)
	}
	if !unlock(t, b, "r", "T") {
		t.Fatal("UNLOCK through the other instance = false")
	}
	l6 := mustLock(t, a, "r", "T", 5*time.Second, backends.Write)
	if l6.Holds != 1 || l6.Fence <= l5.Fence {
		t.Errorf("LOCK (reentrant path) after a release elsewhere = %+v; want a first grant", l6)
	}
}

// TestReadWrite: readers share, writers exclude, a waiting writer blocks
// later readers, a write holder may downgrade and a reader may not upgrade.
func TestReadWrite(t *testing.T) {
	root := testRoot(t)
	a := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	b := newBackend(t, []string{zkAddr}, root, 10*time.Second)

	r1 := mustLock(t, a, "rw", "R1", 5*time.Second, backends.Read)
	mustLock(t, b, "rw", "R2", 5*time.Second, backends.Read)
	wantNotAcquired(t, b, "rw", "W", backends.Write)
	if _, err := lock(t, a, "rw", "R1", time.Second, 0, backends.Write); !errors.Is(err, backends.ErrUpgrade) {
		t.Errorf("upgrade = %v; want ErrUpgrade", err)
	}
	info, ok, err := a.Info(ctxT(t, 30*time.Second), "rw")
	if err != nil || !ok || info.Mode != backends.Read || len(info.Holders) != 2 {
		t.Errorf("Info = %+v, %v, %v; want two readers", info, ok, err)
	}

	// A writer waits; a new reader now waits behind it.
	wdone := make(chan backends.Lease, 1)
	go func() {
		l, err := b.Lock(context.Background(), backends.LockRequest{Key: "rw", Token: "W", TTL: 5 * time.Second, Wait: 30 * time.Second})
		if err != nil {
			t.Errorf("waiting writer: %v", err)
		}
		wdone <- l
	}()
	waitFor(t, "writer queued", func() bool {
		kids, _ := a.children(context.Background(), keyDir(root, "rw"))
		return len(kids) == 3
	})
	wantNotAcquired(t, a, "rw", "R3", backends.Read)
	unlock(t, a, "rw", "R1")
	unlock(t, b, "rw", "R2")
	w := <-wdone
	if w.Fence <= r1.Fence {
		t.Errorf("writer fence %d; want > reader's %d", w.Fence, r1.Fence)
	}
	// Downgrade: the writer takes a read hold too, and keeps readers out
	// until its write hold goes.
	d := mustLock(t, b, "rw", "W", 5*time.Second, backends.Read)
	if d.Fence != w.Fence || d.Holds != 1 {
		t.Errorf("downgrade lease %+v; want fence %d, 1 read hold", d, w.Fence)
	}
	wantNotAcquired(t, a, "rw", "R4", backends.Read)
	unlock(t, b, "rw", "W") // the write hold
	mustLock(t, a, "rw", "R4", 5*time.Second, backends.Read)
	wantNotAcquired(t, a, "rw", "W2", backends.Write)
	if _, err := lock(t, b, "rw", "W", time.Second, 0, backends.Write); !errors.Is(err, backends.ErrUpgrade) {
		t.Errorf("write after the downgrade's write hold went = %v; want ErrUpgrade", err)
	}
	unlock(t, b, "rw", "W") // the read hold
	unlock(t, a, "rw", "R4")
	mustLock(t, a, "rw", "W2", time.Second, backends.Write)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestLeaseEnds: a lock not renewed is deleted by its instance when its
// lease ends, and a waiter on another instance gets it then, with a larger
// fence; a renewed one lives on.
func TestLeaseEnds(t *testing.T) {
	t.Parallel() // mostly waits on lease timers, in a root of its own
	root := testRoot(t)
	a := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	b := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	// The lease begins no sooner than its LOCK was sent: timed from then,
	// not from the reply, which a loaded host can delay past the margin.
	start := time.Now()
	l := mustLock(t, a, "lease", "A", 300*time.Millisecond, backends.Write)
	l2, err := lock(t, b, "lease", "B", time.Second, 20*time.Second, backends.Write)
	if err != nil {
		t.Fatalf("waiter: %v", err)
	}
	if el := time.Since(start); el < 250*time.Millisecond {
		t.Errorf("granted %v after a 300 ms lease's LOCK was sent; want no sooner than the lease's end", el)
	}
	if l2.Fence <= l.Fence {
		t.Errorf("fence %d after %d", l2.Fence, l.Fence)
	}
	if v, _ := a.Renew(ctxT(t, 30*time.Second), "lease", "A", time.Second); v != 0 {
		t.Errorf("RENEW of an ended lease = %v; want 0", v)
	}
	// Renewed through the other instance: the creator's timer must not
	// delete it at the first lease's end. The first lease leaves the
	// RENEW (a ZooKeeper round trip on a loaded machine) time to land
	// inside it; the look comes past its end.
	unlock(t, b, "lease", "B")
	const first = 1500 * time.Millisecond
	locked := time.Now()
	mustLock(t, a, "lease2", "A", first, backends.Write)
	if v, err := b.Renew(ctxT(t, 30*time.Second), "lease2", "A", 5*time.Second); err != nil || v <= 0 {
		t.Fatalf("RENEW via b = %v, %v", v, err)
	}
	time.Sleep(time.Until(locked.Add(first + 400*time.Millisecond)))
	wantNotAcquired(t, b, "lease2", "B", backends.Write)
}

// TestFIFOHundredWaiters: 100 waiters queued one after another are granted
// in that order, and each release fires one watch.
func TestFIFOHundredWaiters(t *testing.T) {
	const n = 100
	root := testRoot(t)
	bs := []*Backend{
		newBackend(t, []string{zkAddr}, root, 10*time.Second),
		newBackend(t, []string{zkAddr}, root, 10*time.Second),
	}
	mustLock(t, bs[0], "fifo", "holder", 30*time.Second, backends.Write)
	dir := keyDir(root, "fifo")
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := bs[i%2]
			tok := fmt.Sprintf("w%d", i)
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			_, err := b.Lock(ctx, backends.LockRequest{Key: "fifo", Token: tok, TTL: 30 * time.Second, Wait: 80 * time.Second})
			if err != nil {
				errs <- fmt.Errorf("waiter %d: %w", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if ok, err := b.Unlock(ctx, "fifo", tok); !ok || err != nil {
				errs <- fmt.Errorf("waiter %d unlock = %v, %v", i, ok, err)
			}
		}()
		// Queue the next waiter only once this one's node exists.
		waitFor(t, fmt.Sprintf("waiter %d queued", i), func() bool {
			kids, _ := bs[0].children(context.Background(), dir)
			return len(kids) == i+2
		})
	}
	waitFor(t, "every waiter counted", func() bool { return bs[0].Waiting()+bs[1].Waiting() == n })
	if info, ok, err := bs[0].Info(ctxT(t, 30*time.Second), "fifo"); err != nil || !ok || info.Waiters != n/2 ||
		len(info.Holders) != 1 || info.Holders[0].Token != "holder" {
		t.Errorf("Info = %+v, %v, %v; want the holder and %d waiters here", info, ok, err, n/2)
	}
	if st := bs[0].NodeStates(); len(st) != 1 || st[0] != "addr="+zkAddr+",state=ok" {
		t.Errorf("NodeStates = %q", st)
	}
	w0 := bs[0].Wakeups() + bs[1].Wakeups()
	unlock(t, bs[0], "fifo", "holder")
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i, got := range order {
		if got != i {
			t.Fatalf("grant %d went to waiter %d; order %v", i, got, order)
		}
	}
	if len(order) != n {
		t.Fatalf("%d grants; want %d", len(order), n)
	}
	if w := bs[0].Waiting() + bs[1].Waiting(); w != 0 {
		t.Errorf("%d waiting after every grant; want 0", w)
	}
	// n releases (the holder's and n−1 waiters') each woke at most the
	// one waiter behind it.
	if w := bs[0].Wakeups() + bs[1].Wakeups() - w0; w > n {
		t.Errorf("%d watches fired for %d releases; want at most one per release", w, n)
	} else {
		t.Logf("%d watches fired for %d releases", w, n)
	}
}

// TestWaiterGivesUp: a waiter whose WAIT runs out or whose context ends
// leaves no node behind.
func TestWaiterGivesUp(t *testing.T) {
	root := testRoot(t)
	a := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	mustLock(t, a, "k", "A", 10*time.Second, backends.Write)
	if _, err := lock(t, a, "k", "B", time.Second, 200*time.Millisecond, backends.Write); !errors.Is(err, backends.ErrNotAcquired) {
		t.Fatalf("WAIT ran out = %v; want ErrNotAcquired", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := a.Lock(ctx, backends.LockRequest{Key: "k", Token: "C", TTL: time.Second, Wait: time.Minute}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("context ended = %v; want DeadlineExceeded", err)
	}
	waitFor(t, "abandoned nodes deleted", func() bool {
		kids, _ := a.children(context.Background(), keyDir(root, "k"))
		return len(kids) == 1
	})
	if _, ok, _ := a.Info(ctxT(t, 30*time.Second), "k"); !ok {
		t.Fatal("holder lost")
	}
}

// TestSessionExpiry cuts one instance's link to ZooKeeper past its session
// timeout: its renewals fail while suspended, the server expires the
// session and grants the lock to the other instance, and once back the
// first instance reports the lock not held and its waiter got an error.
func TestSessionExpiry(t *testing.T) {
	t.Parallel() // mostly waits on lease timers, in a root of its own
	root := testRoot(t)
	p := harness.StartLink(t, zkAddr)
	const session = 2 * time.Second
	a := newBackend(t, []string{p.Addr()}, root, session)
	b := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	l := mustLock(t, a, "exp", "A", 30*time.Second, backends.Write)
	if l.Validity > session {
		t.Errorf("validity %v above the session timeout %v", l.Validity, session)
	}
	mustLock(t, b, "exp2", "B", 30*time.Second, backends.Write)
	waiterErr := make(chan error, 1)
	go func() {
		_, err := a.Lock(context.Background(), backends.LockRequest{Key: "exp2", Token: "A2", TTL: time.Second, Wait: 60 * time.Second})
		waiterErr <- err
	}()
	waitFor(t, "a's waiter queued", func() bool {
		kids, _ := b.children(context.Background(), keyDir(root, "exp2"))
		return len(kids) == 2
	})

	p.Cut()
	cut := time.Now()
	waitFor(t, "a disconnected", func() bool { return !a.connected.Load() })
	if _, err := a.Renew(ctxT(t, 5*time.Second), "exp", "A", 30*time.Second); !errors.Is(err, quorum.ErrNoQuorum) {
		t.Errorf("RENEW while disconnected = %v; want a NOQUORUM error", err)
	}
	if _, err := lock(t, b, "exp", "B", time.Second, 60*time.Second, backends.Write); err != nil {
		t.Fatalf("b waiting for the expired session's lock: %v", err)
	}
	// The server last heard from a up to a ping interval (a third of the
	// session timeout) before the cut, so the session may end that much
	// sooner than a full timeout after it; not at once, though.
	if el := time.Since(cut); el < session/2 {
		t.Errorf("b granted %v after the cut; want no sooner than the session (%v) could expire", el, session)
	}
	p.Heal()
	select {
	case err := <-waiterErr:
		if !errors.Is(err, quorum.ErrNoQuorum) {
			t.Errorf("waiter of the expired session = %v; want a NOQUORUM error", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("waiter of the expired session still waiting")
	}
	waitFor(t, "a reconnected with a new session", func() bool { return a.connected.Load() })
	if v, err := a.Renew(ctxT(t, 30*time.Second), "exp", "A", time.Second); err != nil || v != 0 {
		t.Errorf("RENEW after expiry = %v, %v; want 0", v, err)
	}
	if ok := unlock(t, a, "exp", "A"); ok {
		t.Error("UNLOCK after expiry = true")
	}
	// The new session works.
	mustLock(t, a, "after", "A", time.Second, backends.Write)
}

// TestEnsembleOneServerDown: with one server of three killed, locks keep
// working and fences keep increasing across two instances.
func TestEnsembleOneServerDown(t *testing.T) {
	zs := harness.StartZooKeeperEnsemble(t, 3)
	addrs := harness.ZKAddrs(zs)
	root := testRoot(t)
	a := newBackend(t, addrs, root, 4*time.Second)
	b := newBackend(t, addrs, root, 4*time.Second)
	var last uint64
	round := func(phase string, n int) {
		for i := range n {
			via := []*Backend{a, b}[i%2]
			l, err := lock(t, via, "ens", "T", 5*time.Second, 10*time.Second, backends.Write)
			if err != nil {
				t.Fatalf("%s grant %d: %v", phase, i, err)
			}
			if l.Fence <= last {
				t.Fatalf("%s grant %d: fence %d after %d", phase, i, l.Fence, last)
			}
			last = l.Fence
			if ok, err := via.Unlock(ctxT(t, 10*time.Second), "ens", "T"); !ok || err != nil {
				t.Fatalf("%s unlock %d = %v, %v", phase, i, ok, err)
			}
		}
	}
	round("all up", 50)
	// Kill the leader: the hardest case (an election).
	for _, z := range zs {
		if m, _ := z.Mode(); m == "leader" {
			z.Kill()
			break
		}
	}
	waitFor(t, "a new leader", func() bool {
		for _, z := range zs {
			if m, _ := z.Mode(); m == "leader" {
				return true
			}
		}
		return false
	})
	waitFor(t, "sessions back", func() bool { return a.connected.Load() && b.connected.Load() })
	round("one down", 50)
}

// TestDigestACL: with a digest, lockproxy's nodes are readable and
// deletable only by that user.
func TestDigestACL(t *testing.T) {
	root := testRoot(t)
	b, err := New(Config{Servers: []string{zkAddr}, Root: root, SessionTimeout: 10 * time.Second,
		Digest: "lockproxy:s3cret", StartTimeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer b.Close()
	mustLock(t, b, "acl", "A", 10*time.Second, backends.Write)

	other, _, err := zk.Connect([]string{zkAddr}, 10*time.Second, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	dir := keyDir(root, "acl")
	kids, _, err := other.Children(dir)
	if !errors.Is(err, zk.ErrNoAuth) {
		t.Errorf("children of a key without credentials = %v, %v; want ErrNoAuth", kids, err)
	}
	if err := other.Delete(root, -1); !errors.Is(err, zk.ErrNoAuth) && !errors.Is(err, zk.ErrNotEmpty) {
		t.Errorf("delete of the root without credentials = %v; want refused", err)
	}
	if _, err := other.Create(root+"/intruder", nil, 0, zk.WorldACL(zk.PermAll)); !errors.Is(err, zk.ErrNoAuth) {
		t.Errorf("create under the root without credentials = %v; want ErrNoAuth", err)
	}
	// A second instance with the same digest shares the locks.
	b2, err := New(Config{Servers: []string{zkAddr}, Root: root, SessionTimeout: 10 * time.Second,
		Digest: "lockproxy:s3cret", StartTimeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer b2.Close()
	wantNotAcquired(t, b2, "acl", "B", backends.Write)
	if !unlock(t, b2, "acl", "A") {
		t.Error("UNLOCK through the second instance = false")
	}
}

// TestSuspendedThenBack: a link cut shorter than the session timeout
// suspends the instance's locks (renewals fail) without losing them; a
// lease that ended meanwhile is enforced once the link is back.
func TestSuspendedThenBack(t *testing.T) {
	t.Parallel() // mostly waits on lease timers, in a root of its own
	root := testRoot(t)
	link := harness.StartLink(t, zkAddr)
	a := newBackend(t, []string{link.Addr()}, root, 6*time.Second)
	b := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	long := mustLock(t, a, "long", "A", 30*time.Second, backends.Write)
	mustLock(t, a, "short", "A", 300*time.Millisecond, backends.Write)

	link.Cut()
	waitFor(t, "a disconnected", func() bool { return !a.connected.Load() })
	if _, err := a.Renew(ctxT(t, 5*time.Second), "long", "A", 30*time.Second); !errors.Is(err, quorum.ErrNoQuorum) {
		t.Errorf("RENEW while suspended = %v; want NOQUORUM", err)
	}
	wantNotAcquired(t, b, "short", "B", backends.Write) // its lease ended, but a cannot delete it yet
	link.Heal()
	waitFor(t, "a back", func() bool { return a.connected.Load() })
	if v, err := a.Renew(ctxT(t, 30*time.Second), "long", "A", 30*time.Second); err != nil || v <= 0 {
		t.Errorf("RENEW after the session came back = %v, %v; want the lock still held", v, err)
	}
	if _, err := lock(t, b, "short", "B", time.Second, 30*time.Second, backends.Write); err != nil {
		t.Errorf("LOCK of the lock whose lease ended while suspended = %v; want a grant once a is back", err)
	}
	if l := mustLock(t, a, "long", "A", 30*time.Second, backends.Write); l.Fence != long.Fence || l.Holds != 2 {
		t.Errorf("reentry after the session came back = %+v; want the same node", l)
	}
}

// TestNewFails: bad settings and an unreachable ensemble are errors from
// New, not a backend that never works.
func TestNewFails(t *testing.T) {
	dead := harness.RefusedAddr(t)
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no servers", Config{Root: "/x", SessionTimeout: time.Second}, "no servers"},
		{"relative root", Config{Servers: []string{zkAddr}, Root: "x", SessionTimeout: time.Second}, "absolute"},
		{"bad digest", Config{Servers: []string{zkAddr}, Root: "/x", SessionTimeout: time.Second, Digest: "nocolon"}, "user:password"},
		{"unreachable", Config{Servers: []string{dead}, Root: "/x", SessionTimeout: 2 * time.Second, StartTimeout: time.Second}, "no session with " + dead + " within 1s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := New(tt.cfg)
			if err == nil {
				b.Close()
				t.Fatalf("New = nil error; want %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New = %v; want it to say %q", err, tt.want)
			}
		})
	}
}
