package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// slowHostNodeTimeout gives each node at least 100 ms to answer, for the
// tests whose short leases (PX 600: 30 ms by default) a loaded CI host
// made miss their quorum; what they test does not depend on it.
const slowHostNodeTimeout = "LOCKPROXY_REDLOCK_NODE_TIMEOUT_MIN=100ms"

// startInstanceEnv is startInstance with extra environment variables for
// lockproxy (such as LOCKPROXY_LOCKS_KEEPALIVE_IDLE).
func startInstanceEnv(t *testing.T, nodes []string, env []string) *instance {
	t.Helper()
	bin := harness.BuildLockproxy(t)
	in := &instance{
		addr:  fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t)),
		admin: fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t)),
	}
	cmd := exec.Command(bin, "--listen", in.addr, "--admin", in.admin, "--nodes", strings.Join(nodes, ","))
	cmd.Env = append(os.Environ(), env...)
	in.proc = harness.StartCmd(t, cmd)
	if err := harness.WaitTCP(in.addr, 15*time.Second); err != nil {
		t.Fatalf("lockproxy %v did not listen on %s: %v\noutput:\n%s", env, in.addr, err, in.proc.Output())
	}
	if err := harness.WaitTCP(in.admin, 5*time.Second); err != nil {
		t.Fatalf("lockproxy %v did not listen on admin %s: %v\noutput:\n%s", env, in.admin, err, in.proc.Output())
	}
	return in
}

// rawGrant sends LOCK args on rc and returns the token, failing the test
// unless the reply is a grant.
func rawGrant(t *testing.T, rc *lockclient.RawConn, args ...string) string {
	t.Helper()
	r := rc.Do(append([]string{"LOCK"}, args...)...)
	tok := r.Pairs()["token"]
	if (r.Kind != '*' && r.Kind != '%') || tok.Str == "" {
		t.Fatalf("LOCK %q = %v; want a grant", args, r)
	}
	return tok.Str
}

// holders counts the nodes on which key is held by token.
func (c *cluster) holders(t *testing.T, key, token string) int {
	t.Helper()
	n := 0
	for i := range c.nodes {
		if v, ok := c.lockValue(t, i, key); ok && v == token {
			n++
		}
	}
	return n
}

// metricValue reads one sample line of lockproxy's /metrics, "" if absent.
func metricValue(t *testing.T, in *instance, sample string) string {
	t.Helper()
	_, body := httpGet(t, "http://"+in.admin+"/metrics")
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			return v
		}
	}
	return ""
}

