package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	goredis "github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/test/harness"
)

// acquireAttempts is the number of acquire operations node 0 of b answered
// (lockproxy_node_request_duration_seconds{op="acquire"} sample count).
func acquireAttempts(t *testing.T, b *Backend) uint64 {
	t.Helper()
	var m dto.Metric
	if err := b.nodes[0].durations[opAcquire].(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// TestWaitHeadAttemptsWhileHeld: README promises "one attempt per release"
// for LOCK … WAIT. The head of a key's queue must not keep trying the nodes
// while the key stays held: releases are announced, and the fallback for an
// expiry is the holder's lease end, which the refusal reports. Its attempts
// are counted on node 0 while another token holds the key (write or read)
// for the whole 800 ms WAIT and nothing is released: the first attempt, and
// one more once the release announcements are subscribed (a release before
// that would have gone unheard). Before, the head tried every 20–200 ms
// (13 attempts in 1.5 s).
func TestWaitHeadAttemptsWhileHeld(t *testing.T) {
	// The count assumes the subscription is confirmed before the short
	// retry that covers the time until then (RetryMin), which a loaded
	// machine can delay past the default 20 ms.
	b, _ := newRealBackend(t, 3, func(c *Config) { c.RetryMin = 100 * time.Millisecond })
	ctx := ctxTimeout(t, 30*time.Second)
	for _, tc := range []struct {
		name         string
		holder, wait backends.Mode
	}{
		{"writer waits for a writer", backends.Write, backends.Write},
		{"writer waits for a reader", backends.Read, backends.Write},
		{"reader waits for a writer", backends.Write, backends.Read},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "held-" + tc.name
			// Counted from before the holder's grant, whose answer from
			// node 0 may come after the majority's: its one attempt on
			// node 0 is then not counted with the waiter's.
			before := acquireAttempts(t, b) + 1
			if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "holder", TTL: 20 * time.Second, Mode: tc.holder}); err != nil {
				t.Fatal(err)
			}
			_, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "waiter", TTL: 10 * time.Second, Wait: 800 * time.Millisecond, Mode: tc.wait})
			if err != backends.ErrNotAcquired {
				t.Fatalf("LOCK … WAIT = %v; want not acquired", err)
			}
			if attempts := acquireAttempts(t, b) - before; attempts > 2 {
				t.Errorf("one waiter made %d attempts in an 800 ms WAIT on a key held throughout (no release); want at most 2", attempts)
			}
		})
	}
}

// TestWaitReaderNotHeldBackByWriterThatLeft: a writer waiting with WAIT
// marks itself on the nodes (writer preference); when its client goes away
// it leaves the queue at once and takes its mark off the nodes, so the
// reader queued behind it, which shares the lock with the reader holding
// it, is let in at its first attempt. Before, the mark stayed for up to a
// second and the reader made 9 attempts.
func TestWaitReaderNotHeldBackByWriterThatLeft(t *testing.T) {
	b, _ := newRealBackend(t, 3)
	ctx := ctxTimeout(t, 30*time.Second)
	key := "rw"
	if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "r0", TTL: 20 * time.Second, Mode: backends.Read}); err != nil {
		t.Fatal(err)
	}
	wctx, leave := context.WithCancel(ctx)
	writer := make(chan error, 1)
	go func() {
		_, err := b.Lock(wctx, backends.LockRequest{Key: key, Token: "w", TTL: 10 * time.Second, Wait: 20 * time.Second})
		writer <- err
	}()
	waitFor(t, "writer queued", func() bool { return b.Waiting() == 1 })
	// The writer's first attempt marks it.
	waitFor(t, "writer tried", func() bool { return acquireAttempts(t, b) >= 2 })
	reader := make(chan error, 1)
	go func() {
		// A plain RLOCK (no TOKEN: it cannot join a hold, NoReentry). A
		// reader naming its token tries once out of its turn while
		// readers hold the key (waiter.mayJoin), which is not counted
		// here.
		_, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "r1", TTL: 10 * time.Second, Wait: 20 * time.Second, Mode: backends.Read, NoReentry: true})
		reader <- err
	}()
	waitFor(t, "reader queued", func() bool { return b.Waiting() == 2 })
	leave() // the writer's client went away
	if err := <-writer; err != backends.ErrNotAcquired {
		t.Fatalf("canceled writer: %v", err)
	}
	// The writer is answered at once, also while an attempt of its is
	// still on its way (attemptBy); it leaves the queue when that attempt
	// has ended, after which the attempt's answers are all counted.
	waitFor(t, "writer left the queue", func() bool { return b.Waiting() <= 1 })
	before := acquireAttempts(t, b)
	if err := <-reader; err != nil {
		t.Fatalf("reader: %v", err)
	}
	if n := acquireAttempts(t, b) - before; n > 1 {
		t.Errorf("the reader behind a writer whose client left made %d attempts before it was let in beside the holding reader; want 1", n)
	}
}

