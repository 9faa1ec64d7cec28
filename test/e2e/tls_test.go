package e2e

import (
	"crypto/tls"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

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

	// One cycle first: the writers' TLS connections are made as lockproxy
	// starts, and on a loaded host one may not be up within the first
	// LOCK's node timeout (a majority grants it all the same).
	lc.MustLock(t, c, "tls-warm-"+lockclient.RandID(), "PX", 10000)
	key := "tls-" + lockclient.RandID()
	g := lc.MustLock(t, c, key, "PX", 10000)
	// LOCK answers once a majority granted; the third node's grant may
	// land just after.
	held := 0
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		held = 0
		for _, nd := range nodes {
			v, err := nd.Client(t).Get(ctx, "lockproxy:lock:"+key).Result()
			if err == nil && v == g.Token {
				held++
			}
		}
		if held == 3 || time.Now().After(deadline) {
			break
		}
	}
	if held != 3 {
		t.Fatalf("the lock's key holds the token on %d of 3 nodes 5 s after LOCK; want 3", held)
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

// TestServerTLS: with tls on the listener, clients speak TLS to lockproxy
// (go-redis under RESP2 and RESP3, redis-cli --tls), a plain-text client
// gets nothing, and with client_ca_file a client must show a certificate
// that CA signed.
func TestServerTLS(t *testing.T) {
	t.Parallel()
	harness.RequireBinary(t, "redis-cli", "redis-tools")
	cl := startCluster(t, 3)
	ca := harness.NewTestCA(t)
	srv := ca.Server()
	env := []string{"LOCKPROXY_TLS_ENABLED=true", "LOCKPROXY_TLS_CERT_FILE=" + srv.Cert, "LOCKPROXY_TLS_KEY_FILE=" + srv.Key}
	in := startInstanceEnv(t, cl.addrs(), env)
	mtls := startInstanceEnv(t, cl.addrs(), append(env, "LOCKPROXY_TLS_CLIENT_CA_FILE="+ca.CAFile))

	for _, tc := range []struct {
		name  string
		addr  string
		cfg   *tls.Config
		works bool
	}{
		{"TLS", in.addr, ca.ClientConfig(), true},
		{"TLS without a client certificate", in.addr, &tls.Config{RootCAs: ca.ClientConfig().RootCAs}, true},
		{"mutual TLS", mtls.addr, ca.ClientConfig(), true},
		{"mutual TLS without a client certificate", mtls.addr, &tls.Config{RootCAs: ca.ClientConfig().RootCAs}, false},
		{"mutual TLS with another CA's certificate", mtls.addr, func() *tls.Config {
			c := harness.NewTestCA(t).ClientConfig()
			c.RootCAs = ca.ClientConfig().RootCAs
			return c
		}(), false},
	} {
		for _, proto := range []int{2, 3} {
			t.Run(fmt.Sprintf("%s/RESP%d", tc.name, proto), func(t *testing.T) {
				c := redis.NewClient(&redis.Options{
					Addr: tc.addr, Protocol: proto, TLSConfig: tc.cfg, MaxRetries: -1, DisableIdentity: true,
					DialTimeout:              5 * time.Second,
					MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
				})
				defer c.Close()
				g, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 10*time.Second), c, "stls-"+lockclient.RandID(), "PX", 5000)
				if tc.works && (err != nil || !ok || g.Fence == 0) {
					t.Fatalf("LOCK = %+v, %v, %v; want a grant", g, ok, err)
				}
				if !tc.works && err == nil {
					t.Fatalf("LOCK = %+v, %v; want the connection refused", g, ok)
				}
			})
		}
	}

	out, err := exec.Command("redis-cli", "--tls", "--cacert", ca.CAFile, "-h", "127.0.0.1", "-p", portOf(t, in.addr), "PING").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "PONG" {
		t.Fatalf("redis-cli --tls PING = %q, %v; want PONG", out, err)
	}
	rc := lc.DialRaw(t, in.addr)
	rc.Write("PING\r\n")
	if r, err := rc.ReadWithin(3 * time.Second); err == nil {
		t.Fatalf("a plain-text PING on the TLS listener got %v; want nothing", r)
	}
	if n := metricValue(t, in, "lockproxy_tls_handshake_failures_total"); n == "" || n == "0" {
		t.Fatalf("lockproxy_tls_handshake_failures_total = %q after a plain-text client; want at least 1", n)
	}
}

func portOf(t *testing.T, addr string) string {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestServerTLSReload: on SIGHUP lockproxy reads its listener's
// certificate again, and new connections get the renewed one, while a
// connection made before goes on.
func TestServerTLSReload(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	ca := harness.NewTestCA(t)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	ca.Server().Install(t, cert, key)
	in := startInstanceEnv(t, cl.addrs(), []string{"LOCKPROXY_TLS_ENABLED=true", "LOCKPROXY_TLS_CERT_FILE=" + cert, "LOCKPROXY_TLS_KEY_FILE=" + key})
	serial := func() string {
		c, err := tls.Dial("tcp", in.addr, ca.ClientConfig())
		if err != nil {
			t.Fatalf("TLS dial: %v", err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	first := serial()
	exp, err := strconv.ParseFloat(metricValue(t, in, `lockproxy_tls_certificate_expiry_timestamp_seconds{cert_file="`+cert+`"}`), 64)
	if now := float64(time.Now().Unix()); err != nil || exp < now || exp > now+25*3600 {
		t.Fatalf("lockproxy_tls_certificate_expiry_timestamp_seconds = %v, %v; want the certificate's expiry, within a day", exp, err)
	}
	old := redis.NewClient(&redis.Options{Addr: in.addr, TLSConfig: ca.ClientConfig(), Protocol: 2, MaxRetries: -1, DisableIdentity: true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	defer old.Close()
	ctx := lockclient.CtxFor(t, 20*time.Second)
	if err := old.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	ca.Server().Install(t, cert, key)
	if err := syscall.Kill(in.proc.PID(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	for i := 0; serial() == first; i++ {
		if i == 100 {
			t.Fatalf("still the first certificate 5 s after SIGHUP:\n%s", in.proc.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := old.Ping(ctx).Err(); err != nil {
		t.Fatalf("the connection made before the reload: %v", err)
	}
}
