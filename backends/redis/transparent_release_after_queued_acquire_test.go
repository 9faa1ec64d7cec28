package redis

import (
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// TestTransparentReleaseAfterQueuedAcquire: a SET NX in transparent mode
// (a NoReentry LOCK) is answered once a majority granted it, and its
// acquire may still be queued on the last node's writer then; the
// client's compare-and-delete release, a transparent write on a go-redis
// connection, must run there after that acquire and delete what it
// granted. Here n2's writer is held (after an earlier grant, before its
// caller hears of it) while the SET NX is granted by n0 and n1 and the
// release is sent. Before, the release ran on n2 at once, found nothing
// (answered 0), and n2's acquire then set the key for its whole TTL: the
// CI failure of test/transparent TestRedisPyLock ("key on no node after
// with"), where the key left on one node held the with-lock's own token.
func TestTransparentReleaseAfterQueuedAcquire(t *testing.T) {
	b, rs := newRealBackend(t, 3)
	ctx := ctxTimeout(t, 30*time.Second)
	n2 := b.nodes[2]
	resume := holdWriterInGrant(t, ctx, b, n2)
	const key, token = "lock:py", "with-token"
	if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: token, TTL: 10 * time.Second, NoReentry: true}); err != nil {
		t.Fatalf("SET NX with n2's writer held: %v; want granted by n0 and n1", err)
	}
	const release = `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) end return 0`
	replies := make(chan []backends.NodeReply, 1)
	go func() {
		replies <- b.Run(ctx, []string{"eval", release, "1", key, token}, []int{3}, false)
	}()
	var rs2 []backends.NodeReply
	select {
	case rs2 = <-replies:
		t.Errorf("the release was answered while n2's acquire was still queued: %+v", rs2)
	case <-time.After(200 * time.Millisecond):
	}
	resume()
	if rs2 == nil {
		rs2 = <-replies
	}
	for i, r := range rs2 {
		if r.Err != nil || r.Val != int64(1) {
			t.Errorf("n%d: release = %v, %v; want 1, after its acquire", i, r.Val, r.Err)
		}
	}
	// Whatever n2's writer still had queued has run once another
	// operation through it is answered.
	if ok, err := n2.Release(ctx, "other", "o", quorum.AnyHold); !ok || err != nil {
		t.Fatalf("n2: release of other = %v, %v", ok, err)
	}
	for i, r := range rs {
		v, err := r.Client(t).Get(ctx, "lp:lock:"+key).Result()
		if !errors.Is(err, goredis.Nil) {
			pttl := r.Client(t).PTTL(ctx, "lp:lock:"+key).Val()
			t.Errorf("n%d still has the released key: %q, %v (PTTL %v)", i, v, err, pttl)
		}
	}
}
