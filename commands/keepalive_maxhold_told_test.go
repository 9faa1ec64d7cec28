package commands

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/backends/redis"
	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/resp"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestMaxHoldToldWithinLastValidity: a KEEPALIVE lock's MAXHOLD ends it
// with a loss told to its holder ("a RESP3 connection receives the push
// [\"lock-lost\", key, token]"), who relies on the lock until then. The
// watchdog's last renewal asks for what is left until the deadline, so
// the lease on the nodes ends about then, and a rival may be granted the
// key as soon as it does: the loss must be told within the validity that
// renewal answered, as a failed renewal's is, not at the deadline. Before,
// the push went out at the deadline itself, when the lease was ending, and
// a rival polling the key was granted it 0.3 to 2 ms after the push (on a
// loaded host a late timer puts the grant first). Here the nodes' drift
// allowance is raised (drift factor 0.2) so that the validity answered
// ends over 100 ms before the deadline, and the push must come well
// before the rival's grant.
func TestMaxHoldToldWithinLastValidity(t *testing.T) {
	be := newDriftRedLock(t, 0.2)
	c := dialRESP3(t, be)
	const key, tok = "mhtold", "t-mh"
	cmd := "LOCK " + key + " PX 1500 TOKEN " + tok + " KEEPALIVE MAXHOLD 2000"
	if got := c.do(t, cmd); got != "%3" {
		t.Fatalf("%s = %q; want a grant", cmd, got)
	}
	for range 6 {
		c.reply(t)
	}
	pushed, granted := pushThenRival(t, c, be, key)
	t.Logf("rival granted %v after the push", granted.Sub(pushed).Round(100*time.Microsecond))
	if gap := granted.Sub(pushed); gap < 40*time.Millisecond {
		t.Errorf("a rival was granted the key %v after the holder was told of its MAXHOLD; want the loss told within the last validity answered (over 100 ms before the lease ends)",
			gap.Round(100*time.Microsecond))
	}
}

// TestMaxHoldToldWithinCappedValidity: where the lock store answers a
// validity far below the TTL (ZooKeeper: capped by the session's
// horizon), MAXHOLD's loss is still told within the validity last
// answered, and not long before the deadline either: the watchdog renews
// for what is left of the hold until that validity reaches about the
// deadline, rather than stop renewing a TTL/3 before it, which would leave
// the holder relying on the lock long after the lock store's last word
// (or, told at the end of that word, cut the hold short).
func TestMaxHoldToldWithinCappedValidity(t *testing.T) {
	const ttl, maxHold = 3 * time.Second, 4 * time.Second
	const validity = 300 * time.Millisecond
	b := &cappedValidityBackend{validity: validity, okRenews: 1 << 30}
	k := newTestKeepalives(t, b, time.Minute)
	c := newTestConn(t, 3)
	start := time.Now()
	if !k.startGrant(c.ctx, c.ka, "k", "tok", ttl, maxHold, backends.Write, true,
		grantTiming{sent: start, validity: validity}) {
		t.Fatal("startGrant = false")
	}
	for i := 0; c.ka.live.Load() != 0; i++ {
		if i > 1000 {
			t.Fatal("the watchdog still runs 10 s after a MAXHOLD of 4 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	told := time.Now()
	waitStopped(t, k)
	b.mu.Lock()
	end := b.lastOK.Add(validity)
	b.mu.Unlock()
	if len(c.pushed()) != 1 {
		t.Fatalf("pushes %q; want one lock-lost push", c.pushed())
	}
	t.Logf("told %v after the grant, %v before the last validity answered ended", told.Sub(start).Round(time.Millisecond), end.Sub(told).Round(time.Millisecond))
	// The loop above polls every 10 ms.
	if told.After(end.Add(15 * time.Millisecond)) {
		t.Errorf("holder told of its MAXHOLD %v after the validity the last renewal answered (%v) had ended",
			told.Sub(end).Round(time.Millisecond), validity)
	}
	if held := told.Sub(start); held < maxHold-validity {
		t.Errorf("holder told of its MAXHOLD of %v after %v; want within the last %v before it", maxHold, held.Round(time.Millisecond), validity)
	}
}

// newDriftRedLock is a RedLock backend over 3 real nodes whose drift
// allowance is factor of the TTL (and 2 ms): a validity answered ends
// that much before the lease asked for.
func newDriftRedLock(t *testing.T, factor float64) *redis.Backend {
	t.Helper()
	harness.RequireBinary(t, "redis-server", "redis-server")
	rs := harness.StartRedisN(t, 3, harness.RedisOptions{})
	cfg := redis.Config{RetryMin: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond,
		Quorum: quorum.Config{DriftFactor: factor, DriftMin: 2 * time.Millisecond, TimeoutMin: 100 * time.Millisecond}}
	for _, r := range rs {
		cfg.Nodes = append(cfg.Nodes, redis.NodeConfig{Addr: r.Addr, KeyPrefix: "lp:", Timeout: time.Second, Metrics: redis.NewMetrics(nil)})
	}
	be, err := redis.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = be.Close() })
	return be
}

// dialRESP3 serves a handler over be and dials it with HELLO 3, its reply
// read.
func dialRESP3(t *testing.T, be backends.Backend) *rawConn {
	t.Helper()
	h := NewHandler(Options{Limits: testLimits, Backend: be})
	return helloRESP3(t, dialRaw(t, serveOn(t, &resp.Server{Handler: h})))
}

// helloRESP3 switches c to RESP3 (HELLO 3) and reads the reply.
func helloRESP3(t *testing.T, c *rawConn) *rawConn {
	t.Helper()
	if got := c.do(t, "HELLO 3"); !strings.HasPrefix(got, "%") {
		t.Fatalf("HELLO 3 = %q", got)
	}
	for i := 0; ; i++ { // the rest of HELLO's map, up to its last pair's empty array
		if i > 100 {
			t.Fatal("HELLO's map did not end")
		}
		if c.reply(t) == "*0" {
			break
		}
	}
	return c
}

// pushThenRival polls key for a rival (pollRival) while it waits for c's
// lock-lost push at MAXHOLD, and returns when the push came and when the
// rival was granted the key (10 s at most).
func pushThenRival(t *testing.T, c *rawConn, be backends.Backend, key string) (pushed, granted time.Time) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rival, stop := pollRival(ctx, be, key)
	defer stop()
	if got := c.reply(t); got != ">3" {
		t.Fatalf("after MAXHOLD: %q; want the lock-lost push", got)
	}
	pushed = time.Now()
	for range 3 {
		c.reply(t)
	}
	select {
	case granted = <-rival:
	case <-ctx.Done():
		t.Fatal("the rival was not granted the key within 10 s")
	}
	return pushed, granted
}