// TestWaitGrantedSoonAfterExpiry: an expiry is not announced; the head,
// which polls at most about once a second, tries when the lease that refused it ends, and is
// granted soon after, with no more than a few attempts.
func TestWaitGrantedSoonAfterExpiry(t *testing.T) {
	b, _ := newRealBackend(t, 3)
	ctx := ctxTimeout(t, 30*time.Second)
	const ttl = 700 * time.Millisecond
	start := time.Now()
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "expires", Token: "holder", TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	before := acquireAttempts(t, b)
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "expires", Token: "waiter", TTL: 10 * time.Second, Wait: 5 * time.Second}); err != nil {
		t.Fatalf("LOCK … WAIT behind a lease that expires = %v; want a grant", err)
	}
	// RetryMin of jitter, and room for a loaded machine.
	if after := time.Since(start) - ttl; after > 300*time.Millisecond {
		t.Errorf("granted %v after the holder's lease ended; want within 300 ms", after)
	}
	if n := acquireAttempts(t, b) - before; n > 4 {
		t.Errorf("the waiter made %d attempts; want at most 4 (the first, once subscribed, at the lease end, once more if a node's lease ends a little later)", n)
	}
}

// TestRefusalTellsLease: a refused attempt tells when the lease that
// refused it ends (the head's fallback for an expiry): the holder's, the
// longest reader's for a writer, what is left of a waiting writer's mark
// for a reader; nothing for a key without expiry.
func TestRefusalTellsLease(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 30*time.Second)
	acquire := func(t *testing.T, req quorum.Request) {
		t.Helper()
		if g, err := n.Acquire(ctx, req); err != nil || !g.Acquired {
			t.Fatalf("grant of %+v = %+v, %v", req, g, err)
		}
	}
	for _, tc := range []struct {
		name   string
		setup  func(t *testing.T, key string)
		mode   quorum.Mode
		want   time.Duration // 0: no lease told
		leased bool
	}{
		{"writer refused by a writer", func(t *testing.T, key string) {
			acquire(t, quorum.Request{Key: key, Token: "h", TTL: 8 * time.Second})
		}, quorum.Exclusive, 8 * time.Second, true},
		{"writer refused by readers: the longest lease", func(t *testing.T, key string) {
			acquire(t, quorum.Request{Key: key, Token: "r1", TTL: 6 * time.Second, Mode: quorum.Shared})
			acquire(t, quorum.Request{Key: key, Token: "r2", TTL: 3 * time.Second, Mode: quorum.Shared})
		}, quorum.Exclusive, 6 * time.Second, true},
		{"reader refused by a writer", func(t *testing.T, key string) {
			acquire(t, quorum.Request{Key: key, Token: "h", TTL: 4 * time.Second})
		}, quorum.Shared, 4 * time.Second, true},
		{"reader refused by a waiting writer's mark: its lease end plus the margin", func(t *testing.T, key string) {
			acquire(t, quorum.Request{Key: key, Token: "r1", TTL: 2 * time.Second, Mode: quorum.Shared})
			if g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: "w", TTL: time.Second, WriterWait: 30 * time.Second}); err != nil || g.Acquired {
				t.Fatalf("waiting writer = %+v, %v; want refused", g, err)
			}
		}, quorum.Shared, 2*time.Second + defaultMarkMargin*time.Millisecond, true},
		{"reader refused by an older lockproxy's mark", func(t *testing.T, key string) {
			direct.Set(ctx, "lp:lockw:"+key, "1", 5*time.Second)
		}, quorum.Shared, 5 * time.Second, true},
		{"key without expiry", func(t *testing.T, key string) {
			direct.Set(ctx, "lp:lock:"+key, "by hand", 0)
		}, quorum.Exclusive, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "told-" + strings.ReplaceAll(tc.name, " ", "-")
			tc.setup(t, key)
			rs := &refusals{}
			g, err := n.Acquire(withRefusals(ctx, rs), quorum.Request{Key: key, Token: "a", TTL: time.Second, Mode: tc.mode, WriterWait: time.Second})
			if err != nil || g.Acquired {
				t.Fatalf("attempt = %+v, %v; want refused", g, err)
			}
			until, ok := rs.until(1)
			if ok != tc.leased {
				t.Fatalf("lease told: %v; want %v", ok, tc.leased)
			}
			if left := time.Until(until); ok && (left > tc.want || left < tc.want-time.Second) {
				t.Errorf("lease left %v; want about %v", left, tc.want)
			}
		})
	}
}

