package e2e

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestTLS: with redlock.tls and upstream.tls, lockproxy speaks TLS to
// lock nodes and an upstream that accept nothing else, verifying their
// certificates against ca_file; the upstream also requires a client
// certificate (Redis's tls-auth-clients yes), which cert_file and key_file
// give. Locks are granted with their keys on the nodes, and relayed
// commands, plain and pipelined (the event loop's path), answer as
// Redis does. A lockproxy that trusts another CA is refused by every
// node and the upstream, and says so.
func TestTLS(t *testing.T) {
	t.Parallel()
	ca := harness.NewTestCA(t)
	nodes := harness.StartRedisN(t, 3, harness.RedisOptions{TLS: ca})
	up := harness.StartRedis(t, harness.RedisOptions{TLS: ca, Args: []string{"--tls-auth-clients", "yes"}})
	client := ca.Client()
	env := func(caFile string) []string {
		return []string{
			"LOCKPROXY_REDLOCK_TLS_ENABLED=true", "LOCKPROXY_REDLOCK_TLS_CA_FILE=" + caFile,
			"LOCKPROXY_UPSTREAM_ADDRESS=" + up.Addr, "LOCKPROXY_UPSTREAM_TLS_ENABLED=true",
			"LOCKPROXY_UPSTREAM_TLS_CA_FILE=" + caFile,
			"LOCKPROXY_UPSTREAM_TLS_CERT_FILE=" + client.Cert, "LOCKPROXY_UPSTREAM_TLS_KEY_FILE=" + client.Key,
		}
	}
	in := startInstanceEnv(t, harness.Addrs(nodes), env(ca.CAFile))
	c := lc.NewClient(t, in.addr, 2)
	ctx := lockclient.CtxFor(t, 20*time.Second)

	key := "tls-" + lockclient.RandID()
	g := lc.MustLock(t, c, key, "PX", 10000)
	held := 0
	for _, nd := range nodes {
		v, err := nd.Client(t).Get(ctx, "lockproxy:lock:"+key).Result()
		if err == nil && v == g.Token {
			held++
		}
	}
	if held != 3 {
		t.Fatalf("the lock's key holds the token on %d of 3 nodes; want 3", held)
	}
	if got := lc.Unlock(t, c, key, g.Token); got != 1 {
		t.Fatalf("UNLOCK = %d; want 1", got)
	}

	if err := c.Set(ctx, "tls:k", "v", 0).Err(); err != nil {
		t.Fatalf("SET through lockproxy: %v", err)
	}
	if v, err := up.Client(t).Get(ctx, "tls:k").Result(); err != nil || v != "v" {
		t.Fatalf("GET on the upstream = %q, %v; want v", v, err)
	}
	p := c.Pipeline()
	for i := 0; i < 200; i++ {
		p.Set(ctx, "tls:p"+strconv.Itoa(i), i, 0)
		p.Incr(ctx, "tls:n")
	}
	if _, err := p.Exec(ctx); err != nil {
		t.Fatalf("pipeline through lockproxy: %v", err)
	}
	if n, err := c.Get(ctx, "tls:n").Int(); err != nil || n != 200 {
		t.Fatalf("GET tls:n = %d, %v; want 200", n, err)
	}

	other := harness.NewTestCA(t)
	bad := startInstanceEnv(t, harness.Addrs(nodes), env(other.CAFile))
	rc := lc.DialRaw(t, bad.addr)
	if r := rc.Do("LOCK", key, "PX", "5000"); r.Kind != '-' || !strings.HasPrefix(r.Str, "NOQUORUM") || !strings.Contains(r.Str, "certificate") {
		t.Fatalf("LOCK trusting another CA = %v; want NOQUORUM naming the certificate", r)
	}
	if r := rc.Do("GET", "tls:k"); r.Kind != '-' || !strings.Contains(r.Str, "upstream unavailable") || !strings.Contains(r.Str, "certificate") {
		t.Fatalf("GET trusting another CA = %v; want upstream unavailable naming the certificate", r)
	}
}
