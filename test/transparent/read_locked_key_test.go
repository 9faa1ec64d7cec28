package transparent

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestReadLockedKeyThroughPlainCommands: a key held by RLOCK readers holds
// lockproxy's read marker on the nodes, "\x00lockproxy:read", and GET
// answers it, as a script's redis.call("get") on the nodes also sees it
// (GET alone could not answer anything else consistently). What a lock
// library asks of GET holds: the key is taken (locked(): not nil, and
// SET NX is refused), by no token a client can have (owned(): the marker
// equals no token, as LOCK … TOKEN refuses it), and a reader's token
// does not release it through a compare-and-delete script: readers end
// with UNLOCK.
func TestReadLockedKeyThroughPlainCommands(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := e.client(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)
	const key, reader = "lock:rd", "reader-1"
	if _, err := c.Do(ctx, "RLOCK", key, "PX", 20000, "TOKEN", reader).Result(); err != nil {
		t.Fatalf("RLOCK %s: %v", key, err)
	}
	const marker = "\x00lockproxy:read"
	if v, err := c.Get(ctx, key).Result(); err != nil || v != marker {
		t.Errorf("GET %s while read-locked = %q, %v; want %q (taken, by no client's token)", key, v, err, marker)
	}
	if v, err := c.Do(ctx, "SET", key, "w", "NX", "PX", 10000).Result(); !errors.Is(err, redis.Nil) {
		t.Errorf("SET %s w NX PX while read-locked = %v, %v; want nil (held)", key, v, err)
	}
	del := `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) end return 0`
	if v, err := c.Eval(ctx, del, []string{key}, reader).Result(); err != nil || v != int64(0) {
		t.Errorf("compare-and-delete of %s with the reader's token = %v, %v; want 0", key, v, err)
	}
	if n, err := c.Exists(ctx, key).Result(); err != nil || n != 1 {
		t.Errorf("EXISTS %s while read-locked = %d, %v; want 1", key, n, err)
	}
	if n, err := c.Do(ctx, "UNLOCK", key, reader).Result(); err != nil || n != int64(1) {
		t.Fatalf("UNLOCK %s %s = %v, %v; want 1", key, reader, n, err)
	}
	if v, err := c.Get(ctx, key).Result(); !errors.Is(err, redis.Nil) {
		t.Errorf("GET %s after the reader's UNLOCK = %q, %v; want nil", key, v, err)
	}
}
