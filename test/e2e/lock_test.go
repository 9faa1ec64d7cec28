package e2e

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

var hexToken = regexp.MustCompile(`^[0-9a-f]{32}$`)

// checkGrant checks the shape of a fresh grant of a lease of ttlMS.
func checkGrant(t *testing.T, what string, g lockclient.Grant, ttlMS int64) {
	t.Helper()
	if g.ValidityMS <= 0 || g.ValidityMS > maxValidityMS(ttlMS) {
		t.Errorf("%s: validity_ms = %d; want in (0, %d]", what, g.ValidityMS, maxValidityMS(ttlMS))
	}
	if g.Fence <= 0 {
		t.Errorf("%s: fence = %d; want > 0", what, g.Fence)
	}
	if g.Token == "" {
		t.Errorf("%s: empty token", what)
	}
}

func TestLockContendUnlockRenew(t *testing.T) {
	t.Parallel()
	eachSize(t, func(t *testing.T, n int) {
		cl := startCluster(t, n)
		addr, _ := startProxy(t, cl.addrs())
		c1 := lc.NewClient(t, addr, 2)
		c2 := lc.NewClient(t, addr, 2)
		key := "semantics-" + lockclient.RandID()

		g := cl.lockOnAllNodes(t, c1, key, "PX", 10000)
		checkGrant(t, "LOCK PX 10000", g, 10000)
		if !hexToken.MatchString(g.Token) {
			t.Errorf("LOCK %q token = %q; want 32 hex digits (128 random bits)", key, g.Token)
		}

		// Contention, from another connection and from the same one.
		for _, c := range []lockclient.Doer{c2, c1} {
			if g2, ok := lc.Lock(t, c, key, "PX", 10000); ok {
				t.Errorf("second LOCK %q = %+v; want nil while held", key, g2)
			}
		}

		steps := []struct {
			name string
			args []any
			want func(int64) bool
			desc string
		}{
			{"RENEW with the token", []any{"RENEW", key, g.Token, "PX", 10000},
				func(v int64) bool { return v > 0 && v <= maxValidityMS(10000) }, "in (0, 9898]"},
			{"RENEW EX with the token", []any{"RENEW", key, g.Token, "EX", 20},
				func(v int64) bool { return v > 0 && v <= maxValidityMS(20000) }, "in (0, 19798]"},
			{"RENEW with another token", []any{"RENEW", key, "not-the-token", "PX", 10000},
				func(v int64) bool { return v == 0 }, "0"},
			{"UNLOCK with the token", []any{"UNLOCK", key, g.Token}, func(v int64) bool { return v == 1 }, "1"},
			{"UNLOCK again", []any{"UNLOCK", key, g.Token}, func(v int64) bool { return v == 0 }, "0"},
			{"RENEW after UNLOCK", []any{"RENEW", key, g.Token, "PX", 10000},
				func(v int64) bool { return v == 0 }, "0"},
		}
		for _, s := range steps {
			if got := lc.IntCmd(t, c1, s.args...); !s.want(got) {
				t.Errorf("%s: %v = %d; want %s", s.name, s.args, got, s.desc)
			}
		}
		for i := range cl.nodes {
			if v, ok := cl.lockValue(t, i, key); ok {
				t.Errorf("node %d: lock key still holds %q after UNLOCK", i, v)
			}
		}

		// Free again: the other client gets it, with a higher fence.
		g2 := lc.MustLock(t, c2, key, "PX", 10000)
		if g2.Fence <= g.Fence {
			t.Errorf("fence after re-LOCK = %d; want > %d", g2.Fence, g.Fence)
		}
		if got := lc.Unlock(t, c2, key, g2.Token); got != 1 {
			t.Errorf("UNLOCK = %d; want 1", got)
		}

		// TOKEN: the client's token is used, on every node.
		tok := "client-token-" + lockclient.RandID()
		g3 := cl.lockOnAllNodes(t, c1, key, "PX", 10000, "TOKEN", tok)
		if g3.Token != tok {
			t.Errorf("LOCK %q TOKEN %q: token = %q; want %q", key, tok, g3.Token, tok)
		}
		if got := lc.Unlock(t, c1, key, tok); got != 1 {
			t.Errorf("UNLOCK %q %q = %d; want 1", key, tok, got)
		}

		// The default lease (30 s) when neither PX nor EX is given.
		g4 := lc.MustLock(t, c1, key)
		checkGrant(t, "LOCK without PX", g4, 30000)
		if g4.ValidityMS <= 10000 {
			t.Errorf("LOCK without PX: validity_ms = %d; want the 30 s default lease", g4.ValidityMS)
		}
		if got := lc.Unlock(t, c1, key, g4.Token); got != 1 {
			t.Errorf("UNLOCK = %d; want 1", got)
		}

		// RENEW after expiry.
		short := key + "-short"
		gs := lc.MustLock(t, c1, short, "PX", 200)
		checkGrant(t, "LOCK PX 200", gs, 200)
		time.Sleep(450 * time.Millisecond)
		if got := lc.IntCmd(t, c1, "RENEW", short, gs.Token, "PX", 10000); got != 0 {
			t.Errorf("RENEW %q after expiry = %d; want 0", short, got)
		}
		if got := lc.Unlock(t, c1, short, gs.Token); got != 0 {
			t.Errorf("UNLOCK %q after expiry = %d; want 0", short, got)
		}
		// And it is free for someone else.
		ge := lc.MustLock(t, c2, short, "PX", 10000)
		if got := lc.Unlock(t, c2, short, ge.Token); got != 1 {
			t.Errorf("UNLOCK = %d; want 1", got)
		}
	})
}

