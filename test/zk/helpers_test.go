package zk

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	gozk "github.com/go-zookeeper/zk"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/lockproxy/lockproxy/test/harness"
)

// ensemble is the three-server ZooKeeper ensemble every test here shares
// (JVM starts are slow on a loaded machine). A test that kills a server
// restarts it before it ends.
var ensemble []*harness.ZooKeeper

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "lockproxy-zk-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ensemble, err = harness.LaunchZooKeeperEnsemble(dir, 3)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	for _, z := range ensemble {
		z.Kill()
	}
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
// on ZooKeeper: the lease capped by the session timeout, less drift.
func maxValidityMS(ttlMS int64) int64 {
	return min(ttlMS, sessionMS) - int64(float64(ttlMS)*driftFactor) - driftMinMS
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func randID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// instance is one running lockproxy on the ZooKeeper backend.
type instance struct {
	addr  string
	admin string
	root  string
	proc  *harness.Proc
}

// startInstance starts lockproxy with --backend zookeeper in front of
// servers, with its locks under root, and waits until it listens. env adds
// LOCKPROXY_* settings.
func startInstance(t *testing.T, servers []string, root string, env ...string) *instance {
	t.Helper()
	bin := harness.BuildLockproxy(t)
	in := &instance{
		addr:  fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t)),
		admin: fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t)),
		root:  root,
	}
	cmd := exec.Command(bin, "--listen", in.addr, "--admin", in.admin,
		"--backend", "zookeeper", "--zk", strings.Join(servers, ","))
	cmd.Env = append(os.Environ(), "LOCKPROXY_ZOOKEEPER_ROOT="+root,
		fmt.Sprintf("LOCKPROXY_ZOOKEEPER_SESSION_TIMEOUT=%dms", sessionMS))
	cmd.Env = append(cmd.Env, env...)
	in.proc = harness.StartCmd(t, cmd)
	if err := harness.WaitTCP(in.addr, 60*time.Second); err != nil {
		t.Fatalf("lockproxy did not listen on %s: %v\noutput:\n%s", in.addr, err, in.proc.Output())
	}
	return in
}

// zkServers is the shared ensemble's addresses.
func zkServers() []string { return harness.ZKAddrs(ensemble) }

