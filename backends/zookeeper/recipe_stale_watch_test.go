package zookeeper

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestOpsFindTokenRelockedElsewhere: a token's lock was released through
// another instance and taken again through it (a new node). The instance
// that created the first node still has its copy of that node; an UNLOCK
// or RENEW of the token through it must find the token's current node,
// not answer "not held" while the token holds the key.
func TestOpsFindTokenRelockedElsewhere(t *testing.T) {
	root := testRoot(t)
	a := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	b := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	ctx := ctxT(t, 60*time.Second)
	for _, tc := range []struct {
		name string
		op   func(key string) (bool, error) // true: the op found the hold
		left int64                          // holds of the token after op
	}{
		{"UNLOCK", func(key string) (bool, error) { return a.Unlock(ctx, key, "T") }, 0},
		{"UnlockHold", func(key string) (bool, error) { return a.UnlockHold(ctx, key, "T", backends.Write) }, 0},
		{"RENEW", func(key string) (bool, error) {
			v, err := a.Renew(ctx, key, "T", 5*time.Second)
			return v > 0, err
		}, 1},
		{"RenewHold", func(key string) (bool, error) {
			v, err := a.RenewHold(ctx, key, "T", backends.Write, 5*time.Second)
			return v > 0, err
		}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "relocked-" + tc.name
			mustLock(t, a, key, "T", 30*time.Second, backends.Write) // a made the node and keeps a copy
			if !unlock(t, b, key, "T") {
				t.Fatal("UNLOCK through b = false")
			}
			if l := mustLock(t, b, key, "T", 30*time.Second, backends.Write); l.Holds != 1 { // a new node, made by b
				t.Fatalf("relock through b = %+v; want a first grant", l)
			}
			if ok, err := tc.op(key); !ok || err != nil {
				info, held, _ := b.Info(ctx, key)
				t.Fatalf("%s through a = %v, %v; want true: T holds %q (held=%v, %+v)", tc.name, ok, err, key, held, info)
			}
			info, held, err := b.Info(ctx, key)
			switch {
			case err != nil:
				t.Fatalf("Info: %v", err)
			case tc.left == 0 && held:
				t.Errorf("after %s: %+v; want the key free", tc.name, info)
			case tc.left > 0 && (!held || info.Holders[0].Holds != tc.left):
				t.Errorf("after %s: held=%v %+v; want T with %d holds", tc.name, held, info, tc.left)
			}
		})
	}
}

// watchCount is the server's zk_watch_count (mntr). The package's tests
// share one server and run one at a time, and a closed backend's watches
// go with its session: a test compares the count before and after.
func watchCount(t *testing.T) int {
	t.Helper()
	out, err := harness.FourLetter(zkAddr, "mntr", 5*time.Second)
	if err != nil {
		t.Fatalf("mntr: %v", err)
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "zk_watch_count" {
			n, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatalf("mntr: zk_watch_count %q", f[1])
			}
			return n
		}
	}
	t.Fatalf("mntr without zk_watch_count: %q", out)
	return 0
}

// TestVanishedBlockerLeavesNoWatch: a waiter whose blocker is deleted
// between its children read and its watch must not leave a watch on the
// gone path: names are never reused, so a creation watch would never fire
// and would stay (on the server, in go-zookeeper, resent on every
// reconnect) for the session's life: memory growing without bound.
func TestVanishedBlockerLeavesNoWatch(t *testing.T) {
	root := testRoot(t)
	a := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	b := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	before := watchCount(t)
	const rounds = 20
	for i := range rounds {
		key := "v" + strconv.Itoa(i)
		mustLock(t, b, key, "H", 30*time.Second, backends.Write)
		var once sync.Once
		a.testBeforeWatch = func(string) { once.Do(func() { unlock(t, b, key, "H") }) }
		_, err := lock(t, a, key, "W", 30*time.Second, 30*time.Second, backends.Write)
		a.testBeforeWatch = nil
		if err != nil {
			t.Fatalf("round %d: waiter: %v", i, err)
		}
		if !unlock(t, a, key, "W") {
			t.Fatalf("round %d: UNLOCK = false", i)
		}
	}
	time.Sleep(200 * time.Millisecond) // the last deletes' watch events are sent
	if after := watchCount(t); after > before {
		t.Errorf("zk_watch_count %d before, %d after %d waits whose blocker vanished before the watch, every node gone; want none left",
			before, after, rounds)
	}
}

