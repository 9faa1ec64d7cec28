package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/lockproxy/lockproxy/test/harness"
)

// keyPrefix is lockproxy's default key prefix on the nodes.
const keyPrefix = "lockproxy:"

// Defaults of lockproxy's lock settings that the tests check against.
const (
	driftFactor = 0.01
	driftMinMS  = 2
	maxTTLMS    = 10 * 60 * 1000
)

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

// ctxFor returns a context that ends after d or with the test.
func ctxFor(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// randID is a short random hex string for unique keys and tokens.
func randID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
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
	v, err := c.clients[i].Get(ctxFor(t, 5*time.Second), keyPrefix+"lock:"+key).Result()
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
func (c *cluster) lockOnAllNodes(t *testing.T, cl doer, key string, opts ...any) grant {
	t.Helper()
	for attempt := 1; ; attempt++ {
		g := mustLock(t, cl, key, opts...)
		missing := c.missingNodes(t, key, g.Token)
		if len(missing) == 0 {
			return g
		}
		if attempt == 5 {
			t.Fatalf("LOCK %q: %d grants in a row missed node(s) %v", key, attempt, missing)
		}
		t.Logf("LOCK %q: the grant did not reach node(s) %v; taking it again", key, missing)
		if got := unlock(t, cl, key, g.Token); got != 1 {
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

// newClient is a go-redis client of lockproxy speaking RESP proto (2 or 3),
// closed at cleanup. It never retries, and its read timeout leaves room for
// LOCK … WAIT.
func newClient(t *testing.T, addr string, proto int) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:            addr,
		Protocol:        proto,
		MaxRetries:      -1,
		DialTimeout:     2 * time.Second,
		ReadTimeout:     15 * time.Second,
		WriteTimeout:    5 * time.Second,
		PoolSize:        4,
		DisableIdentity: true,
		MaintNotificationsConfig: &maintnotifications.Config{
			Mode: maintnotifications.ModeDisabled,
		},
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// doer is what *redis.Client and *redis.Conn have in common for us.
type doer interface {
	Do(ctx context.Context, args ...any) *redis.Cmd
}

// grant is a parsed LOCK reply.
type grant struct {
	Token      string
	ValidityMS int64
	Fence      int64
}

// parseGrant reads a LOCK reply as go-redis returns it: a flat array under
// RESP2, a map under RESP3.
func parseGrant(v any) (grant, error) {
	fields := map[string]any{}
	switch r := v.(type) {
	case []any:
		if len(r)%2 != 0 {
			return grant{}, fmt.Errorf("odd-length array reply %v", r)
		}
		for i := 0; i < len(r); i += 2 {
			k, ok := r[i].(string)
			if !ok {
				return grant{}, fmt.Errorf("array reply key %v is %T, not a string", r[i], r[i])
			}
			fields[k] = r[i+1]
		}
	case map[any]any:
		for k, val := range r {
			ks, ok := k.(string)
			if !ok {
				return grant{}, fmt.Errorf("map reply key %v is %T, not a string", k, k)
			}
			fields[ks] = val
		}
	default:
		return grant{}, fmt.Errorf("reply %v is %T, want an array or a map", v, v)
	}
	if len(fields) != 3 {
		return grant{}, fmt.Errorf("reply %v has %d fields, want token, validity_ms, fence", v, len(fields))
	}
	var g grant
	var ok bool
	if g.Token, ok = fields["token"].(string); !ok {
		return grant{}, fmt.Errorf("token = %#v, want a string", fields["token"])
	}
	if g.ValidityMS, ok = fields["validity_ms"].(int64); !ok {
		return grant{}, fmt.Errorf("validity_ms = %#v, want an integer", fields["validity_ms"])
	}
	if g.Fence, ok = fields["fence"].(int64); !ok {
		return grant{}, fmt.Errorf("fence = %#v, want an integer", fields["fence"])
	}
	return g, nil
}

// tryLock sends LOCK key opts... It returns the grant and true, or false
// for a nil reply, or the error reply.
func tryLock(ctx context.Context, c doer, key string, opts ...any) (grant, bool, error) {
	args := append([]any{"LOCK", key}, opts...)
	v, err := c.Do(ctx, args...).Result()
	if errors.Is(err, redis.Nil) {
		return grant{}, false, nil
	}
	if err != nil {
		return grant{}, false, err
	}
	g, err := parseGrant(v)
	if err != nil {
		return grant{}, false, fmt.Errorf("LOCK %q %v: %w", key, opts, err)
	}
	return g, true, nil
}

// lock sends LOCK key opts... and fails the test on an error reply.
func lock(t *testing.T, c doer, key string, opts ...any) (grant, bool) {
	t.Helper()
	g, ok, err := tryLock(ctxFor(t, 20*time.Second), c, key, opts...)
	if err != nil {
		t.Fatalf("LOCK %q %v: %v", key, opts, err)
	}
	return g, ok
}

// mustLock is lock that also fails the test when the lock is not granted.
func mustLock(t *testing.T, c doer, key string, opts ...any) grant {
	t.Helper()
	g, ok := lock(t, c, key, opts...)
	if !ok {
		t.Fatalf("LOCK %q %v = nil; want a grant", key, opts)
	}
	return g
}

// intCmd sends a command answered with an integer and fails on anything
// else.
func intCmd(t *testing.T, c doer, args ...any) int64 {
	t.Helper()
	n, err := c.Do(ctxFor(t, 10*time.Second), args...).Int64()
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return n
}

func unlock(t *testing.T, c doer, key, token string) int64 {
	t.Helper()
	return intCmd(t, c, "UNLOCK", key, token)
}

// ---------------------------------------------------------------------------
// Raw RESP connections

// reply is one RESP2/RESP3 reply read off a raw connection.
type reply struct {
	Kind  byte   // '+', '-', ':', '$', '*', '%', '~', '>', '_', '#', ',', '=', '('
	Str   string // simple, error, bulk, verbatim, double and big number text
	Int   int64
	Null  bool    // $-1, *-1 or _
	Elems []reply // array, set and push elements; map keys and values alternate
}

func (r reply) String() string {
	switch {
	case r.Null:
		return "(nil)"
	case r.Kind == ':':
		return fmt.Sprintf(":%d", r.Int)
	case r.Kind == '*' || r.Kind == '%' || r.Kind == '~' || r.Kind == '>':
		parts := make([]string, len(r.Elems))
		for i, e := range r.Elems {
			parts[i] = e.String()
		}
		return string(r.Kind) + "[" + strings.Join(parts, " ") + "]"
	default:
		return string(r.Kind) + strconv.Quote(r.Str)
	}
}

// rawConn is a plain TCP connection speaking RESP by hand.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

// write sends raw bytes.
func (rc *rawConn) write(p string) {
	rc.t.Helper()
	_ = rc.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(rc.c, p); err != nil {
		rc.t.Fatalf("write %q: %v", p, err)
	}
}

// encode is args as a RESP array of bulk strings.
func encode(args ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	return b.String()
}

// read reads one reply, waiting at most 10 s.
func (rc *rawConn) read() (reply, error) {
	_ = rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	return readReply(rc.br, 0)
}

// do sends args and reads the reply, failing the test on I/O errors.
func (rc *rawConn) do(args ...string) reply {
	rc.t.Helper()
	rc.write(encode(args...))
	r, err := rc.read()
	if err != nil {
		rc.t.Fatalf("%q: reading the reply: %v", args, err)
	}
	return r
}

// readReply parses one RESP2 or RESP3 reply.
func readReply(br *bufio.Reader, depth int) (reply, error) {
	if depth > 32 {
		return reply{}, errors.New("reply nested too deeply")
	}
	line, err := br.ReadString('\n')
	if err != nil {
		return reply{}, err
	}
	if len(line) < 3 || !strings.HasSuffix(line, "\r\n") {
		return reply{}, fmt.Errorf("malformed reply line %q", line)
	}
	kind, body := line[0], line[1:len(line)-2]
	r := reply{Kind: kind}
	switch kind {
	case '+', '-', ',', '(':
		r.Str = body
	case '_':
		r.Null = true
	case '#':
		r.Str = body
		r.Int = map[string]int64{"t": 1}[body]
	case ':':
		if r.Int, err = strconv.ParseInt(body, 10, 64); err != nil {
			return reply{}, fmt.Errorf("bad integer reply %q", line)
		}
	case '$', '=':
		n, err := strconv.Atoi(body)
		if err != nil {
			return reply{}, fmt.Errorf("bad bulk length %q", line)
		}
		if n < 0 {
			r.Null = true
			return r, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(br, buf); err != nil {
			return reply{}, err
		}
		if string(buf[n:]) != "\r\n" {
			return reply{}, fmt.Errorf("bulk of %d bytes not followed by CRLF", n)
		}
		r.Str = string(buf[:n])
	case '*', '%', '~', '>':
		n, err := strconv.Atoi(body)
		if err != nil {
			return reply{}, fmt.Errorf("bad aggregate length %q", line)
		}
		if n < 0 {
			r.Null = true
			return r, nil
		}
		if kind == '%' {
			n *= 2
		}
		for i := 0; i < n; i++ {
			e, err := readReply(br, depth+1)
			if err != nil {
				return reply{}, err
			}
			r.Elems = append(r.Elems, e)
		}
	default:
		return reply{}, fmt.Errorf("unknown reply type %q", line)
	}
	return r, nil
}

// pairs returns the key/value pairs of a map reply (RESP3 %) or of a flat
// RESP2 array, by key.
func (r reply) pairs() map[string]reply {
	m := map[string]reply{}
	for i := 0; i+1 < len(r.Elems); i += 2 {
		m[r.Elems[i].Str] = r.Elems[i+1]
	}
	return m
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