// TestWriterMarksAreEachWriters: each waiting writer has its own mark, so
// one that leaves takes only its own away and readers stay queued behind
// the others; a granted writer takes its own away; a string mark left by
// an older lockproxy counts until it expires by itself.
func TestWriterMarksAreEachWriters(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 30*time.Second)
	read := func(key, tok string) bool {
		t.Helper()
		g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: tok, TTL: 10 * time.Second, Mode: quorum.Shared})
		if err != nil {
			t.Fatalf("RLOCK %s: %v", key, err)
		}
		return g.Acquired
	}
	wait := func(key, tok string, ttl time.Duration) bool {
		t.Helper()
		g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: tok, TTL: ttl, WriterWait: 10 * time.Second})
		if err != nil {
			t.Fatalf("LOCK %s by %s: %v", key, tok, err)
		}
		return g.Acquired
	}
	marked := func(key, tok string) bool {
		return direct.ZScore(ctx, "lp:lockw:"+key, tok).Err() == nil
	}
	unmark := func(key, tok string) {
		t.Helper()
		n.Unmark(key, tok)
		waitFor(t, tok+"'s mark gone", func() bool { return !marked(key, tok) })
	}

	t.Run("one leaves, the other still waits", func(t *testing.T) {
		key := "two-writers"
		if !read(key, "r0") || wait(key, "a", time.Second) || wait(key, "b", time.Second) {
			t.Fatal("want r0 granted, writers a and b refused")
		}
		unmark(key, "a")
		if read(key, "r1") {
			t.Error("reader r1 granted while writer b still waits")
		}
		unmark(key, "b")
		if !read(key, "r1") {
			t.Error("reader r1 refused once no writer waits")
		}
	})
	t.Run("a granted writer takes its mark away", func(t *testing.T) {
		key := "granted-writer"
		if !read(key, "r0") || wait(key, "a", time.Second) || wait(key, "b", time.Second) {
			t.Fatal("want r0 granted, writers a and b refused")
		}
		if ok, err := n.Release(ctx, key, "r0", quorum.AnyHold); !ok || err != nil {
			t.Fatalf("release of r0 = %v, %v", ok, err)
		}
		if !wait(key, "a", 100*time.Millisecond) {
			t.Fatal("writer a refused on a free key")
		}
		waitFor(t, "a's mark gone", func() bool { return !marked(key, "a") })
		if !marked(key, "b") {
			t.Error("writer b's mark went with a's grant")
		}
	})
	t.Run("an older lockproxy's string mark", func(t *testing.T) {
		key := "old-mark"
		direct.Set(ctx, "lp:lockw:"+key, "1", 500*time.Millisecond)
		if read(key, "r0") {
			t.Fatal("reader granted beside an older lockproxy's waiting writer")
		}
		if !read(key+"-other", "r0") || wait(key+"-other", "a", time.Second) {
			t.Fatal("setup of the other key")
		}
		// A new writer's mark keeps the old one as a member of its own.
		direct.Set(ctx, "lp:lockw:"+key, "1", 500*time.Millisecond)
		if wait(key, "a", time.Second) != true {
			t.Fatal("writer a refused on a free key")
		}
		if ty := direct.Type(ctx, "lp:lockw:"+key).Val(); ty != "string" {
			t.Errorf("a grant changed the older lockproxy's mark into a %s", ty)
		}
		held := key + "-held"
		direct.Set(ctx, "lp:lockw:"+held, "1", 500*time.Millisecond)
		if !wait(held, "h", 10*time.Second) || wait(held, "a", time.Second) {
			t.Fatal("want h granted, a refused")
		}
		if ty := direct.Type(ctx, "lp:lockw:"+held).Val(); ty != "zset" || !marked(held, "a") {
			t.Fatalf("lockw is a %s, a marked %v; want a sorted set with a's mark", ty, marked(held, "a"))
		}
		unmark(held, "a")
		if ok, err := n.Release(ctx, held, "h", quorum.AnyHold); !ok || err != nil {
			t.Fatalf("release of h = %v, %v", ok, err)
		}
		if read(held, "r0") {
			t.Error("reader granted while the older lockproxy's mark has not expired")
		}
		time.Sleep(550 * time.Millisecond)
		if !read(key, "r1") && !read(held, "r1") {
			t.Error("readers refused after the older lockproxy's mark expired")
		}
	})
}