// pollRival tries to lock key for a rival token until it is granted or
// ctx ends, and sends when it was granted; the returned function stops
// it and waits for it.
func pollRival(ctx context.Context, be backends.Backend, key string) (<-chan time.Time, func()) {
	ctx, cancel := context.WithCancel(ctx)
	granted := make(chan time.Time, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if _, err := be.Lock(ctx, backends.LockRequest{Key: key, Token: "rival", TTL: 5 * time.Second, Mode: backends.Write, NoReentry: true}); err == nil {
				granted <- time.Now()
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return granted, func() { cancel(); <-done }
}

// TestRenewInMaxHoldsLastThirdKeptAlive: a RENEW of a KEEPALIVE lock sets
// its lease, "and the watchdog then renews within half the validity the
// RENEW answered" (README), also in the last third before its MAXHOLD,
// when the watchdog no longer renews for a lease of its own: the holder
// relies on the lock until told it is lost. Before, the watchdog ignored
// a RENEW then: a RENEW PX 150 of a PX 3000 MAXHOLD 3000 lock 2.5 s after
// the grant left the lease to end 150 ms later, and a rival was granted
// the key about 100 ms before the holder was told of its MAXHOLD (with a
// drift allowance of 0.2, which tells it early).
func TestRenewInMaxHoldsLastThirdKeptAlive(t *testing.T) {
	be := newDriftRedLock(t, 0.2)
	c := dialRESP3(t, be)
	const key, tok = "mhrenew", "t-mhr"
	cmd := "LOCK " + key + " PX 3000 TOKEN " + tok + " KEEPALIVE MAXHOLD 3000"
	if got := c.do(t, cmd); got != "%3" {
		t.Fatalf("%s = %q; want a grant", cmd, got)
	}
	granted := time.Now()
	for range 6 {
		c.reply(t)
	}
	// With this drift allowance the watchdog's last renewal comes about
	// 2.3 s after the grant (its validity then ends at about 2.76 s); the
	// RENEW comes after it.
	time.Sleep(time.Until(granted.Add(2500 * time.Millisecond)))
	if got := c.do(t, "RENEW "+key+" "+tok+" PX 150"); !strings.HasPrefix(got, ":") || got == ":0" {
		t.Fatalf("RENEW = %q; want the validity", got)
	}
	pushed, at := pushThenRival(t, c, be, key)
	t.Logf("pushed %v after the grant; rival granted %v after the push", pushed.Sub(granted).Round(time.Millisecond), at.Sub(pushed).Round(100*time.Microsecond))
	if at.Before(pushed) {
		t.Errorf("a rival was granted the key %v after the grant, %v before the holder was told of its MAXHOLD, after a RENEW PX 150 of the kept lock 2.5 s after the grant",
			at.Sub(granted).Round(time.Millisecond), pushed.Sub(at).Round(time.Millisecond))
	}
}