// TestContentionLeavesNoWatch: plain contention (waiters and try-locks on
// two instances, no hook); once every lock is released no watch is left.
func TestContentionLeavesNoWatch(t *testing.T) {
	root := testRoot(t)
	bs := []*Backend{newBackend(t, []string{zkAddr}, root, 10*time.Second), newBackend(t, []string{zkAddr}, root, 10*time.Second)}
	before := watchCount(t)
	const workers, each = 16, 25
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			via := bs[w%2]
			for i := range each {
				tok := "w" + strconv.Itoa(w) + "-" + strconv.Itoa(i)
				wait := 60 * time.Second
				if w%4 != 0 {
					wait = 0 // a try-lock (SET NX): its node comes and goes
				}
				mode := backends.Write
				if w%3 == 1 {
					mode = backends.Read
				}
				ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
				_, err := via.Lock(ctx, backends.LockRequest{Key: "hot", Token: tok, TTL: 10 * time.Second, Wait: wait, Mode: mode})
				if errors.Is(err, backends.ErrNotAcquired) {
					cancel()
					continue
				}
				if err != nil {
					cancel()
					t.Errorf("LOCK %s = %v; want a grant", tok, err)
					return
				}
				ok, err := via.Unlock(ctx, "hot", tok)
				cancel()
				if !ok || err != nil {
					t.Errorf("UNLOCK %s = %v, %v; want true", tok, ok, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	time.Sleep(200 * time.Millisecond)
	if after := watchCount(t); after > before {
		t.Errorf("zk_watch_count %d before, %d after %d LOCKs, every lock released; want none left", before, after, workers*each)
	}
}

// TestRenewalWakesNoWaiter: a renewal, or a repeat LOCK, of the holder
// releases nothing. Readers queued behind a write holder must not be woken
// by it: with N readers each renewal (every TTL/3 under KEEPALIVE) would
// cost N wakeups and N children reads, N² requests. A writer queued right
// behind the holder may see the change, but only re-arms its watch: one
// request, no children read, not a wakeup.
func TestRenewalWakesNoWaiter(t *testing.T) {
	t.Parallel() // mostly waits on lease timers, in a root of its own
	root := testRoot(t)
	a := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	b := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	ctx := ctxT(t, 60*time.Second)
	for _, tc := range []struct {
		name    string
		readers int  // queued behind the holder
		writer  bool // a writer queued right behind the holder, before the readers
		change  func(key string) error
	}{
		{"readers, RENEW", 10, false, func(key string) error {
			v, err := a.Renew(ctx, key, "W", 30*time.Second)
			if err == nil && v <= 0 {
				err = errors.New("not held")
			}
			return err
		}},
		{"readers, repeat LOCK", 10, false, func(key string) error {
			_, err := lock(t, a, key, "W", 30*time.Second, 0, backends.Write)
			return err
		}},
		{"writer, RENEW", 0, true, func(key string) error {
			_, err := a.Renew(ctx, key, "W", 30*time.Second)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "hot-" + strings.ReplaceAll(tc.name, " ", "-")
			mustLock(t, a, key, "W", 30*time.Second, backends.Write)
			var wg sync.WaitGroup
			queue := func(token string, mode backends.Mode, n int) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: token, TTL: 30 * time.Second,
						Wait: 50 * time.Second, Mode: mode}); err != nil {
						t.Errorf("waiter %s: %v", token, err)
						return
					}
					if ok, err := b.Unlock(ctx, key, token); !ok || err != nil {
						t.Errorf("UNLOCK %s = %v, %v", token, ok, err)
					}
				}()
				waitFor(t, token+" queued", func() bool { return b.Waiting() == n })
			}
			n := 0
			if tc.writer {
				n++
				queue("X", backends.Write, n)
			}
			for i := range tc.readers {
				n++
				queue("R"+strconv.Itoa(i), backends.Read, n)
			}
			time.Sleep(200 * time.Millisecond) // their watches set
			w0, r0 := b.Wakeups(), b.rearms.Load()
			const changes = 3
			for range changes {
				if err := tc.change(key); err != nil {
					t.Fatalf("change of the holder: %v", err)
				}
				time.Sleep(200 * time.Millisecond) // a woken waiter would look again now
			}
			woken, rearmed := b.Wakeups()-w0, b.rearms.Load()-r0
			for unlock(t, a, key, "W") {
			}
			wg.Wait()
			if woken != 0 {
				t.Errorf("%d changes of the holder woke %d waiters (of %d); want none", changes, woken, n)
			}
			switch {
			case tc.writer && rearmed > changes:
				t.Errorf("%d changes of the holder made the writer behind it re-arm %d times; want at most one each", changes, rearmed)
			case !tc.writer && rearmed != 0:
				t.Errorf("%d changes of the holder made readers re-arm %d times; want none", changes, rearmed)
			}
		})
	}
}