// TestWaitReaderWokenWhenRemoteWriterLeaves: a reader waiting on one
// instance behind a writer waiting on another (writer preference) sleeps
// until the writer's mark would end; when the writer gives up, taking its
// mark away is announced like a release, and the reader is let in at
// once. Without the announcement it would wait for the mark's end (about
// the holding reader's 20 s lease), past its WAIT.
//
// The reader starts once the writer is marked on a majority of nodes:
// only there is it refused. The writer's attempt reaches the nodes one by
// one, and a reader started when n0 alone had the mark (as before) could
// reach the other two first and be granted at its first attempt on a
// loaded host, which the test took for a reader never woken ("reader
// tried twice: not within 5 s").
func TestWaitReaderWokenWhenRemoteWriterLeaves(t *testing.T) {
	a, rs := newRealBackend(t, 3)
	b := newBackendOn(t, rs)
	ctx := ctxTimeout(t, 30*time.Second)
	key := "remote-writer"
	setupLock(ctx, t, a, backends.LockRequest{Key: key, Token: "r0", TTL: 20 * time.Second, Mode: backends.Read})
	wctx, leave := context.WithCancel(ctx)
	writer := make(chan error, 1)
	go func() {
		_, err := a.Lock(wctx, backends.LockRequest{Key: key, Token: "w", TTL: 10 * time.Second, Wait: 20 * time.Second})
		writer <- err
	}()
	direct := make([]*goredis.Client, len(rs))
	for i, r := range rs {
		direct[i] = r.Client(t)
	}
	waitFor(t, "writer marked on a majority", func() bool {
		marked := 0
		for _, c := range direct {
			marked += int(c.Exists(ctx, "lp:lockw:"+key).Val())
		}
		return marked >= len(rs)/2+1
	})
	before := acquireAttempts(t, b)
	reader := make(chan error, 1)
	go func() {
		_, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "r1", TTL: 10 * time.Second, Wait: 10 * time.Second, Mode: backends.Read})
		reader <- err
	}()
	// Refused, then once more when its subscription is confirmed.
	waitFor(t, "reader tried twice", func() bool {
		select {
		case err := <-reader:
			t.Fatalf("reader returned (%v) after %d attempts, while the writer waited", err, acquireAttempts(t, b)-before)
		default:
		}
		return acquireAttempts(t, b)-before >= 2
	})
	time.Sleep(50 * time.Millisecond)
	leave()
	if err := <-writer; err != backends.ErrNotAcquired {
		t.Fatalf("canceled writer: %v", err)
	}
	left := time.Now()
	select {
	case err := <-reader:
		if err != nil {
			t.Fatalf("reader: %v", err)
		}
		if d := time.Since(left); d > 500*time.Millisecond {
			t.Errorf("reader let in %v after the writer left; want within 500 ms", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("reader not let in within 5 s of the writer leaving")
	}
}

// newBackendOn is a Backend over the nodes rs, with drift as lockproxy's
// default, its Config changed by tune: over nodes another Backend uses, a
// second lockproxy instance.
func newBackendOn(t *testing.T, rs []*harness.Redis, tune ...func(*Config)) *Backend {
	t.Helper()
	cfg := Config{RetryMin: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond,
		Quorum: quorum.Config{DriftFactor: 0.01, DriftMin: 2 * time.Millisecond}}
	for _, r := range rs {
		cfg.Nodes = append(cfg.Nodes, NodeConfig{Addr: r.Addr, KeyPrefix: "lp:", Timeout: time.Second, Metrics: NewMetrics(nil)})
	}
	for _, f := range tune {
		f(&cfg)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// TestWaitQueuesLiveSubscriptions: the head is signaled when the first
// node confirms the key's subscription while none had (a release before
// then went unheard), at the start or after every node's subscription was
// lost, and not for the others; hearsReleases says whether any is live.
func TestWaitQueuesLiveSubscriptions(t *testing.T) {
	type step struct {
		op     string // on, off (subscription confirmed, ended), lost (connection)
		node   int
		signal bool // the head is signaled
		heard  bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"first confirmation only", []step{
			{"on", 1, true, true}, {"on", 0, false, true}, {"on", 2, false, true},
		}},
		{"one node lost, another still live", []step{
			{"on", 0, true, true}, {"on", 1, false, true}, {"lost", 0, false, true}, {"on", 0, false, true},
		}},
		{"every node lost, then back", []step{
			{"on", 0, true, true}, {"on", 1, false, true}, {"lost", 0, false, true}, {"lost", 1, false, false},
			{"on", 1, true, true},
		}},
		{"unsubscribed", []step{
			{"on", 0, true, true}, {"off", 0, false, false}, {"on", 0, true, true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			qs := newWaitQueues(2, 0)
			head, _ := qs.join("k", false)
			<-head.turn // signaled at join: the queue was empty
			for i, s := range tc.steps {
				switch s.op {
				case "on", "off":
					qs.subscribed("k", s.node, s.op == "on")
				case "lost":
					qs.lost(s.node)
				}
				signaled := len(head.turn) > 0
				if signaled {
					<-head.turn
				}
				if signaled != s.signal || qs.hearsReleases("k") != s.heard {
					t.Errorf("step %d %s node %d: signaled %v, heard %v; want %v, %v", i, s.op, s.node, signaled, qs.hearsReleases("k"), s.signal, s.heard)
				}
			}
		})
	}
}

// TestWaitFairAcrossInstances: two backends over the same nodes, each with
// the same number of clients looping LOCK … WAIT / UNLOCK on one key. The
// grants per instance over a fixed number of rounds must be of the same
// order: the waiters of neither instance starve the other's. And no WAIT
// may run out while the key is released every few milliseconds: the
// heads, which sleep until the lease that refused them ends (as long as
// the WAIT here), must not sleep through releases. While any refusal's
// lease counted (not only a holder's on a majority), both instances' heads
// were refused by each other's attempts in a split vote, whose grants are
// rolled back unannounced, and slept until their WAIT ran out.
func TestWaitFairAcrossInstances(t *testing.T) {
	a, rs := newRealBackend(t, 3)
	b := newBackendOn(t, rs)
	const rounds, perInstance = 100, 4
	var (
		total   atomic.Int64
		grants  [2]atomic.Int64
		timeout [2]atomic.Int64
		wg      sync.WaitGroup
	)
	ctx := ctxTimeout(t, 60*time.Second)
	deadline := time.Now().Add(40 * time.Second)
	for inst, be := range []*Backend{a, b} {
		for c := range perInstance {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; total.Load() < rounds && time.Now().Before(deadline); i++ {
					tok := fmt.Sprintf("i%dc%dn%d", inst, c, i)
					_, err := be.Lock(ctx, backends.LockRequest{Key: "fair", Token: tok, TTL: 5 * time.Second, Wait: 5 * time.Second})
					if err != nil {
						timeout[inst].Add(1)
						continue
					}
					grants[inst].Add(1)
					total.Add(1)
					_, _ = be.Unlock(ctx, "fair", tok)
				}
			}()
		}
	}
	wg.Wait()
	ga, gb := grants[0].Load(), grants[1].Load()
	t.Logf("grants: instance A %d, instance B %d; WAITs run out: A %d, B %d", ga, gb, timeout[0].Load(), timeout[1].Load())
	if min(ga, gb)*3 < max(ga, gb) {
		t.Errorf("grants per instance A %d, B %d: one instance's waiters starved by the other's", ga, gb)
	}
	if ta, tb := timeout[0].Load(), timeout[1].Load(); ta+tb > 0 {
		t.Errorf("%d and %d WAITs of 5 s ran out on instances A and B while the key was released every few ms; want none", ta, tb)
	}
}

// TestWaitSubscriptionBackAfterNodeRestart: a node restart drops its
// subscription connection; while a key stays contended the subscriber must
// dial again and subscribe the key again, so that the node's announcements
// wake waiters again (the head sleeps until the lease end otherwise).
func TestWaitSubscriptionBackAfterNodeRestart(t *testing.T) {
	b, rs := newRealBackend(t, 3)
	ctx := ctxTimeout(t, 60*time.Second)
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "rs", Token: "holder", TTL: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	go func() {
		_, _ = b.Lock(ctx, backends.LockRequest{Key: "rs", Token: "waiter", TTL: 10 * time.Second, Wait: 25 * time.Second})
	}()
	numsub := func(r *harness.Redis) int64 {
		c := r.Client(t)
		defer c.Close()
		m, err := c.PubSubNumSub(context.Background(), "lp:released:rs").Result()
		if err != nil {
			return -1
		}
		return m["lp:released:rs"]
	}
	waitFor(t, "subscribed on node 0", func() bool { return numsub(rs[0]) == 1 })
	rs[0].Restart()
	var got int64
	for end := time.Now().Add(8 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if got = numsub(rs[0]); got == 1 {
			return
		}
	}
	t.Errorf("node 0's subscribers of the contended key 8 s after its restart: %d; want 1", got)
}

// TestWaitManyKeysSubscriptionsEnd: waiters on many contended keys, some
// granted and some running out of WAIT, leave no subscription, queue or
// early timer behind.
func TestWaitManyKeysSubscriptionsEnd(t *testing.T) {
	b, rs := newRealBackend(t, 3)
	ctx := ctxTimeout(t, 60*time.Second)
	const keys = 200
	var wg sync.WaitGroup
	for k := range keys {
		key := fmt.Sprintf("mk%d", k)
		if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "h", TTL: 20 * time.Second}); err != nil {
			t.Fatal(err)
		}
		for w := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				wait := 300 * time.Millisecond
				if w == 0 {
					wait = 10 * time.Second
				}
				tok := fmt.Sprintf("w%d", w)
				if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: tok, TTL: 5 * time.Second, Wait: wait}); err == nil {
					_, _ = b.Unlock(ctx, key, tok)
				}
			}()
		}
	}
	time.Sleep(500 * time.Millisecond)
	for k := range keys {
		_, _ = b.Unlock(ctx, fmt.Sprintf("mk%d", k), "h")
	}
	wg.Wait()
	if n := b.Waiting(); n != 0 {
		t.Errorf("Waiting() = %d; want 0", n)
	}
	b.waiters.mu.Lock()
	left := len(b.waiters.keys)
	b.waiters.mu.Unlock()
	if left != 0 {
		t.Errorf("%d key queues left; want 0", left)
	}
	for i, r := range rs {
		c := r.Client(t)
		var chans []string
		for range 100 {
			chans, _ = c.PubSubChannels(ctx, "lp:released:*").Result()
			if len(chans) == 0 {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if len(chans) != 0 {
			t.Errorf("node %d: %d release channels still subscribed after every waiter left", i, len(chans))
		}
	}
}

// TestRefusalReply: a refused attempt's answer, with its lease and holder,
// as the writer reads it; a malformed one is an error, never a grant.
func TestRefusalReply(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    opResult
		wantErr bool
	}{
		{in: "*3\r\n:-1\r\n:500\r\n$1\r\nh\r\n", want: opResult{n: acquireRefused, lease: 500, leased: true, holder: "h"}},
		{in: "*3\r\n:-1\r\n:-1\r\n$1\r\nh\r\n", want: opResult{n: acquireRefused, holder: "h"}},
		{in: "*2\r\n:-1\r\n:500\r\n", wantErr: true},
		{in: "*3\r\n:-1\r\n:-5\r\n$1\r\nh\r\n", wantErr: true},
		{in: "*3\r\n:-1\r\n:5\r\n:1\r\n", wantErr: true},
		{in: "*3\r\n:-1\r\n:5\r\n$-1\r\n", wantErr: true},
	} {
		var r reply
		if err := replyConn(tc.in).read(&r); err != nil {
			t.Fatalf("read(%q): %v", tc.in, err)
		}
		got := acquireResult(&r)
		if (got.err != nil) != tc.wantErr || (!tc.wantErr && got != tc.want) {
			t.Errorf("acquireResult(%q) = %+v; want %+v (error %v)", tc.in, got, tc.want, tc.wantErr)
		}
	}
}

