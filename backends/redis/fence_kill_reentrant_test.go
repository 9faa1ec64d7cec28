package redis_test

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/backends/redis"
	"github.com/lockproxy/lockproxy/test/faultproxy"
)

// TestFenceKillKeepsReentrantHold: T's fresh grant on n2 has its fence
// write (lockf) delayed on the link past the node timeout; the writer
// drops that connection and (since the fence-write kill) kills it from the
// next one, so T's live hold on n2 never gets its lockf. The roll-back of
// a later reentrant LOCK of T whose answer on n2 is lost
// (lateGrantReleaseScript) takes a hold without lockf or lockm for the
// lost SET NX's own and deletes T's hold on n2: T, still within its
// validity, holds n0 alone, and once n1's holder leaves another token is
// granted n1 and n2 (two holders). Without the kill the late fence write
// lands (3 s) and the roll-back keeps T's hold.
func TestFenceKillKeepsReentrantHold(t *testing.T) {
	const delay = 3 * time.Second
	var p *faultproxy.Proxy
	b, rs, logs := redis.LateAcquireBackend(t, redis.DefaultUser, func(addr string) string {
		var err error
		if p, err = faultproxy.New(addr); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		return p.Addr()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const key = "fence-kill-reentrant"
	const ttl = 30 * time.Second
	c0, c1, c2 := rs[0].Client(t), rs[1].Client(t), rs[2].Client(t)

	// Every writer connection made, the scripts loaded.
	if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "warm", TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.Unlock(ctx, key, "warm"); !ok || err != nil {
		t.Fatalf("UNLOCK warm = %v, %v", ok, err)
	}
	for i := 0; c2.Exists(ctx, "lp:lock:"+key, "lp:lockf:"+key).Val() != 0; i++ {
		if i == 200 {
			t.Fatal("the warm-up keys are still on n2 2 s after UNLOCK")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := c1.Set(ctx, "lp:lock:"+key, "other", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}

	// T's grant (n0, n2): n2's fence write is held on the link.
	delayed := make(chan struct{})
	redis.BeforeNextFenceStore(t, b, p.Addr(), func() {
		p.SetLatency(delay, 0)
		close(delayed)
	})
	if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "T", TTL: ttl}); err != nil {
		t.Fatalf("T's LOCK with n0 and n2 free = %v", err)
	}
	<-delayed
	for i := 0; p.Held() == 0; i++ {
		if i == 500 {
			t.Fatal("the link holds no bytes 5 s after n2's fence write")
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.PassThrough()
	// Past the held fence write's arrival.
	time.Sleep(delay + time.Second)
	if v := c2.Get(ctx, "lp:lock:"+key).Val(); v != "T" {
		t.Fatalf("n2's lock key %q; want T", v)
	}
	t.Logf("n2 lockf after the delayed fence write: %q; kills logged: %d",
		c2.Get(ctx, "lp:lockf:"+key).Val(), len(logs.FilterMessage("killed a dropped connection").All()))

	// T's reentrant LOCK: n0 grants, n1 refuses, n2's answer is late.
	p.SetLatency(delay, 0)
	lockErr := make(chan error, 1)
	go func() {
		_, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "T", TTL: ttl})
		lockErr <- err
	}()
	for i := 0; c0.Exists(ctx, "lp:lockm:"+key).Val() == 0; i++ {
		if i == 200 {
			t.Fatal("T's reentrant hold on n0 not seen within 2 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.PassThrough()
	if err := <-lockErr; err == nil {
		t.Fatal("T's reentrant LOCK with n1 held and n2 late granted; want it refused")
	}
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