func TestUnlockWrongTokenKeepsHolder(t *testing.T) {
	t.Parallel()
	eachSize(t, func(t *testing.T, n int) {
		cl := startCluster(t, n)
		addr, _ := startProxy(t, cl.addrs())
		c := lc.NewClient(t, addr, 2)
		key := "wrongtoken-" + lockclient.RandID()
		g := cl.lockOnAllNodes(t, c, key, "PX", 10000)

		other := lc.MustLock(t, c, key+"-other", "PX", 10000)
		wrong := []struct{ name, token string }{
			{"random", "wrong-" + lockclient.RandID()},
			{"prefix of the token", g.Token[:len(g.Token)-1]},
			{"token with a suffix", g.Token + "x"},
			{"upper-cased token", "X" + g.Token[1:]},
			{"another lock's token", other.Token},
		}
		for _, w := range wrong {
			if got := lc.Unlock(t, c, key, w.token); got != 0 {
				t.Errorf("UNLOCK %q with %s = %d; want 0", key, w.name, got)
			}
			if got := lc.IntCmd(t, c, "RENEW", key, w.token, "PX", 10000); got != 0 {
				t.Errorf("RENEW %q with %s = %d; want 0", key, w.name, got)
			}
		}
		for i := range cl.nodes {
			if v, ok := cl.lockValue(t, i, key); !ok || v != g.Token {
				t.Errorf("node %d (%s): GET %slock:%s = %q, %v; want the holder's token %q",
					i, cl.nodes[i].Addr, keyPrefix, key, v, ok, g.Token)
			}
		}
		if _, ok := lc.Lock(t, c, key, "PX", 10000); ok {
			t.Errorf("LOCK %q after wrong UNLOCKs was granted; want nil", key)
		}
		if got := lc.Unlock(t, c, key, g.Token); got != 1 {
			t.Errorf("UNLOCK %q with the holder's token = %d; want 1", key, got)
		}
	})
}

func TestFencesIncreaseAcrossInstances(t *testing.T) {
	t.Parallel()
	const grants = 1000
	eachSize(t, func(t *testing.T, n int) {
		cl := startCluster(t, n)
		addrA, _ := startProxy(t, cl.addrs())
		addrB, _ := startProxy(t, cl.addrs())
		clients := []lockclient.Doer{lc.NewClient(t, addrA, 2), lc.NewClient(t, addrB, 2)}
		key := "fence-" + lockclient.RandID()

		deadline := time.Now().Add(60 * time.Second)
		var prev int64
		start := time.Now()
		for i := 0; i < grants; i++ {
			if time.Now().After(deadline) {
				t.Fatalf("only %d of %d grants within 60 s", i, grants)
			}
			c := clients[i%2]
			g := lc.MustLock(t, c, key, "PX", 10000)
			if g.Fence <= prev {
				t.Fatalf("grant %d (instance %c): fence %d; want > %d (the previous grant's)", i, "AB"[i%2], g.Fence, prev)
			}
			prev = g.Fence
			if got := lc.Unlock(t, c, key, g.Token); got != 1 {
				t.Fatalf("grant %d: UNLOCK = %d; want 1", i, got)
			}
		}
		t.Logf("%d alternating grants on 2 instances in %v; last fence %d", grants, time.Since(start).Round(time.Millisecond), prev)
	})
}