// TestRefusalsUntil: the head sleeps until a lease ends only when one
// holder refused it on a majority of nodes; votes split between attempts
// (whose grants are rolled back unannounced) or holds of unknown lease
// leave it to the short retry.
func TestRefusalsUntil(t *testing.T) {
	ms := func(d int) opResult {
		return opResult{n: acquireRefused, lease: int64(d), leased: true, holder: "h"}
	}
	by := func(r opResult, holder string) opResult { r.holder = holder; return r }
	for _, tc := range []struct {
		name    string
		answers []opResult
		want    time.Duration // 0: not told
	}{
		{"one holder on every node: its earliest end", []opResult{ms(5000), ms(4000), ms(4500)}, 4 * time.Second},
		{"one holder on a majority, a stale hold on the third", []opResult{ms(5000), ms(4900), by(ms(100), "stale")}, 4900 * time.Millisecond},
		{"split between attempts", []opResult{ms(5000), by(ms(5000), "other"), by(ms(3000), "stale")}, 0},
		{"one holder, but a node granted and one failed", []opResult{ms(5000), {n: 7, holds: 1}, {err: context.DeadlineExceeded}}, 0},
		{"no expiry", []opResult{{n: acquireRefused, holder: "h"}, {n: acquireRefused, holder: "h"}, ms(300)}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := &refusals{}
			ctx := withRefusals(context.Background(), rs)
			for _, a := range tc.answers {
				noteAnswer(ctx, nil, a)
			}
			until, ok := rs.until(2)
			if ok != (tc.want > 0) {
				t.Fatalf("until(2) told a lease: %v; want %v", ok, tc.want > 0)
			}
			if left := time.Until(until); ok && (left > tc.want || left < tc.want-time.Second) {
				t.Errorf("until(2) = %v from now; want %v", left, tc.want)
			}
		})
	}
}