// TestSameTokenWaitersReenter: two LOCKs of one token that both have to
// wait (two connections sharing a token, or through two instances): once
// the first is granted the second is a repeat LOCK, as it would be had it
// come after the grant, not a waiter queued behind its own token's hold
// until that is released.
func TestSameTokenWaitersReenter(t *testing.T) {
	root := testRoot(t)
	a := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	b := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	for _, tc := range []struct {
		name   string
		second *Backend
		mode   backends.Mode // of the second LOCK
		holds  int64
		err    error
	}{
		{"same instance, write", a, backends.Write, 2, nil},
		{"other instance, write", b, backends.Write, 2, nil},
		{"other instance, read (downgrade)", b, backends.Read, 1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "same-" + strings.NewReplacer(" ", "-", ",", "", "(", "", ")", "").Replace(tc.name)
			dir := keyDir(root, key)
			mustLock(t, b, key, "H", 30*time.Second, backends.Write)
			type res struct {
				l   backends.Lease
				err error
			}
			first, second := make(chan res, 1), make(chan res, 1)
			go func() {
				l, err := lock(t, a, key, "T", 30*time.Second, 20*time.Second, backends.Write)
				first <- res{l, err}
			}()
			waitFor(t, "the first LOCK queued", func() bool { return a.Waiting() == 1 })
			go func() {
				l, err := lock(t, tc.second, key, "T", 30*time.Second, 20*time.Second, tc.mode)
				second <- res{l, err}
			}()
			waitFor(t, "the second LOCK queued", func() bool { return a.Waiting()+b.Waiting() == 2 })
			time.Sleep(100 * time.Millisecond) // its watch set
			unlock(t, b, key, "H")
			r1 := <-first
			if r1.err != nil || r1.l.Holds != 1 {
				t.Fatalf("first LOCK = %+v, %v; want a first grant", r1.l, r1.err)
			}
			select {
			case r2 := <-second:
				if r2.err != nil || r2.l.Holds != tc.holds || r2.l.Fence != r1.l.Fence {
					t.Errorf("second LOCK = %+v, %v; want %d holds on fence %d", r2.l, r2.err, tc.holds, r1.l.Fence)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("second LOCK still waiting 5s after the first was granted; want it granted as a repeat LOCK")
			}
			if k, _ := a.children(context.Background(), dir); len(k) != 1 {
				t.Errorf("children = %+v; want the one node of T", k)
			}
			for unlock(t, a, key, "T") {
			}
		})
	}
}

// TestWaitersSurviveLeaderChange: waiters queued before the ensemble's
// leader is killed keep their places (go-zookeeper sets their watches
// again on the server their session moves to) and are granted in order
// once the holder releases after the election.
func TestWaitersSurviveLeaderChange(t *testing.T) {
	zs := harness.StartZooKeeperEnsemble(t, 3)
	addrs := harness.ZKAddrs(zs)
	root := testRoot(t)
	a := newBackend(t, addrs, root, 6*time.Second)
	b := newBackend(t, addrs, root, 6*time.Second)
	mustLock(t, b, "lc", "H", 60*time.Second, backends.Write)
	const n = 3
	got := make(chan int, n)
	errs := make(chan error, n)
	for i := range n {
		go func() {
			l, err := a.Lock(context.Background(), backends.LockRequest{Key: "lc", Token: "W" + strconv.Itoa(i), TTL: 60 * time.Second, Wait: 60 * time.Second})
			if err != nil {
				errs <- err
				return
			}
			got <- i
			for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
				if ok, err := a.Unlock(ctxT(t, 10*time.Second), "lc", l.Token); ok || err == nil {
					return
				}
			}
		}()
		waitFor(t, "waiter queued", func() bool { return a.Waiting() == i+1 })
	}
	for _, z := range zs {
		if m, _ := z.Mode(); m == "leader" {
			z.Kill()
			break
		}
	}
	waitFor(t, "sessions back", func() bool { return a.Ready(context.Background()) == nil && b.Ready(context.Background()) == nil })
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ok, err := b.Unlock(ctxT(t, 10*time.Second), "lc", "H")
		if ok {
			break
		}
		if err == nil {
			t.Fatal("holder's UNLOCK after the election = false")
		}
		if time.Now().After(end) {
			t.Fatalf("holder's UNLOCK after the election: %v", err)
		}
	}
	for i := range n {
		select {
		case w := <-got:
			if w != i {
				t.Errorf("grant %d went to waiter %d", i, w)
			}
		case err := <-errs:
			t.Errorf("a waiter failed across the leader change: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatalf("grant %d: no waiter granted within 30s", i)
		}
	}
}

