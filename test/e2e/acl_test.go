package e2e

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// nodeACL is the least a node user needs, as the README recommends: keys
// and channels under the lock prefix only, no admin or dangerous command
// but INFO (restart detection) and CONFIG GET (the durability warning).
var nodeACL = []any{"ACL", "SETUSER", "lockproxy", "on", ">n0de-pw", "resetkeys", "~lockproxy:*",
	"resetchannels", "&lockproxy:*", "+@all", "-@dangerous", "+info", "+config|get"}

// TestNodeACL: with a node user limited to the lock prefix (nodeACL), every
// lock command, WAIT woken by a release, KEEPALIVE and transparent mode
// work, and no node logs a denied command, key or channel (ACL LOG).
func TestNodeACL(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	ctx := lockclient.CtxFor(t, 30*time.Second)
	for _, c := range cl.clients {
		if err := c.Do(ctx, nodeACL...).Err(); err != nil {
			t.Fatalf("ACL SETUSER: %v", err)
		}
	}
	in := startInstanceEnv(t, cl.addrs(), []string{
		"LOCKPROXY_REDLOCK_USERNAME=lockproxy", "LOCKPROXY_REDLOCK_PASSWORD=n0de-pw", "LOCKPROXY_LOCK_PATTERNS=lock:*",
	})
	c := lc.NewClient(t, in.addr, 3)
	w := lc.NewClient(t, in.addr, 2)

	g := lc.MustLock(t, c, "acl-a", "PX", 10000)
	if v, err := c.Do(ctx, "RENEW", "acl-a", g.Token, "PX", 20000).Int64(); err != nil || v <= 0 {
		t.Fatalf("RENEW = %d, %v", v, err)
	}
	if _, err := c.Do(ctx, "LOCKINFO", "acl-a").Result(); err != nil {
		t.Fatalf("LOCKINFO: %v", err)
	}
	waited := make(chan error, 1)
	go func() {
		_, ok, err := lockclient.TryLock(ctx, w, "acl-a", "PX", 5000, "WAIT", 10000)
		if err == nil && !ok {
			err = errors.New("not granted")
		}
		waited <- err
	}()
	// The waiter is queued (INFO's blocked_clients) before the release.
	for i := 0; ; i++ {
		info, err := c.Info(ctx, "clients").Result()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(info, "blocked_clients:1\r\n") {
			break
		}
		if i == 200 {
			t.Fatalf("the LOCK … WAIT never queued:\n%s", info)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := lc.Unlock(t, c, "acl-a", g.Token); got != 1 {
		t.Fatalf("UNLOCK = %d", got)
	}
	if err := <-waited; err != nil {
		t.Fatalf("LOCK … WAIT after the release: %v", err)
	}
	r := lc.MustLock(t, c, "acl-r", "PX", 5000)
	if _, err := c.Do(ctx, "RLOCK", "acl-r2", "PX", 5000).Result(); err != nil {
		t.Fatalf("RLOCK: %v", err)
	}
	lc.Unlock(t, c, "acl-r", r.Token)
	if _, err := c.Do(ctx, "LOCK", "acl-k", "KEEPALIVE").Result(); err != nil {
		t.Fatalf("LOCK KEEPALIVE: %v", err)
	}
	if err := c.SetArgs(ctx, "lock:acl", "tok", redis.SetArgs{Mode: "NX", TTL: 5 * time.Second}).Err(); err != nil {
		t.Fatalf("transparent SET NX PX: %v", err)
	}
	cad := "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
	if n, err := c.Eval(ctx, cad, []string{"lock:acl"}, "tok").Int(); err != nil || n != 1 {
		t.Fatalf("transparent compare-and-delete = %d, %v; want 1", n, err)
	}
	// A transparent-mode script runs on the nodes as lockproxy's user: one
	// that names lockproxy's own keys is refused.
	rogue := "return redis.call('del', 'lockproxy:lock:acl-k')"
	if err := c.Eval(ctx, rogue, []string{"lock:acl"}).Err(); err == nil || !strings.Contains(err.Error(), "names lockproxy's own keys") {
		t.Fatalf("a transparent script naming lockproxy's keys = %v; want it refused", err)
	}
	for i, nc := range cl.clients {
		entries, err := nc.Do(ctx, "ACL", "LOG").Slice()
		if err != nil || len(entries) != 0 {
			t.Errorf("node %d ACL LOG = %v, %v; want no denial", i, entries, err)
		}
	}
	if out := in.proc.Output(); strings.Contains(out, "NOPERM") {
		t.Errorf("lockproxy logged a denial:\n%s", out)
	}
}