// An UNLOCK sent as soon as the LOCK reply arrives must release the key on
// every node: lockproxy answers LOCK once a majority granted, and the other
// nodes' grants must not land after the release (they would stay until their
// TTL, refusing later grants on those nodes). Nor may anything else of the
// hold stay behind, such as a fence write that reached a node after the
// release. Several clients run at once, as in production, so that
// lockproxy's goroutines compete for the CPU.
func TestUnlockRightAfterLockLeavesNoKey(t *testing.T) {
	t.Parallel()
	const (
		clients = 8
		rounds  = 250
	)
	eachSize(t, func(t *testing.T, n int) {
		cl := startCluster(t, n)
		addr, _ := startProxy(t, cl.addrs())
		c := lc.NewClient(t, addr, 2)
		keys := make([]string, clients)
		tokens := make([]map[string]int, clients)
		errs := make(chan error, clients)
		ctx := lockclient.CtxFor(t, 60*time.Second)
		for w := range keys {
			keys[w] = fmt.Sprintf("lockunlock-%d-%s", w, lockclient.RandID())
			tokens[w] = map[string]int{}
			go func(w int) {
				for i := 0; i < rounds; i++ {
					g, ok, err := lockclient.TryLock(ctx, c, keys[w], "PX", 10000)
					if err != nil || !ok {
						errs <- fmt.Errorf("client %d round %d: LOCK %q = %v, %v; want a grant", w, i, keys[w], ok, err)
						return
					}
					tokens[w][g.Token] = i
					if got, err := c.Do(ctx, "UNLOCK", keys[w], g.Token).Int64(); err != nil || got != 1 {
						errs <- fmt.Errorf("client %d round %d: UNLOCK = %d, %v; want 1", w, i, got, err)
						return
					}
				}
				errs <- nil
			}(w)
		}
		for range keys {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
		// Late grants, if any, have landed by now; they would live 10 s.
		time.Sleep(200 * time.Millisecond)
		for w, key := range keys {
			for i := range cl.nodes {
				if v, ok := cl.lockValue(t, i, key); ok {
					t.Errorf("node %d (%s): %slock:%s = %q (the grant of round %d) after its UNLOCK returned 1; want no key",
						i, cl.nodes[i].Addr, keyPrefix, key, v, tokens[w][v])
				}
			}
		}
		for i, nc := range cl.clients {
			left, err := nc.Keys(ctx, keyPrefix+"lock*").Result()
			if err != nil {
				t.Fatalf("node %d: KEYS: %v", i, err)
			}
			if len(left) > 0 {
				slices.Sort(left)
				t.Errorf("node %d (%s): %d keys left after every UNLOCK returned 1: %q; want none",
					i, cl.nodes[i].Addr, len(left), left[:min(len(left), 5)])
			}
		}
	})
}

func TestWait(t *testing.T) {
	t.Parallel()
	eachSize(t, func(t *testing.T, n int) {
		cl := startCluster(t, n)
		addr, _ := startProxy(t, cl.addrs())
		c1 := lc.NewClient(t, addr, 2)
		c2 := lc.NewClient(t, addr, 2)

		t.Run("woken by UNLOCK", func(t *testing.T) {
			key := "wait-" + lockclient.RandID()
			g1 := lc.MustLock(t, c1, key, "PX", 10000)

			type result struct {
				g   lockclient.Grant
				ok  bool
				err error
				at  time.Time
			}
			done := make(chan result, 1)
			go func() {
				g, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 15*time.Second), c2, key, "PX", 10000, "WAIT", 5000)
				done <- result{g, ok, err, time.Now()}
			}()
			// Let client 2 try once and start waiting.
			select {
			case r := <-done:
				t.Fatalf("LOCK %q WAIT 5000 returned while held: %+v", key, r)
			case <-time.After(400 * time.Millisecond):
			}
			if got := lc.Unlock(t, c1, key, g1.Token); got != 1 {
				t.Fatalf("UNLOCK = %d; want 1", got)
			}
			unlocked := time.Now()
			var r result
			select {
			case r = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("LOCK … WAIT 5000 did not return within 10 s")
			}
			if r.err != nil || !r.ok {
				t.Fatalf("LOCK %q WAIT 5000 = %+v, %v, %v; want a grant", key, r.g, r.ok, r.err)
			}
			delay := r.at.Sub(unlocked)
			t.Logf("grant arrived %v after the UNLOCK reply", delay)
			if delay > 200*time.Millisecond {
				t.Errorf("grant arrived %v after the UNLOCK reply; want < 200ms (woken, not polled)", delay)
			}
			checkGrant(t, "LOCK after WAIT", r.g, 10000)
			if r.g.Fence <= g1.Fence {
				t.Errorf("waiter's fence %d; want > %d", r.g.Fence, g1.Fence)
			}
			if got := lc.Unlock(t, c2, key, r.g.Token); got != 1 {
				t.Errorf("UNLOCK = %d; want 1", got)
			}
		})

		// PROTOCOL.md: waiters are woken as soon as the lock is released,
		// also by releases made through another instance.
		t.Run("woken by UNLOCK through another instance", func(t *testing.T) {
			addrB, _ := startProxy(t, cl.addrs())
			cb := lc.NewClient(t, addrB, 2)
			const trials = 7
			var delays []time.Duration
			for i := 0; i < trials; i++ {
				key := fmt.Sprintf("waitx-%d-%s", i, lockclient.RandID())
				g1 := lc.MustLock(t, cb, key, "PX", 10000)
				done := make(chan time.Time, 1)
				go func() {
					g, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 15*time.Second), c2, key, "PX", 10000, "WAIT", 5000)
					if err != nil || !ok {
						t.Errorf("LOCK %q WAIT 5000 = %+v, %v, %v; want a grant", key, g, ok, err)
					}
					done <- time.Now()
				}()
				time.Sleep(200 * time.Millisecond)
				if got := lc.Unlock(t, cb, key, g1.Token); got != 1 {
					t.Fatalf("UNLOCK on the other instance = %d; want 1", got)
				}
				unlocked := time.Now()
				select {
				case at := <-done:
					delays = append(delays, at.Sub(unlocked))
				case <-time.After(10 * time.Second):
					t.Fatal("LOCK … WAIT 5000 did not return within 10 s")
				}
			}
			sort.Slice(delays, func(i, j int) bool { return delays[i] < delays[j] })
			t.Logf("grant delays after an UNLOCK through another instance: %v", delays)
			// Polling every 20-200 ms cannot keep the median this low.
			if median := delays[trials/2]; median > 20*time.Millisecond {
				t.Errorf("median delay %v from an UNLOCK on another instance to the waiter's grant; want < 20ms (woken, not polled)", median)
			}
		})

		// A blocking LOCK must not hold back the replies to the commands
		// pipelined before it.
		t.Run("pipelined replies before a WAIT", func(t *testing.T) {
			key := "waitpipe-" + lockclient.RandID()
			g1 := lc.MustLock(t, c1, key, "PX", 10000)
			rc := lc.DialRaw(t, addr)
			start := time.Now()
			rc.Write(lockclient.Encode("PING") + lockclient.Encode("ECHO", "before") + lockclient.Encode("LOCK", key, "PX", "10000", "WAIT", "1500"))
			for _, want := range []string{"PONG", "before"} {
				r, err := rc.Read()
				if err != nil || r.Str != want {
					t.Fatalf("pipelined reply = %v, %v; want %q", r, err, want)
				}
			}
			if took := time.Since(start); took > 700*time.Millisecond {
				t.Errorf("replies before LOCK … WAIT 1500 arrived after %v; want them at once (< 700ms)", took)
			}
			r, err := rc.Read()
			if err != nil || !r.Null {
				t.Errorf("LOCK … WAIT 1500 on a held key = %v, %v; want nil", r, err)
			}
			if got := lc.Unlock(t, c1, key, g1.Token); got != 1 {
				t.Errorf("UNLOCK = %d; want 1", got)
			}
		})

		// A waiter that hung up must not be granted the lock afterwards.
		t.Run("waiter disconnects", func(t *testing.T) {
			key := "waitgone-" + lockclient.RandID()
			g1 := lc.MustLock(t, c1, key, "PX", 10000)
			rc := lc.DialRaw(t, addr)
			rc.Write(lockclient.Encode("LOCK", key, "PX", "10000", "WAIT", "5000"))
			time.Sleep(200 * time.Millisecond)
			_ = rc.Conn.Close()
			time.Sleep(200 * time.Millisecond)
			if got := lc.Unlock(t, c1, key, g1.Token); got != 1 {
				t.Fatalf("UNLOCK = %d; want 1", got)
			}
			// Give a leaked waiter time to take it.
			time.Sleep(300 * time.Millisecond)
			g2, ok := lc.Lock(t, c2, key, "PX", 10000)
			if !ok {
				t.Fatalf("LOCK %q after the only waiter hung up = nil; want a grant (the gone waiter took it)", key)
			}
			if got := lc.Unlock(t, c2, key, g2.Token); got != 1 {
				t.Errorf("UNLOCK = %d; want 1", got)
			}
		})

		t.Run("runs out", func(t *testing.T) {
			key := "waitout-" + lockclient.RandID()
			g1 := lc.MustLock(t, c1, key, "PX", 10000)
			const wait = 600 * time.Millisecond
			start := time.Now()
			g, ok := lc.Lock(t, c2, key, "PX", 10000, "WAIT", wait.Milliseconds())
			took := time.Since(start)
			t.Logf("LOCK … WAIT %d answered after %v", wait.Milliseconds(), took)
			if ok {
				t.Fatalf("LOCK %q WAIT = %+v; want nil while held", key, g)
			}
			if took < wait || took > wait+time.Second {
				t.Errorf("nil after %v; want in [%v, %v)", took, wait, wait+time.Second)
			}
			if got := lc.Unlock(t, c1, key, g1.Token); got != 1 {
				t.Errorf("holder's UNLOCK = %d; want 1", got)
			}
		})
	})
}