// newRoot is a ZooKeeper root of its own for t.
func newRoot(t *testing.T) string {
	return "/e2e-" + strings.ReplaceAll(t.Name(), "/", "-") + "-" + randID()
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

func newClient(t *testing.T, addr string, proto int) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr: addr, Protocol: proto, MaxRetries: -1, DialTimeout: 5 * time.Second,
		ReadTimeout: 90 * time.Second, WriteTimeout: 5 * time.Second, PoolSize: 4, DisableIdentity: true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

type doer interface {
	Do(ctx context.Context, args ...any) *redis.Cmd
}

// grant is a parsed LOCK reply.
type grant struct {
	Token      string
	ValidityMS int64
	Fence      int64
}

// parseGrant reads a LOCK reply: a flat array under RESP2, a map under
// RESP3, with exactly token, validity_ms and fence.
func parseGrant(v any) (grant, error) {
	fields := map[string]any{}
	switch r := v.(type) {
	case []any:
		if len(r)%2 != 0 {
			return grant{}, fmt.Errorf("odd-length array reply %v", r)
		}
		for i := 0; i < len(r); i += 2 {
			k, _ := r[i].(string)
			fields[k] = r[i+1]
		}
	case map[any]any:
		for k, val := range r {
			ks, _ := k.(string)
			fields[ks] = val
		}
	default:
		return grant{}, fmt.Errorf("reply %v is %T, want an array or a map", v, v)
	}
	var g grant
	var ok1, ok2, ok3 bool
	g.Token, ok1 = fields["token"].(string)
	g.ValidityMS, ok2 = fields["validity_ms"].(int64)
	g.Fence, ok3 = fields["fence"].(int64)
	if len(fields) != 3 || !ok1 || !ok2 || !ok3 {
		return grant{}, fmt.Errorf("reply %v: want token (string), validity_ms and fence (integers)", v)
	}
	return g, nil
}

func tryLock(ctx context.Context, c doer, key string, opts ...any) (grant, bool, error) {
	v, err := c.Do(ctx, append([]any{"LOCK", key}, opts...)...).Result()
	if errors.Is(err, redis.Nil) {
		return grant{}, false, nil
	}
	if err != nil {
		return grant{}, false, err
	}
	g, err := parseGrant(v)
	return g, err == nil, err
}

func lock(t *testing.T, c doer, key string, opts ...any) (grant, bool) {
	t.Helper()
	g, ok, err := tryLock(ctxFor(t, 60*time.Second), c, key, opts...)
	if err != nil {
		t.Fatalf("LOCK %q %v: %v", key, opts, err)
	}
	return g, ok
}

func mustLock(t *testing.T, c doer, key string, opts ...any) grant {
	t.Helper()
	g, ok := lock(t, c, key, opts...)
	if !ok {
		t.Fatalf("LOCK %q %v = nil; want a grant", key, opts)
	}
	return g
}

func intCmd(t *testing.T, c doer, args ...any) int64 {
	t.Helper()
	n, err := c.Do(ctxFor(t, 30*time.Second), args...).Int64()
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return n
}

// ---------------------------------------------------------------------------
// A raw RESP connection, for RESP3 pushes.

type reply struct {
	Kind  byte
	Str   string
	Int   int64
	Null  bool
	Elems []reply
}

func (r reply) String() string {
	switch r.Kind {
	case '>', '*', '%':
		parts := make([]string, len(r.Elems))
		for i, e := range r.Elems {
			parts[i] = e.String()
		}
		return string(r.Kind) + "[" + strings.Join(parts, " ") + "]"
	case ':':
		return strconv.FormatInt(r.Int, 10)
	case '-':
		return "-" + r.Str
	}
	if r.Null {
		return "nil"
	}
	return strconv.Quote(r.Str)
}

// pairs reads a map (or flat array) reply as key → value.
func (r reply) pairs() map[string]reply {
	m := map[string]reply{}
	for i := 0; i+1 < len(r.Elems); i += 2 {
		m[r.Elems[i].Str] = r.Elems[i+1]
	}
	return m
}

type rawConn struct {
	c  net.Conn
	br *bufio.Reader
	t  *testing.T
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{c: c, br: bufio.NewReader(c), t: t}
}

func (rc *rawConn) send(args ...string) {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	_ = rc.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(rc.c, b.String()); err != nil {
		rc.t.Fatal(err)
	}
}

// readWithin reads one reply, waiting up to d.
func (rc *rawConn) readWithin(d time.Duration) (reply, error) {
	_ = rc.c.SetReadDeadline(time.Now().Add(d))
	return readReply(rc.br)
}

func (rc *rawConn) do(args ...string) reply {
	rc.t.Helper()
	rc.send(args...)
	r, err := rc.readWithin(60 * time.Second)
	if err != nil {
		rc.t.Fatalf("%q: %v", args, err)
	}
	return r
}

func readReply(br *bufio.Reader) (reply, error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return reply{}, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return reply{}, errors.New("empty line")
	}
	r := reply{Kind: line[0]}
	body := line[1:]
	switch r.Kind {
	case '+', '-':
		r.Str = body
	case ':':
		r.Int, err = strconv.ParseInt(body, 10, 64)
	case '_':
		r.Null = true
	case '$':
		n, _ := strconv.Atoi(body)
		if n < 0 {
			r.Null = true
			break
		}
		buf := make([]byte, n+2)
		if _, err = io.ReadFull(br, buf); err == nil {
			r.Str = string(buf[:n])
		}
	case '*', '>', '%':
		n, _ := strconv.Atoi(body)
		if n < 0 {
			r.Null = true
			break
		}
		if r.Kind == '%' {
			n *= 2
		}
		for range n {
			e, err := readReply(br)
			if err != nil {
				return reply{}, err
			}
			r.Elems = append(r.Elems, e)
		}
	default:
		err = fmt.Errorf("unexpected reply type %q", line)
	}
	return r, err
}
