package redis_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest/observer"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/backends/redis"
	"github.com/lockproxy/lockproxy/test/faultproxy"
	"github.com/lockproxy/lockproxy/test/harness"
)

// backendWithN2Link is redis.LateAcquireBackend with n2 behind a test
// proxy p (healed: PassThrough).
func backendWithN2Link(t *testing.T, user redis.LateAcquireUser) (*redis.Backend, []*harness.Redis, *observer.ObservedLogs, *faultproxy.Proxy) {
	t.Helper()
	var p *faultproxy.Proxy
	b, rs, logs := redis.LateAcquireBackend(t, user, func(addr string) string {
		p = linkTo(t, addr)
		return p.Addr()
	})
	return b, rs, logs, p
}

// linkTo is a test proxy in front of addr (passing everything until told
// otherwise), closed at the end of the test.
func linkTo(t *testing.T, addr string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// holdNextFenceWrite makes p hold n2's next fence write for delay; also,
// when not nil, runs on n2's writer right after the hold is set (before
// the write). The returned heal, called once that write was made (after
// the LOCK that makes it), waits until p holds it and lets what comes
// after it pass at once.
func holdNextFenceWrite(t *testing.T, b *redis.Backend, p *faultproxy.Proxy, delay time.Duration, also func()) (heal func()) {
	t.Helper()
	delayed := make(chan struct{})
	redis.BeforeNextFenceStore(t, b, p.Addr(), func() {
		p.SetLatency(delay, 0)
		if also != nil {
			also()
		}
		close(delayed)
	})
	return func() {
		t.Helper()
		select {
		case <-delayed:
		case <-time.After(5 * time.Second):
			t.Fatal("n2 wrote no fence write for the grant")
		}
		for i := 0; p.Held() == 0; i++ {
			if i == 500 {
				t.Fatal("the link holds no bytes 5 s after n2's fence write")
			}
			time.Sleep(10 * time.Millisecond)
		}
		p.PassThrough()
	}
}

// failedReentryKeepsN2: with T holding key on n0 and n2 and n1 held by
// another, T's reentrant LOCK is granted by n0, refused by n1, and its
// answer on n2 comes delay late (the link holds it): the LOCK fails and
// is rolled back. The roll-back must leave T's earlier hold on n2: once
// n1's holder leaves, n2 alone decides whether T still holds a majority,
// and another token must not be granted the key.
func failedReentryKeepsN2(ctx context.Context, t *testing.T, b *redis.Backend, rs []*harness.Redis, p *faultproxy.Proxy, key string, ttl, delay time.Duration) {
	t.Helper()
	c0, c1, c2 := rs[0].Client(t), rs[1].Client(t), rs[2].Client(t)
	p.SetLatency(delay, 0)
	lockErr := make(chan error, 1)
	go func() {
		_, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "T", TTL: ttl})
		lockErr <- err
	}()
	// n0's second hold (its lockm's hold count; a first hold's lockm is
	// at most its attempt mark) shows the attempt went out, and the
	// proxy holding bytes shows its SET NX to n2 is in the proxy (on a
	// loaded machine n2's writer may send it after n0's two round trips:
	// healed before, the SET NX passed at once and the LOCK was granted).
	// New bytes then pass at once.
	for i := 0; !strings.HasPrefix(c0.Get(ctx, "lp:lockm:"+key).Val(), "1,") || p.Held() == 0; i++ {
		if i == 200 {
			t.Fatalf("T's reentrant hold on n0 (lockm %q) and its SET NX held for n2 (%d chunks) not both seen within 2 s",
				c0.Get(ctx, "lp:lockm:"+key).Val(), p.Held())
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.PassThrough()
	if err := <-lockErr; err == nil {
		t.Fatal("T's reentrant LOCK with n1 held and n2 late granted; want it refused")
	}
	// Watched past the late SET NX's arrival.
	if err := c1.Del(ctx, "lp:lock:"+key).Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for time.Since(start) < delay+500*time.Millisecond {
		if v := c2.Get(ctx, "lp:lock:"+key).Val(); v != "T" {
			t.Fatalf("n2's lock key is %q %v after the failed reentrant LOCK; want T's hold kept", v, time.Since(start).Round(time.Millisecond))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "U", TTL: ttl}); err == nil {
		t.Fatal("another token granted the key while T holds it (two holders)")
	}
}
