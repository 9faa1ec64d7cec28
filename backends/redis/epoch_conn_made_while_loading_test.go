package redis

import (
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/test/harness"
	goredis "github.com/redis/go-redis/v9"
)

// TestEpochConnMadeWhileLoadingStillChecks: a writer connection made while
// the node loads its data after a restart gets -LOADING to its set-up's
// SET NX and GET, so it has no epoch and checks none for its whole life: a
// FLUSHALL later is not seen by its batches, which keep granting from the
// emptied node (until a health check, if any runs). The connection must
// learn the epoch once the node has loaded, or be made again.
func TestEpochConnMadeWhileLoadingStillChecks(t *testing.T) {
	harness.RequireBinary(t, "redis-server", "redis-server")
	// Loading 20000 keys takes about 2 s: time for a connection's set-up.
	r := harness.StartRedis(t, harness.RedisOptions{Args: []string{"--key-load-delay", "100", "--loading-process-events-interval-bytes", "1024"}})
	n := newTestNode(t, r)
	ctx := ctxTimeout(t, 30*time.Second)
	direct := r.Client(t)
	if err := direct.Eval(ctx, "for i = 1, 20000 do redis.call('SET', 'pad:' .. i, i) end", nil).Err(); err != nil && err != goredis.Nil {
		t.Fatal(err)
	}
	if g, err := n.Acquire(ctx, quorum.Request{Key: "warm", Token: "W", TTL: time.Minute}); err != nil || !g.Acquired {
		t.Fatalf("warm-up acquire: %+v, %v", g, err)
	}
	if err := direct.Save(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	restarted := make(chan error, 1)
	go func() { restarted <- r.TryRestart() }()
	// Acquire until one runs on a connection made while the node loads.
	sawLoading := false
	for i := 0; i < 400 && !sawLoading; i++ {
		_, err := n.Acquire(ctx, quorum.Request{Key: "k", Token: "probe", TTL: time.Second})
		sawLoading = err != nil && strings.Contains(err.Error(), "LOADING")
		if !sawLoading {
			time.Sleep(5 * time.Millisecond)
		}
	}
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	if !sawLoading {
		t.Skip("no acquire met the node loading")
	}
	if g, err := n.Acquire(ctx, quorum.Request{Key: "k", Token: "A", TTL: time.Minute}); err != nil || !g.Acquired {
		t.Fatalf("A's acquire after loading: %+v, %v", g, err)
	}
	if err := r.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if g, err := n.Acquire(ctx, quorum.Request{Key: "k", Token: "B", TTL: time.Minute}); err == nil && g.Acquired {
		t.Errorf("B was granted k from the flushed node on a connection made while it loaded: its batches check no epoch")
	}
}
