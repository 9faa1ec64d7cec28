package zk

import (
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

func base64URL(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

var hexToken = regexp.MustCompile(`^[0-9a-f]{32}$`)

// checkGrant checks a fresh grant of a lease of ttlMS.
func checkGrant(t *testing.T, what string, g lockclient.Grant, ttlMS int64) {
	t.Helper()
	if g.ValidityMS <= 0 || g.ValidityMS > maxValidityMS(ttlMS) {
		t.Errorf("%s: validity_ms = %d; want in (0, %d]", what, g.ValidityMS, maxValidityMS(ttlMS))
	}
	if g.Fence <= 0 {
		t.Errorf("%s: fence = %d; want positive", what, g.Fence)
	}
}

// TestLockContendUnlockRenew is test/e2e's test of the same name on the
// ZooKeeper backend: the same replies, in RESP2 and RESP3.
func TestLockContendUnlockRenew(t *testing.T) {
	in := startInstance(t, zkServers(), newRoot(t))
	zc := zkConn(t)
	info, err := lc.NewClient(t, in.addr, 2).Info(lockclient.CtxFor(t, 10*time.Second), "lockproxy").Result()
	if err != nil {
		t.Fatalf("INFO: %v", err)
	}
	for _, want := range []string{"lockproxy_backend:zookeeper", "lockproxy_nodes:3", ",state=ok"} {
		if !strings.Contains(info, want) {
			t.Errorf("INFO lockproxy lacks %q:\n%s", want, info)
		}
	}
	for _, proto := range []int{2, 3} {
		t.Run(fmt.Sprintf("RESP%d", proto), func(t *testing.T) {
			c1 := lc.NewClient(t, in.addr, proto)
			c2 := lc.NewClient(t, in.addr, proto)
			key := "semantics-" + lockclient.RandID()

			g := lc.MustLock(t, c1, key, "PX", 10000)
			checkGrant(t, "LOCK PX 10000", g, 10000)
			if !hexToken.MatchString(g.Token) {
				t.Errorf("token = %q; want 32 hex digits", g.Token)
			}
			if n := lockNodes(t, zc, in.root, key); n != 1 {
				t.Errorf("%d lock nodes; want 1", n)
			}
			for _, c := range []lockclient.Doer{c2, c1} {
				if g2, ok := lc.Lock(t, c, key, "PX", 10000); ok {
					t.Errorf("second LOCK = %+v; want nil while held", g2)
				}
			}
			steps := []struct {
				name string
				args []any
				want func(int64) bool
				desc string
			}{
				{"RENEW with the token", []any{"RENEW", key, g.Token, "PX", 8000},
					func(v int64) bool { return v > 0 && v <= maxValidityMS(8000) }, "in (0, max]"},
				{"RENEW EX with the token", []any{"RENEW", key, g.Token, "EX", 20},
					func(v int64) bool { return v > 0 && v <= maxValidityMS(20000) }, "in (0, session cap]"},
				{"RENEW with another token", []any{"RENEW", key, "not-the-token", "PX", 10000},
					func(v int64) bool { return v == 0 }, "0"},
				{"UNLOCK with another token", []any{"UNLOCK", key, "not-the-token"},
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
			if n := lockNodes(t, zc, in.root, key); n != 0 {
				t.Errorf("%d lock nodes after UNLOCK; want 0", n)
			}
			g2 := lc.MustLock(t, c2, key, "PX", 10000)
			if g2.Fence <= g.Fence {
				t.Errorf("fence after re-LOCK = %d; want > %d", g2.Fence, g.Fence)
			}
			lc.IntCmd(t, c2, "UNLOCK", key, g2.Token)

			tok := "client-token-" + lockclient.RandID()
			if g3 := lc.MustLock(t, c1, key, "PX", 10000, "TOKEN", tok); g3.Token != tok {
				t.Errorf("TOKEN %q: token = %q", tok, g3.Token)
			}
			// Reentrant: the same token adds a hold, with the same fence.
			g3 := lc.MustLock(t, c2, key, "PX", 10000, "TOKEN", tok)
			if got := lc.IntCmd(t, c1, "UNLOCK", key, tok); got != 1 {
				t.Errorf("UNLOCK of the first hold = %d; want 1", got)
			}
			if _, ok := lc.Lock(t, c2, key, "PX", 1000); ok {
				t.Error("LOCK by another granted while one reentrant hold remains")
			}
			if got := lc.IntCmd(t, c1, "UNLOCK", key, tok); got != 1 {
				t.Errorf("UNLOCK of the second hold = %d; want 1", got)
			}
			_ = g3

			// The default lease when no PX is given (capped by the session).
			g4 := lc.MustLock(t, c1, key)
			checkGrant(t, "LOCK without PX", g4, 30000)
			lc.IntCmd(t, c1, "UNLOCK", key, g4.Token)

			// The lease is enforced by lockproxy: RENEW after it ends is 0.
			short := key + "-short"
			gs := lc.MustLock(t, c1, short, "PX", 200)
			checkGrant(t, "LOCK PX 200", gs, 200)
			time.Sleep(600 * time.Millisecond)
			if got := lc.IntCmd(t, c1, "RENEW", short, gs.Token, "PX", 10000); got != 0 {
				t.Errorf("RENEW after the lease = %d; want 0", got)
			}
			if got := lc.IntCmd(t, c1, "UNLOCK", short, gs.Token); got != 0 {
				t.Errorf("UNLOCK after the lease = %d; want 0", got)
			}
			ge := lc.MustLock(t, c2, short, "PX", 10000)
			lc.IntCmd(t, c2, "UNLOCK", short, ge.Token)
		})
	}
}

// TestBinaryKeysAndTokens: keys with bytes that are special to ZooKeeper
// paths or to RESP round-trip and stay apart.
func TestBinaryKeysAndTokens(t *testing.T) {
	// Parallel: it leaves the ensemble alone (a root and instances of
	// its own). Parallel tests start once every serial one has ended, so
	// never beside those that stop, kill or cut off servers.
	t.Parallel()
	in := startInstance(t, zkServers(), newRoot(t))
	c := lc.NewClient(t, in.addr, 2)
	keys := []string{"a/b", "a", "/", "..", "\x00\r\n", "\xff\xfe", strings.Repeat("k", 8192)}
	toks := map[string]string{}
	for i, k := range keys {
		tok := fmt.Sprintf("tok-\x00\r\n-%d", i)
		if g := lc.MustLock(t, c, k, "PX", 10000, "TOKEN", tok); g.Token != tok {
			t.Errorf("LOCK %.20q: token %q; want %q", k, g.Token, tok)
		}
		toks[k] = tok
	}
	for _, k := range keys {
		if got := lc.IntCmd(t, c, "UNLOCK", k, toks[k]); got != 1 {
			t.Errorf("UNLOCK %.20q = %d; want 1", k, got)
		}
	}
}

// TestWaitFIFOHundred: 100 clients on two lockproxy instances queue with
// WAIT one after another and are granted in that order, each once, and
// each release wakes only the next.
func TestWaitFIFOHundred(t *testing.T) {
	const n = 100
	root := newRoot(t)
	ins := []*instance{startInstance(t, zkServers(), root), startInstance(t, zkServers(), root)}
	zc := zkConn(t)
	key := "fifo-" + lockclient.RandID()
	holder := lc.NewClient(t, ins[0].addr, 2)
	h := lc.MustLock(t, holder, key, "PX", 60000)

	var mu sync.Mutex
	var order []int
	var fences []int64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		c := lc.NewClient(t, ins[i%2].addr, 2)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := lockclient.CtxFor(t, 120*time.Second)
			g, ok, err := lockclient.TryLock(ctx, c, key, "PX", 30000, "WAIT", 100000)
			if err != nil || !ok {
				errs <- fmt.Errorf("waiter %d: LOCK = %v, %v", i, ok, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			fences = append(fences, g.Fence)
			mu.Unlock()
			if v, err := c.Do(ctx, "UNLOCK", key, g.Token).Int64(); v != 1 || err != nil {
				errs <- fmt.Errorf("waiter %d: UNLOCK = %v, %v", i, v, err)
			}
		}()
		deadline := time.Now().Add(30 * time.Second)
		for lockNodes(t, zc, root, key) != i+2 {
			if time.Now().After(deadline) {
				t.Fatalf("waiter %d never queued", i)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	lc.IntCmd(t, holder, "UNLOCK", key, h.Token)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(order) != n {
		t.Fatalf("%d grants; want %d", len(order), n)
	}
	// Each of the n releases woke at most the one waiter behind it.
	wakeups := 0
	for _, in := range ins {
		v, _ := strconv.Atoi(metric(t, in, "lockproxy_zookeeper_watch_wakeups_total"))
		wakeups += v
	}
	if wakeups == 0 || wakeups > n {
		t.Errorf("%d watches fired for %d releases; want 1 to %d", wakeups, n, n)
	} else {
		t.Logf("%d watches fired for %d releases", wakeups, n)
	}
	for i := range order {
		if order[i] != i {
			t.Fatalf("grant %d went to waiter %d; want arrival order (%v)", i, order[i], order)
		}
		if i > 0 && fences[i] <= fences[i-1] {
			t.Fatalf("fence %d after %d", fences[i], fences[i-1])
		}
	}
}

// TestKeepalive: a KEEPALIVE lock outlives its lease while its client
// talks, and goes as soon as the connection closes.
func TestKeepalive(t *testing.T) {
	in := startInstance(t, zkServers(), newRoot(t))
	key := "ka-" + lockclient.RandID()
	holder := lc.DialRaw(t, in.addr)
	r := holder.Do("LOCK", key, "PX", "600", "KEEPALIVE")
	if r.Kind != '*' || r.Pairs()["token"].Str == "" {
		t.Fatalf("LOCK KEEPALIVE = %v", r)
	}
	other := lc.NewClient(t, in.addr, 2)
	for range 6 {
		time.Sleep(300 * time.Millisecond)
		if r := holder.Do("PING"); r.Str != "PONG" {
			t.Fatalf("PING = %v", r)
		}
	}
	if _, ok := lc.Lock(t, other, key, "PX", 1000); ok {
		t.Fatal("lock granted to another while its KEEPALIVE holder was active past its lease")
	}
	got := make(chan time.Time, 1)
	go func() {
		if _, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 60*time.Second), other, key, "PX", 1000, "WAIT", 30000); ok && err == nil {
			got <- time.Now()
		}
		close(got)
	}()
	time.Sleep(200 * time.Millisecond)
	closed := time.Now()
	holder.Conn.Close()
	at, ok := <-got
	if !ok {
		t.Fatal("waiter not granted after the holder's connection closed")
	}
	t.Logf("waiter granted %v after the KEEPALIVE holder's connection closed", at.Sub(closed))
}

// TestSessionExpiryLostBeforeRival cuts lockproxy A's link to ZooKeeper
// past its session timeout while a RESP3 client holds a KEEPALIVE lock
// through it and a client of lockproxy B waits for that lock: the holder
// gets the lock-lost push before B's client is granted, and A's next
// command on the key answers LOCKLOST.
func TestSessionExpiryLostBeforeRival(t *testing.T) {
	root := newRoot(t)
	const sessMS = 3000
	link := harness.StartLink(t, ensemble[0].Addr)
	a := startInstance(t, []string{link.Addr()}, root, fmt.Sprintf("LOCKPROXY_ZOOKEEPER_SESSION_TIMEOUT=%dms", sessMS))
	b := startInstance(t, zkServers(), root)
	key := "expiry-" + lockclient.RandID()

	holder := lc.DialRaw(t, a.addr)
	if r := holder.Do("HELLO", "3"); r.Kind != '%' {
		t.Fatalf("HELLO 3 = %v", r)
	}
	r := holder.Do("LOCK", key, "PX", "1500", "KEEPALIVE")
	tok := r.Pairs()["token"].Str
	if r.Kind != '%' || tok == "" {
		t.Fatalf("LOCK = %v", r)
	}
	rival := lc.NewClient(t, b.addr, 2)
	granted := make(chan time.Time, 1)
	go func() {
		defer close(granted)
		if _, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 90*time.Second), rival, key, "PX", 5000, "WAIT", 60000); ok && err == nil {
			granted <- time.Now()
		}
	}()
	time.Sleep(300 * time.Millisecond)
	link.Cut()
	cut := time.Now()

	push, err := holder.ReadWithin(60 * time.Second)
	pushed := time.Now()
	if err != nil {
		t.Fatalf("no lock-lost push within 60 s of the cut: %v", err)
	}
	if push.Kind != '>' || len(push.Elems) != 3 || push.Elems[0].Str != "lock-lost" || push.Elems[1].Str != key || push.Elems[2].Str != tok {
		t.Fatalf("push = %v; want >[lock-lost %q %q]", push, key, tok)
	}
	at, ok := <-granted
	if !ok {
		t.Fatal("the rival was never granted")
	}
	t.Logf("cut at 0; lock-lost pushed at %v; rival granted at %v (session timeout %d ms)",
		pushed.Sub(cut).Round(time.Millisecond), at.Sub(cut).Round(time.Millisecond), sessMS)
	if !pushed.Before(at) {
		t.Errorf("lock-lost pushed at %v, after the rival was granted at %v", pushed.Sub(cut), at.Sub(cut))
	}
	if code := readyz(t, a); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz of the cut-off instance = %d; want 503", code)
	}
	link.Heal()
	if r := holder.Do("LOCK", key, "PX", "1000"); r.Kind != '-' || !strings.HasPrefix(r.Str, "LOCKLOST") {
		t.Errorf("the holder's next LOCK = %v; want -LOCKLOST", r)
	}
	deadline := time.Now().Add(60 * time.Second)
	for metric(t, a, "lockproxy_zookeeper_session_expirations_total") != "1" ||
		metric(t, a, "lockproxy_zookeeper_connected") != "1" {
		if time.Now().After(deadline) {
			t.Fatalf("metrics after the expiry: expirations %q, connected %q; want 1 and 1",
				metric(t, a, "lockproxy_zookeeper_session_expirations_total"), metric(t, a, "lockproxy_zookeeper_connected"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code := readyz(t, a); code != http.StatusOK {
		t.Errorf("/readyz after the new session = %d; want 200", code)
	}
}

// readyz returns the status code of in's /readyz.
func readyz(t *testing.T, in *instance) int {
	t.Helper()
	resp, err := http.Get("http://" + in.admin + "/readyz")
	if err != nil {
		t.Fatalf("GET /readyz: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// metric reads one sample of in's /metrics ("" when absent).
func metric(t *testing.T, in *instance, sample string) string {
	t.Helper()
	resp, err := http.Get("http://" + in.admin + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			return v
		}
	}
	return ""
}

// TestOneServerOfThreeKilled: with the server lockproxy is connected to
// killed (and then the leader, if that was another), locks keep working
// and fences keep increasing, across two instances.
func TestOneServerOfThreeKilled(t *testing.T) {
	root := newRoot(t)
	ins := []*instance{startInstance(t, zkServers(), root), startInstance(t, zkServers(), root)}
	cs := []lockclient.Doer{lc.NewClient(t, ins[0].addr, 2), lc.NewClient(t, ins[1].addr, 2)}
	key := "ens-" + lockclient.RandID()
	var last int64
	round := func(phase string, n int) {
		t.Helper()
		for i := range n {
			c := cs[i%2]
			g, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 60*time.Second), c, key, "PX", 5000, "WAIT", 30000)
			if err != nil || !ok {
				t.Fatalf("%s: grant %d: %v, %v", phase, i, ok, err)
			}
			if g.Fence <= last {
				t.Fatalf("%s: fence %d after %d", phase, g.Fence, last)
			}
			last = g.Fence
			if got := lc.IntCmd(t, c, "UNLOCK", key, g.Token); got != 1 {
				t.Fatalf("%s: UNLOCK = %d", phase, got)
			}
		}
	}
	round("all up", 100)
	var victim *harness.ZooKeeper
	for _, z := range ensemble {
		if m, _ := z.Mode(); m == "leader" {
			victim = z
		}
	}
	if victim == nil {
		t.Fatal("no leader")
	}
	victim.Kill()
	t.Cleanup(func() {
		if err := victim.Restart(); err != nil {
			t.Errorf("restart %s: %v", victim.Addr, err)
		}
	})
	// Commands may fail while a new leader is elected; then they work.
	deadline := time.Now().Add(60 * time.Second)
	for {
		g, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 30*time.Second), cs[0], key, "PX", 5000, "WAIT", 5000)
		if err == nil && ok {
			if g.Fence <= last {
				t.Fatalf("fence %d after %d", g.Fence, last)
			}
			last = g.Fence
			lc.IntCmd(t, cs[0], "UNLOCK", key, g.Token)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no grant within 60 s of killing the leader: %v, %v", ok, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	round("one down", 100)
}

// TestShutdownReleases: on SIGTERM lockproxy releases its KEEPALIVE locks
// and closes its session after the drain, so a waiter on another instance
// is granted at once rather than at the end of a lease.
func TestShutdownReleases(t *testing.T) {
	// Parallel: it leaves the ensemble alone (a root and instances of
	// its own). Parallel tests start once every serial one has ended, so
	// never beside those that stop, kill or cut off servers.
	t.Parallel()
	root := newRoot(t)
	a := startInstance(t, zkServers(), root)
	b := startInstance(t, zkServers(), root)
	ca := lc.NewClient(t, a.addr, 2)
	key1, key2 := "sd1-"+lockclient.RandID(), "sd2-"+lockclient.RandID()
	lc.MustLock(t, ca, key1, "PX", 60000, "KEEPALIVE")
	lc.MustLock(t, ca, key2, "PX", 60000) // no keepalive: goes with the session
	cb := lc.NewClient(t, b.addr, 2)
	start := time.Now()
	if err := a.proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{key1, key2} {
		g, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 60*time.Second), cb, k, "PX", 1000, "WAIT", 30000)
		if err != nil || !ok {
			t.Fatalf("LOCK %s after the holder's lockproxy stopped = %v, %v", k, ok, err)
		}
		lc.IntCmd(t, cb, "UNLOCK", k, g.Token)
	}
	if el := time.Since(start); el > 20*time.Second {
		t.Errorf("locks freed %v after SIGTERM; want well before their 60 s leases", el)
	} else {
		t.Logf("both locks free %v after SIGTERM", el.Round(time.Millisecond))
	}
	if code, err := a.proc.Wait(30 * time.Second); err != nil || code != 0 {
		t.Errorf("lockproxy exit = %d, %v; want 0", code, err)
	}
}