// TestLateRefusalOfGrantedWriterTakesMarkOff: a waiting writer granted by
// a majority may be refused by a node whose answer comes after the grant
// (and after its caller was answered): that node's mark of it must come
// off at once, or it keeps readers out until it ends (seconds). Before,
// such marks from writers long done starved the readers of
// test/e2e TestReadWriteAcceptance (34 grants/s, WAITs running out).
func TestLateRefusalOfGrantedWriterTakesMarkOff(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 30*time.Second)
	key := "late-refusal"
	if g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: "h", TTL: 10 * time.Second}); err != nil || !g.Acquired {
		t.Fatalf("holder = %+v, %v", g, err)
	}
	rs := &refusals{}
	// The other nodes granted: the writer's Lock returned.
	if now := rs.won([]*Node{n}, false, key, "w"); len(now) != 0 {
		t.Fatalf("won before any refusal = %d nodes to unmark; want none", len(now))
	}
	g, err := n.Acquire(withRefusals(ctx, rs), quorum.Request{Key: key, Token: "w", TTL: 10 * time.Second, WriterWait: 10 * time.Second})
	if err != nil || g.Acquired {
		t.Fatalf("late attempt = %+v, %v; want refused", g, err)
	}
	waitFor(t, "the late refusal's mark taken off", func() bool {
		return direct.Exists(ctx, "lp:lockw:"+key).Val() == 0
	})
}

// setupLock takes req for a test's set-up, where what is tested comes
// later: a first LOCK against just-started nodes on a loaded host can miss
// its 250 ms node timeout (NOQUORUM), and is tried again, at most three
// times; any other refusal fails the test.
func setupLock(ctx context.Context, t *testing.T, b *Backend, req backends.LockRequest) {
	t.Helper()
	for try := 1; ; try++ {
		_, err := b.Lock(ctx, req)
		if err == nil {
			return
		}
		if !errors.Is(err, quorum.ErrNoQuorum) || try == 3 {
			t.Fatalf("set-up LOCK %s (try %d): %v", req.Key, try, err)
		}
		t.Logf("set-up LOCK %s (try %d): %v; trying again", req.Key, try, err)
	}
}

// NewBackendOn is newBackendOn, with every node timeout set to timeout
// (nodeTimeouts), for the tests outside the package.
func NewBackendOn(t *testing.T, rs []*harness.Redis, timeout time.Duration, tune ...func(*Config)) *Backend {
	t.Helper()
	return newBackendOn(t, rs, append([]func(*Config){nodeTimeouts(timeout)}, tune...)...)
}
