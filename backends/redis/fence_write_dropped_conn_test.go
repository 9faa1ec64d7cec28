package redis_test

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/backends/redis"
	"github.com/lockproxy/lockproxy/test/faultproxy"
)

// TestFenceWriteOnDroppedConnectionKilled: a fresh grant's fence write
// (lockf) goes out after its batch is answered, and its answer is read
// alone when no other batch comes. Where that read times out (a node
// starved of CPU, a slow link), the writer drops the connection and the
// holder's UNLOCK goes out on a new one, which the node may serve first:
// the release finds no lockf to delete, the late fence write then stores
// one, and it stays for the whole lease after the lock was released (seen
// in CI: two lockf keys left on one node after every UNLOCK answered 1).
// The dropped connection is now killed from the new one ahead of the
// release, so its fence write never runs. Here the link delays the fence
// write by 3 s and passes what comes after it at once.
func TestFenceWriteOnDroppedConnectionKilled(t *testing.T) {
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
	const key = "fence-dropped"
	const ttl = 10 * time.Second

	// Every writer connection made, the scripts loaded.
	if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "warm", TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.Unlock(ctx, key, "warm"); !ok || err != nil {
		t.Fatalf("UNLOCK warm = %v, %v", ok, err)
	}
	c2 := rs[2].Client(t)
	for i := 0; c2.Exists(ctx, "lp:lock:"+key, "lp:lockf:"+key).Val() != 0; i++ {
		if i == 200 {
			t.Fatal("the warm-up keys are still on n2 2 s after UNLOCK")
		}
		time.Sleep(10 * time.Millisecond)
	}

	// n2's next fence write is delayed on the link; what is sent after it
	// passes at once.
	delayed := make(chan struct{})
	redis.BeforeNextFenceStore(t, b, p.Addr(), func() {
		p.SetLatency(delay, 0)
		close(delayed)
	})
	g, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "holder", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
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
	// The UNLOCK is queued while n2's writer waits for the fence write's
	// answer; the wait fails at the node's timeout (1 s here), the
	// connection is dropped, and the release goes out on a new one.
	time.Sleep(100 * time.Millisecond)
	if ok, err := b.Unlock(ctx, key, g.Token); !ok || err != nil {
		t.Fatalf("UNLOCK = %v, %v; want released", ok, err)
	}
	sent := time.Now()
	// UNLOCK answers once a majority released; n2's release may come
	// later (a new connection's set-up first).
	for i := 0; c2.Exists(ctx, "lp:lock:"+key).Val() != 0; i++ {
		if i == 100 {
			t.Fatal("n2 still has the lock key 2 s after UNLOCK")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for time.Since(sent) < delay+time.Second {
		if n := c2.Exists(ctx, "lp:lock:"+key, "lp:lockf:"+key).Val(); n != 0 {
			pttl := c2.PTTL(ctx, "lp:lockf:"+key).Val()
			t.Fatalf("n2 has %d of the lock's keys %v after its UNLOCK (lockf PTTL %v); want none", n, time.Since(sent).Round(time.Millisecond), pttl)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if killed := logs.FilterMessage("killed a dropped connection").All(); len(killed) == 0 || killed[0].ContextMap()["killed"] != int64(1) {
		t.Errorf("kills logged: %v; want the dropped connection killed (1)", killed)
	}
}
