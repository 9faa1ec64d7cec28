package zk

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	gozk "github.com/go-zookeeper/zk"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// ensemble is the three-server ZooKeeper ensemble every test here shares
// (JVM starts are slow on a loaded machine). A test that kills a server
// restarts it before it ends. Its servers reach one another through
// peerLinks, which a test that cuts a server off heals before it ends.
var (
	ensemble  []*harness.ZooKeeper
	peerLinks *harness.PeerLinks
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "lockproxy-zk-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ensemble, peerLinks, err = harness.LaunchZooKeeperEnsembleLinked(dir, 3)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	for _, z := range ensemble {
		z.Kill()
	}
	peerLinks.Close()
	os.RemoveAll(dir)
	os.Exit(code)
}

// Lock settings the tests check against (lockproxy's defaults, and the
// session timeout the instances here ask for).
const (
	driftFactor = 0.01
	driftMinMS  = 2
	sessionMS   = 10000
)

// maxValidityMS is the largest validity_ms lockproxy may answer for ttlMS
// on ZooKeeper: the lease capped by the session's horizon (2/3 of the
// session timeout less half the servers' tick, which the instances here
// are told: zookeeper.tick_time), less drift on that.
func maxValidityMS(ttlMS int64) int64 {
	d := min(ttlMS, sessionMS*2/3-harness.ZKTick.Milliseconds()/2)
	return d - int64(float64(d)*driftFactor) - driftMinMS
}

// lc is the lock-client helpers with this package's waits, three times
// and more test/e2e's: a ZooKeeper grant on a loaded machine can take many
// seconds (session setup, sequential nodes, watches). A LOCK or RLOCK
// reply 60 s, other commands 30 s, a raw reply 60 s; its go-redis clients
// read for 90 s.
var lc = lockclient.Config{
	AcquireTimeout: 60 * time.Second, CommandTimeout: 30 * time.Second,
	DialTimeout: 5 * time.Second, ReplyTimeout: 60 * time.Second,
	ClientRead: 90 * time.Second, ClientWrite: 5 * time.Second, PoolSize: 4,
}

// instance is one running lockproxy on the ZooKeeper backend.
type instance struct {
	addr  string
	admin string
	root  string
	proc  *harness.Proc
	// servers and env are what it was started with, for start.
	servers, env []string
}

// startInstance starts lockproxy with --backend zookeeper in front of
// servers, with its locks under root, and waits until it listens. env adds
// LOCKPROXY_* settings.
func startInstance(t *testing.T, servers []string, root string, env ...string) *instance {
	t.Helper()
	in := &instance{
		addr:    fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t)),
		admin:   fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t)),
		root:    root,
		servers: servers,
		env:     env,
	}
	in.start(t)
	return in
}

// start starts a lockproxy process of in, on its addresses (again, after
// its process was killed), and waits until it listens.
func (in *instance) start(t *testing.T) {
	t.Helper()
	bin := harness.BuildLockproxy(t)
	cmd := exec.Command(bin, "--listen", in.addr, "--admin", in.admin,
		"--backend", "zookeeper", "--zk", strings.Join(in.servers, ","))
	cmd.Env = append(os.Environ(), "LOCKPROXY_ZOOKEEPER_ROOT="+in.root,
		fmt.Sprintf("LOCKPROXY_ZOOKEEPER_SESSION_TIMEOUT=%dms", sessionMS),
		fmt.Sprintf("LOCKPROXY_ZOOKEEPER_TICK_TIME=%dms", harness.ZKTick.Milliseconds()))
	cmd.Env = append(cmd.Env, in.env...)
	in.proc = harness.StartCmd(t, cmd)
	if err := harness.WaitTCP(in.addr, 60*time.Second); err != nil {
		t.Fatalf("lockproxy did not listen on %s: %v\noutput:\n%s", in.addr, err, in.proc.Output())
	}
}

// zkServers is the shared ensemble's addresses.
func zkServers() []string { return harness.ZKAddrs(ensemble) }

// newRoot is a ZooKeeper root of its own for t.
func newRoot(t *testing.T) string {
	return "/e2e-" + strings.ReplaceAll(t.Name(), "/", "-") + "-" + lockclient.RandID()
}

// zkConn is a direct ZooKeeper client, to look at lockproxy's nodes.
func zkConn(t *testing.T) *gozk.Conn {
	t.Helper()
	c, _, err := gozk.Connect(zkServers(), 10*time.Second, gozk.WithLogInfo(false), gozk.WithLogger(quietLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}

// lockNodes counts the lock nodes of key under root (0 when none).
func lockNodes(t *testing.T, c *gozk.Conn, root, key string) int {
	t.Helper()
	kids, _, err := c.Children(root + "/k" + base64URL(key))
	if errors.Is(err, gozk.ErrNoNode) {
		return 0
	}
	if err != nil {
		t.Fatalf("children: %v", err)
	}
	return len(kids)
}