// A KEEPALIVE lock of 600 ms outlives ten leases while its connection
// keeps sending PING, and UNLOCK ends it.
func TestKeepaliveSurvivesWhileActive(t *testing.T) {
	t.Parallel()
	const ttlMS = 600
	eachSize(t, func(t *testing.T, n int) {
		cl := startCluster(t, n)
		// Node timeouts of up to a renewal period: at the default (5 % of
		// the 600 ms lease, 30 ms) a loaded test machine makes renewals
		// miss their quorum, and the lock is then rightly lost.
		in := startInstanceEnv(t, cl.addrs(), []string{
			"LOCKPROXY_REDLOCK_NODE_TIMEOUT_FACTOR=0.3", "LOCKPROXY_REDLOCK_NODE_TIMEOUT_MAX=1s"})
		addr := in.addr
		holder := lc.DialRaw(t, addr)
		other := lc.NewClient(t, addr, 2)
		key := "keepalive-" + lockclient.RandID()

		tok := rawGrant(t, holder, key, "PX", fmt.Sprint(ttlMS), "KEEPALIVE")
		start := time.Now()
		for i := 0; time.Since(start) < 10*ttlMS*time.Millisecond; i++ {
			if i > 200 {
				t.Fatalf("more than 200 rounds in %v", time.Since(start))
			}
			if r := holder.Do("PING"); r.Str != "PONG" {
				t.Fatalf("PING = %v; want PONG", r)
			}
			if i%5 == 0 {
				if g, ok := lc.Lock(t, other, key, "PX", ttlMS); ok {
					t.Fatalf("after %v: another client's LOCK = %+v; want nil while kept alive", time.Since(start), g)
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		held := time.Since(start)
		if h := cl.holders(t, key, tok); h < n/2+1 {
			t.Errorf("after %v the lock is on %d of %d nodes; want a majority", held, h, n)
		}
		for i, c := range cl.clients {
			if pttl, err := c.PTTL(lockclient.CtxFor(t, 5*time.Second), keyPrefix+"lock:"+key).Result(); err == nil && pttl > ttlMS*time.Millisecond {
				t.Errorf("node %d: PTTL %v; want at most the %d ms lease", i, pttl, ttlMS)
			}
		}
		t.Logf("held %v (%.1f leases of %d ms) while PINGing", held, float64(held)/float64(ttlMS*time.Millisecond), ttlMS)

		if r := holder.Do("UNLOCK", key, tok); r.Kind != ':' || r.Int != 1 {
			t.Fatalf("UNLOCK = %v; want :1", r)
		}
		g := lc.MustLock(t, other, key, "PX", 10000)
		time.Sleep(2 * ttlMS * time.Millisecond) // a watchdog left running would be seen now
		if h := cl.holders(t, key, g.Token); h < n/2+1 {
			t.Errorf("the next holder's lock is on %d of %d nodes; want a majority", h, n)
		}
		if r := holder.Do("PING"); r.Str != "PONG" {
			t.Errorf("PING after UNLOCK = %v; want PONG and no push", r)
		}
	})
}

// A KEEPALIVE lock whose connection goes silent is renewed no longer than
// locks.keepalive_idle, then runs out; the holder hears LOCKLOST.
func TestKeepaliveEndsWhenSilent(t *testing.T) {
	t.Parallel()
	// PX 2000: its grant and renewals get 100 ms per node (5 %); with
	// PX 600's 30 ms a loaded CI host refused the grant (NOQUORUM).
	const ttlMS, idleMS = 2000, 1000
	cl := startCluster(t, 3)
	in := startInstanceEnv(t, cl.addrs(), []string{fmt.Sprintf("LOCKPROXY_LOCKS_KEEPALIVE_IDLE=%dms", idleMS)})
	holder := lc.DialRaw(t, in.addr)
	other := lc.NewClient(t, in.addr, 2)
	key := "silent-" + lockclient.RandID()

	rawGrant(t, holder, key, "PX", fmt.Sprint(ttlMS), "KEEPALIVE")
	silent := time.Now()
	var took time.Duration
	for i := 0; ; i++ {
		if i == 200 {
			t.Fatalf("the lock of a silent holder was still held after %v", time.Since(silent))
		}
		if _, ok := lc.Lock(t, other, key, "PX", 10000); ok {
			took = time.Since(silent)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Renewed while the last command is within the idle window (at most one
	// renewal period after it), then the lease of ttl runs out.
	bound := time.Duration(idleMS+ttlMS/3+ttlMS)*time.Millisecond + time.Second
	t.Logf("free %v after the holder went silent (idle window %d ms, ttl %d ms)", took, idleMS, ttlMS)
	if took < idleMS*time.Millisecond || took > bound {
		t.Errorf("free %v after the holder went silent; want between the %d ms idle window and %v", took, idleMS, bound)
	}
	r := holder.Do("LOCK", key, "PX", fmt.Sprint(ttlMS))
	if want := "LOCKLOST lock on '" + key + "' was lost: the connection sent no command for " + (idleMS * time.Millisecond).String() + " (locks.keepalive_idle)"; r.Kind != '-' || r.Str != want {
		t.Errorf("the holder's next LOCK = %v; want -%s", r, want)
	}
	if r := holder.Do("LOCK", key, "PX", fmt.Sprint(ttlMS)); !r.Null {
		t.Errorf("LOCK after the LOCKLOST = %v; want nil (held by the other client)", r)
	}
	if v := metricValue(t, in, `lockproxy_lock_lost_total{reason="idle"}`); v != "1" {
		t.Errorf(`lockproxy_lock_lost_total{reason="idle"} = %q; want 1`, v)
	}
}

// A keepalive lock, implied by LOCK without PX, is released as soon as
// its connection closes: a waiter gets it at once, not after 30 s.
func TestKeepaliveReleasedOnClose(t *testing.T) {
	t.Parallel()
	eachSize(t, func(t *testing.T, n int) {
		cl := startCluster(t, n)
		addr, _ := startProxy(t, cl.addrs())
		var worst time.Duration
		for round := 0; round < 3; round++ {
			key := fmt.Sprintf("close-%d-%s", round, lockclient.RandID())
			holder := lc.DialRaw(t, addr)
			tok := rawGrant(t, holder, key)
			waiter := lc.DialRaw(t, addr)
			waiter.Write(lockclient.Encode("LOCK", key, "PX", "10000", "WAIT", "5000"))
			time.Sleep(300 * time.Millisecond) // the waiter is waiting now
			start := time.Now()
			_ = holder.Conn.Close()
			r, err := waiter.Read()
			took := time.Since(start)
			if err != nil {
				t.Fatalf("round %d: reading the waiter's reply: %v", round, err)
			}
			g := r.Pairs()["token"]
			if g.Str == "" || g.Str == tok {
				t.Fatalf("round %d: the waiter's LOCK = %v; want a grant with a new token", round, r)
			}
			t.Logf("round %d: the waiter got the lock %v after the holder's connection closed", round, took)
			worst = max(worst, took)
		}
		if worst > 500*time.Millisecond {
			t.Errorf("a waiter got the lock up to %v after the holder's connection closed; want < 500ms", worst)
		}
	})
}

// MAXHOLD caps a keepalive lock's hold even while its connection is busy.
func TestKeepaliveMaxHold(t *testing.T) {
	t.Parallel()
	const ttlMS, maxHoldMS = 600, 1800
	cl := startCluster(t, 3)
	// PX 600's default node timeout (30 ms) refused the grant on a loaded
	// CI host (NOQUORUM); MAXHOLD does not depend on it.
	addr := startInstanceEnv(t, cl.addrs(), []string{slowHostNodeTimeout}).addr
	holder := lc.DialRaw(t, addr)
	other := lc.NewClient(t, addr, 2)
	key := "maxhold-" + lockclient.RandID()

	tok := rawGrant(t, holder, key, "PX", fmt.Sprint(ttlMS), "KEEPALIVE", "MAXHOLD", fmt.Sprint(maxHoldMS))
	start := time.Now()
	var took time.Duration
	for i := 0; ; i++ {
		if i == 200 {
			t.Fatalf("still held %v after LOCK … MAXHOLD %d", time.Since(start), maxHoldMS)
		}
		if r := holder.Do("PING"); r.Str != "PONG" {
			t.Fatalf("PING = %v; want PONG", r)
		}
		if _, ok := lc.Lock(t, other, key, "PX", 10000); ok {
			took = time.Since(start)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("MAXHOLD %d ms (ttl %d ms): free after %v", maxHoldMS, ttlMS, took)
	if took < (maxHoldMS-100)*time.Millisecond || took > (maxHoldMS+1000)*time.Millisecond {
		t.Errorf("free %v after LOCK … MAXHOLD %d; want about %d ms", took, maxHoldMS, maxHoldMS)
	}
	// The notice is due by the end of the validity the last renewal
	// answered, just before the deadline, and is read here after the other
	// client's grant; until then RENEW runs (and answers 0). It is the lost
	// lock's, by key and token: a RENEW with another token (this test
	// sent "t" before the notice was kept by token too) is not answered
	// for it.
	want := "LOCKLOST lock on '" + key + "' was lost: MAXHOLD of 1800 ms reached"
	var r lockclient.Reply
	for i := 0; i < 50; i++ {
		if r = holder.Do("RENEW", key, tok, "PX", "100"); r.Kind == '-' {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r.Kind != '-' || r.Str != want {
		t.Errorf("the holder's RENEW = %v; want -%s", r, want)
	}
}

// Under RESP3 a lost keepalive lock is pushed to its holder, whose next
// lock command on the key answers LOCKLOST once.
func TestKeepaliveLostPush(t *testing.T) {
	t.Parallel()
	const ttlMS = 600
	eachSize(t, func(t *testing.T, n int) {
		cl := startCluster(t, n)
		in := startInstanceEnv(t, cl.addrs(), []string{slowHostNodeTimeout})
		// One cycle with a long lease first: the writers' connections are
		// made as lockproxy starts, and on a loaded host they were not all
		// up within the 600 ms lock's node timeout (NOQUORUM in a CI run).
		lc.MustLock(t, lc.NewClient(t, in.addr, 2), "lost-warm-"+lockclient.RandID(), "PX", 10000)
		holder := lc.DialRaw(t, in.addr)
		if r := holder.Do("HELLO", "3"); r.Kind != '%' {
			t.Fatalf("HELLO 3 = %v; want a map", r)
		}
		key := "lost-" + lockclient.RandID()
		tok := rawGrant(t, holder, key, "PX", fmt.Sprint(ttlMS), "KEEPALIVE")

		for _, nd := range cl.nodes[:n/2+1] {
			nd.Kill()
		}
		killed := time.Now()
		r, err := holder.Read()
		took := time.Since(killed)
		if err != nil {
			t.Fatalf("no push within 10 s of killing a majority: %v", err)
		}
		want := fmt.Sprintf(`>["lock-lost" %q %q]`, key, tok)
		if r.Kind != '>' || len(r.Elems) != 3 || r.Elems[0].Str != "lock-lost" || r.Elems[1].Str != key || r.Elems[2].Str != tok {
			t.Fatalf("push = %v; want %s", r, want)
		}
		t.Logf("lock-lost pushed %v after a majority was killed (renewal every %d ms)", took, ttlMS/3)
		if took > 3*time.Second {
			t.Errorf("lock-lost pushed %v after a majority was killed; want within a lease or so", took)
		}

		r = holder.Do("LOCK", key, "PX", fmt.Sprint(ttlMS))
		if wantErr := "LOCKLOST lock on '" + key + "' was lost: a renewal did not reach a quorum of nodes"; r.Kind != '-' || r.Str != wantErr {
			t.Errorf("the holder's next LOCK = %v; want -%s", r, wantErr)
		}
		if r := holder.Do("LOCK", key, "PX", fmt.Sprint(ttlMS)); r.Kind != '-' || !strings.HasPrefix(r.Str, "NOQUORUM") {
			t.Errorf("the LOCK after that = %v; want NOQUORUM (it behaves normally again)", r)
		}
		if v := metricValue(t, in, `lockproxy_lock_lost_total{reason="renew_failed"}`); v != "1" {
			t.Errorf(`lockproxy_lock_lost_total{reason="renew_failed"} = %q; want 1`, v)
		}
	})
}

// SIGTERM releases the keepalive locks before lockproxy exits, rather than
// leaving them to their leases.
func TestKeepaliveReleasedAtShutdown(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	in := startInstance(t, cl.addrs())
	holder := lc.DialRaw(t, in.addr)
	var keys, toks []string
	for i := 0; i < 5; i++ {
		key := fmt.Sprintf("shutdown-ka-%d-%s", i, lockclient.RandID())
		keys = append(keys, key)
		toks = append(toks, rawGrant(t, holder, key)) // 30 s default lease, KEEPALIVE
	}
	for i, key := range keys {
		if missing := cl.missingNodes(t, key, toks[i]); len(missing) > 1 {
			t.Fatalf("LOCK %q: missing on nodes %v", key, missing)
		}
	}
	start := time.Now()
	if err := in.proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	if _, err := in.proc.Wait(10 * time.Second); err != nil {
		t.Fatalf("lockproxy did not exit within 10 s of SIGTERM: %v", err)
	}
	t.Logf("exited %v after SIGTERM", time.Since(start))
	// A release answers once a majority released, and the node clients
	// close right after, so a minority may keep its copy until the lease
	// ends; the lock is free all the same.
	other := lc.NewClient(t, startInstance(t, cl.addrs()).addr, 2)
	for i, key := range keys {
		if h := cl.holders(t, key, toks[i]); h > len(cl.nodes)/2 {
			t.Errorf("%q still held on %d of %d nodes after shutdown; want released on a majority", key, h, len(cl.nodes))
		}
		if g, ok := lc.Lock(t, other, key, "PX", 10000); !ok {
			t.Errorf("LOCK %q through another instance after shutdown = nil; want a grant", key)
		} else {
			lc.Unlock(t, other, key, g.Token)
		}
	}
}

// TestLockDelay: with locks.lock_delay set for a pattern, a KEEPALIVE lock
// whose holder's connection drops without UNLOCK stays held for the delay
// (a waiter gets it only after it), while a key without a rule is released
// at once; an UNLOCKed lock is never delayed.
func TestLockDelay(t *testing.T) {
	t.Parallel()
	const delay = 1500 * time.Millisecond
	cl := startCluster(t, 3)
	in := startInstanceEnv(t, cl.addrs(), []string{"LOCKPROXY_LOCKS_LOCK_DELAY=delayed:*=1500ms"})
	waiter := lc.NewClient(t, in.addr, 2)
	for _, tc := range []struct {
		name      string
		key       string
		unlock    bool // the holder UNLOCKs before it goes
		wantDelay bool
	}{
		{"dropped connection, matching key", "delayed:" + lockclient.RandID(), false, true},
		{"dropped connection, other key", "plain:" + lockclient.RandID(), false, false},
		{"UNLOCK, matching key", "delayed:" + lockclient.RandID(), true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			holder := lc.DialRaw(t, in.addr)
			tok := rawGrant(t, holder, tc.key, "PX", "1000", "KEEPALIVE")
			if tc.unlock {
				if r := holder.Do("UNLOCK", tc.key, tok); r.Int != 1 {
					t.Fatalf("UNLOCK = %v; want :1", r)
				}
			}
			gone := time.Now()
			_ = holder.Conn.Close()
			g, ok := lc.Lock(t, waiter, tc.key, "PX", 1000, "WAIT", 5000)
			took := time.Since(gone)
			if !ok {
				t.Fatalf("LOCK … WAIT 5000 = nil %v after the holder left; want a grant", took)
			}
			t.Logf("granted %v after the holder's connection closed (fence %d)", took.Round(time.Millisecond), g.Fence)
			switch {
			case tc.wantDelay && took < delay-100*time.Millisecond:
				t.Errorf("granted %v after the holder left; want no earlier than the %v lock-delay", took, delay)
			case !tc.wantDelay && took >= delay-100*time.Millisecond:
				t.Errorf("granted %v after the holder left; want well before the %v lock-delay, which does not apply", took, delay)
			}
			lc.Unlock(t, waiter, tc.key, g.Token)
		})
	}
	if m := metricValue(t, in, "lockproxy_lock_delays_total"); m != "1" {
		t.Errorf("lockproxy_lock_delays_total = %q; want 1", m)
	}
}
