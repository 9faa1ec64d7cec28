package e2e

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// keyPrefix is lockproxy's default key prefix on the nodes.
const keyPrefix = "lockproxy:"

// Defaults of lockproxy's lock settings that the tests check against.
const (
	driftFactor = 0.01
	driftMinMS  = 2
	maxTTLMS    = 10 * 60 * 1000
)

// lc is the lock-client helpers with this package's waits: a LOCK or
// RLOCK reply 20 s, other commands 10 s, a raw reply 10 s. Its go-redis
// clients read for 15 s, which leaves room for LOCK … WAIT.
var lc = lockclient.Config{
	AcquireTimeout: 20 * time.Second, CommandTimeout: 10 * time.Second,
	DialTimeout: 2 * time.Second, ReplyTimeout: 10 * time.Second,
	ClientRead: 15 * time.Second, ClientWrite: 5 * time.Second, PoolSize: 4,
}

// sizes are the node counts every test runs with.
var sizes = []int{3, 5}

// eachSize runs f as a parallel subtest per node count.
func eachSize(t *testing.T, f func(t *testing.T, n int)) {
	t.Helper()
	for _, n := range sizes {
		t.Run(fmt.Sprintf("%dnodes", n), func(t *testing.T) {
			t.Parallel()
			f(t, n)
		})
	}
}

// maxValidityMS is the largest validity_ms lockproxy may answer for ttlMS.
func maxValidityMS(ttlMS int64) int64 {
	return ttlMS - int64(float64(ttlMS)*driftFactor) - driftMinMS
}

// ---------------------------------------------------------------------------
// Nodes

// cluster is a set of real redis-server nodes with a direct client to each.
type cluster struct {
	nodes   []*harness.Redis
	clients []*redis.Client
}

// startCluster starts n redis-server nodes.
func startCluster(t *testing.T, n int) *cluster {
	t.Helper()
	c := &cluster{nodes: harness.StartRedisN(t, n, harness.RedisOptions{})}
	for _, nd := range c.nodes {
		c.clients = append(c.clients, nd.Client(t))
	}
	return c
}

func (c *cluster) addrs() []string { return harness.Addrs(c.nodes) }

// lockValue reads the lock key of key on node i directly: its value and
// whether it exists.
func (c *cluster) lockValue(t *testing.T, i int, key string) (string, bool) {
	t.Helper()
	v, err := c.clients[i].Get(lockclient.CtxFor(t, 5*time.Second), keyPrefix+"lock:"+key).Result()
	if errors.Is(err, redis.Nil) {
		return "", false
	}
	if err != nil {
		t.Fatalf("node %d (%s): GET %s: %v", i, c.nodes[i].Addr, keyPrefix+"lock:"+key, err)
	}
	return v, true
}

// missingNodes polls (up to about 1 s) until every node holds key with
// token, and returns the nodes that still do not.
func (c *cluster) missingNodes(t *testing.T, key, token string) []int {
	t.Helper()
	var missing []int
	for try := 0; try < 20; try++ {
		missing = missing[:0]
		for i := range c.nodes {
			if v, ok := c.lockValue(t, i, key); !ok || v != token {
				missing = append(missing, i)
			}
		}
		if len(missing) == 0 {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return missing
}

// lockOnAllNodes LOCKs key and returns once the grant is on every node.
// lockproxy answers LOCK as soon as a majority granted, and RedLock lets a
// minority miss a grant; for the tests that check every node, such a grant
// is released (after the node timeout has passed, so no late write remains)
// and taken again, a few times at most.
func (c *cluster) lockOnAllNodes(t *testing.T, cl lockclient.Doer, key string, opts ...any) lockclient.Grant {
	t.Helper()
	for attempt := 1; ; attempt++ {
		g := lc.MustLock(t, cl, key, opts...)
		missing := c.missingNodes(t, key, g.Token)
		if len(missing) == 0 {
			return g
		}
		if attempt == 5 {
			t.Fatalf("LOCK %q: %d grants in a row missed node(s) %v", key, attempt, missing)
		}
		t.Logf("LOCK %q: the grant did not reach node(s) %v; taking it again", key, missing)
		if got := lc.Unlock(t, cl, key, g.Token); got != 1 {
			t.Fatalf("UNLOCK %q = %d; want 1", key, got)
		}
	}
}

// ---------------------------------------------------------------------------
// lockproxy

// instance is one running lockproxy.
type instance struct {
	addr  string // RESP listener
	admin string // HTTP admin listener
	proc  *harness.Proc
}

// startInstance starts the lockproxy binary in front of nodes on free ports
// and waits until it accepts connections.
func startInstance(t *testing.T, nodes []string, extraArgs ...string) *instance {
	t.Helper()
	bin := harness.BuildLockproxy(t)
	in := &instance{
		addr:  fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t)),
		admin: fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t)),
	}
	args := append([]string{
		"--listen", in.addr,
		"--admin", in.admin,
		"--nodes", strings.Join(nodes, ","),
	}, extraArgs...)
	in.proc = harness.StartProc(t, bin, args...)
	if err := harness.WaitTCP(in.addr, 15*time.Second); err != nil {
		t.Fatalf("lockproxy %v did not listen on %s: %v\noutput:\n%s", args, in.addr, err, in.proc.Output())
	}
	if err := harness.WaitTCP(in.admin, 5*time.Second); err != nil {
		t.Fatalf("lockproxy %v did not listen on admin %s: %v\noutput:\n%s", args, in.admin, err, in.proc.Output())
	}
	return in
}

// startProxy starts lockproxy in front of nodes and returns its RESP address.
func startProxy(t *testing.T, nodes []string, extraArgs ...string) (addr string, proc *harness.Proc) {
	t.Helper()
	in := startInstance(t, nodes, extraArgs...)
	return in.addr, in.proc
}

// ---------------------------------------------------------------------------
// HTTP admin

// httpGet fetches url and returns the status code and body.
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		t.Fatalf("GET %s: reading the body: %v", url, err)
	}
	return resp.StatusCode, string(body)
}

// eventually retries f every interval until it returns nil, at most
// attempts times, and returns the last error.
func eventually(attempts int, interval time.Duration, f func() error) error {
	var err error
	for i := 0; i < attempts; i++ {
		if err = f(); err == nil {
			return nil
		}
		time.Sleep(interval)
	}
	return err
}
