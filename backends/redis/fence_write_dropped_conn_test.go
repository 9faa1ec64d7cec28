package redis_test

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/backends/redis"
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
// write by 6 s and passes what comes after it at once.
func TestFenceWriteOnDroppedConnectionKilled(t *testing.T) {
	// Mostly waits for the delayed link: beside the other such tests,
	// on nodes of its own.
	t.Parallel()
	// Long enough for n2's release to run first also on a loaded host
	// (it goes out once the wait for the fence write's answer failed, 1 s).
	const delay = 6 * time.Second
	b, rs, logs, p := backendWithN2Link(t, redis.DefaultUser)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const key = "fence-dropped"
	const ttl = 10 * time.Second
	redis.WarmUp(ctx, t, b, rs, key, ttl)
	c2 := rs[2].Client(t)

	// n2's fence write for the grant is held on the link; what is sent
	// after it passes at once.
	heal := holdNextFenceWrite(t, b, p, delay, nil)
	g, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "holder", TTL: ttl, NoReentry: true})
	if err != nil {
		t.Fatal(err)
	}
	heal()
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
		if i == 250 {
			t.Fatal("n2 still has the lock key 5 s after UNLOCK")
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
