package redis_test

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/backends/redis"
	"github.com/lockproxy/lockproxy/quorum"
)

// TestFenceWriteOnUnkilledConnectionSwept: a fresh grant's fence write
// (lockf) is left unanswered on a connection that is dropped but not
// killed, because a release of another key was left unanswered on it too
// (a release must still run). The holder's UNLOCK goes out on the next
// connection and runs first; the late fence write then stores a lockf
// naming a token that no longer holds the key, which stayed for the
// whole lease (TestUnlockRightAfterLockLeavesNoKey saw it under CPU
// load). The writer now owes that write a sweep: once the node no longer
// lists the old connection, it deletes the lockf. Here the link holds the
// fence write, and the release queued behind it, for 6 s; the connection
// is gone once the link has passed them on and closed it.
func TestFenceWriteOnUnkilledConnectionSwept(t *testing.T) {
	// Mostly waits for the delayed link: beside the other such tests,
	// on nodes of its own.
	t.Parallel()
	// Long enough for n2's UNLOCK to run first also on a loaded host (it
	// goes out once the other key's release timed out, 1 s).
	const delay = 6 * time.Second
	b, rs, logs, p := backendWithN2Link(t, redis.DefaultUser)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const key = "fence-unkilled"
	// Far longer than the test: a lockf left behind would outlive it.
	const ttl = 40 * time.Second
	redis.WarmUp(ctx, t, b, rs, key, ttl)
	c2 := rs[2].Client(t)
	n2 := b.Nodes()[2]

	// n2's fence write for the grant is held on the link, and so is the
	// release of another key, queued from the writer before the grant is
	// answered: it is the writer's next batch, on the same connection.
	heal := holdNextFenceWrite(t, b, p, delay, func() {
		n2.StartRelease(context.Background(), "other-"+key, "other", quorum.AnyHold, func(bool, error) {})
	})
	g, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "holder", TTL: ttl, NoReentry: true})
	if err != nil {
		t.Fatal(err)
	}
	// New connections pass at once; the old one's bytes stay in order
	// behind the fence write.
	heal()
	// The UNLOCK is queued while n2's writer waits for the other key's
	// release; that wait fails at the node's timeout (1 s), the
	// connection is dropped without a kill, and the UNLOCK goes out on a
	// new one.
	time.Sleep(100 * time.Millisecond)
	if ok, err := b.Unlock(ctx, key, g.Token); !ok || err != nil {
		t.Fatalf("UNLOCK = %v, %v; want released", ok, err)
	}
	for i := 0; c2.Exists(ctx, "lp:lock:"+key).Val() != 0; i++ {
		if i == 250 {
			t.Fatal("n2 still has the lock key 5 s after UNLOCK")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The link passes the late fence write on once its delay is over, and
	// then closes the old connection: the node no longer lists it.
	for i := 0; p.Held() != 0; i++ {
		if i == 1000 {
			t.Fatal("the link still holds the fence write 10 s after UNLOCK")
		}
		time.Sleep(10 * time.Millisecond)
	}
	landed := time.Now()
	// The writer asks whether the connection is gone at most a second
	// apart; the bound leaves a loaded host room.
	const bound = 5 * time.Second
	seen := false
	for c2.Exists(ctx, "lp:lock:"+key, "lp:lockf:"+key).Val() != 0 {
		seen = true
		if time.Since(landed) > bound {
			v := c2.Get(ctx, "lp:lockf:"+key).Val()
			pttl := c2.PTTL(ctx, "lp:lockf:"+key).Val()
			t.Fatalf("n2 still has lockf %q (PTTL %v) %v after the late fence write was passed on; want it swept", v, pttl, bound)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("n2's lock keys gone %v after the late writes were passed on (late lockf seen: %v)", time.Since(landed).Round(time.Millisecond), seen)
	if killed := logs.FilterMessage("killed a dropped connection").All(); len(killed) != 0 {
		t.Errorf("kills logged: %v; want none (an unanswered release keeps the connection alive)", killed)
	}
	if swept := logs.FilterMessage("swept a dropped connection's late fence write").Len(); swept != 1 {
		t.Errorf("late fence writes swept: %d; want 1", swept)
	}
}