// replyDropper is a TCP proxy in front of one server that can drop, for
// the connections open at the time, only the server's replies: a request
// gets through and is applied, its answer is lost.
type replyDropper struct {
	ln      net.Listener
	mu      sync.Mutex
	n, drop int
}

func startReplyDropper(t *testing.T, up string) *replyDropper {
	d := &replyDropper{}
	d.ln = startRelay(t, up, func(c, s net.Conn) {
		d.mu.Lock()
		d.n++
		id := d.n
		d.mu.Unlock()
		done := make(chan struct{})
		go func() { defer close(done); io.Copy(s, c); s.Close(); c.Close() }()
		defer func() { <-done }() // after the closes below
		defer c.Close()
		defer s.Close()
		buf := make([]byte, 32<<10)
		for {
			k, err := s.Read(buf)
			d.mu.Lock()
			dropping := id <= d.drop
			d.mu.Unlock()
			if k > 0 && !dropping {
				if _, err := c.Write(buf[:k]); err != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
	return d
}

// dropOpen drops the replies on every connection open now.
func (d *replyDropper) dropOpen() { d.mu.Lock(); d.drop = d.n; d.mu.Unlock() }

// TestLostCreateAnswerLeavesNoNode: a LOCK whose create (a write node's,
// with its gate) is applied but whose answer is lost fails, and its node,
// which would hold the key for nobody, is gone as soon as the instance
// reconnects, well before its session could end; so is its gate. Once
// with the connection given up while the LOCK waits for the answer, once
// with the client gone (context done) before that.
func TestLostCreateAnswerLeavesNoNode(t *testing.T) {
	t.Parallel() // mostly waits on lease timers, in a root of its own
	root := testRoot(t)
	const session = 2 * time.Second // the LOCK's connection is given up after 2/3 of it
	b := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	for _, tc := range []struct {
		name string
		ctx  time.Duration // the LOCK's context
	}{
		{"connection given up", 30 * time.Second},
		{"context ends first", 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "lost-" + strings.ReplaceAll(tc.name, " ", "-")
			d := startReplyDropper(t, zkAddr)
			a := newBackend(t, []string{d.ln.Addr().String()}, root, session)
			mustLock(t, b, key, "PRE", time.Second, backends.Write) // the key's container exists
			unlock(t, b, key, "PRE")
			d.dropOpen()
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), tc.ctx)
			defer cancel()
			if l, err := a.Lock(ctx, backends.LockRequest{Key: key, Token: "A", TTL: 30 * time.Second, Wait: time.Minute}); err == nil {
				t.Fatalf("LOCK whose answer was lost = %+v; want an error", l)
			}
			if _, err := lock(t, b, key, "B", 5*time.Second, 20*time.Second, backends.Write); err != nil {
				t.Fatalf("rival: %v", err)
			}
			if el := time.Since(start); el > 2*session {
				t.Errorf("rival granted %v after the lost create; want well before the session (%v) could end", el, session)
			}
			if kids, _ := b.children(context.Background(), keyDir(root, key)); len(kids) != 1 {
				t.Errorf("children = %+v; want only the rival's", kids)
			}
			unlock(t, b, key, "B")
			waitFor(t, "no gate left", func() bool {
				gates, _, err := b.conn.Children(gatesDir(root))
				return err == nil && len(gates) == 0
			})
		})
	}
}