func TestBinarySafeKeysAndTokens(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, key, token string }{
		{"spaces and CRLF", "a key\r\nwith\tspaces", "tok with spaces\r\n"},
		{"NUL bytes", "k\x00e\x00y", "t\x00k"},
		{"non-UTF-8 bytes", "\xff\xfe\x80key", "\xc3\x28"},
		{"unicode", "verrou-🔒-ключ", "jeton-✓"},
		{"colons like a prefix", "lockproxy:lock:nested", "lockproxy:fence"},
		{"long key", strings.Repeat("k", 4096), strings.Repeat("t", 256)},
	}
	eachSize(t, func(t *testing.T, n int) {
		cl := startCluster(t, n)
		addr, _ := startProxy(t, cl.addrs())
		c := lc.NewClient(t, addr, 3)
		for _, tc := range cases {
			g := cl.lockOnAllNodes(t, c, tc.key, "PX", 10000, "TOKEN", tc.token)
			if g.Token != tc.token {
				t.Errorf("%s: LOCK %q TOKEN %q: token = %q", tc.name, tc.key, tc.token, g.Token)
			}
			if _, ok := lc.Lock(t, c, tc.key, "PX", 10000); ok {
				t.Errorf("%s: second LOCK %q granted; want nil", tc.name, tc.key)
			}
			if got := lc.IntCmd(t, c, "RENEW", tc.key, tc.token, "PX", 10000); got <= 0 {
				t.Errorf("%s: RENEW = %d; want > 0", tc.name, got)
			}
			if got := lc.Unlock(t, c, tc.key, tc.token); got != 1 {
				t.Errorf("%s: UNLOCK %q %q = %d; want 1", tc.name, tc.key, tc.token, got)
			}
		}
	})
}
