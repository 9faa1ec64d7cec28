package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/test/harness"
)

func TestSlot(t *testing.T) {
	// Redis Cluster's documented key slots.
	for _, tc := range []struct {
		key  string
		want uint16
	}{
		{"foo", 12182},
		{"bar", 5061},
		{"hello", 866},
		{"123456789", 0x31C3 & 16383},
		{"", 0},
	} {
		if got := slot(tc.key); got != tc.want {
			t.Errorf("slot(%q) = %d; want %d", tc.key, got, tc.want)
		}
	}
}

// nodeOnRedis starts a redis-server for the test and a Node on it.
func nodeOnRedis(t *testing.T) (*Node, *harness.Redis) {
	t.Helper()
	harness.RequireBinary(t, "redis-server", "redis-server")
	r := harness.StartRedis(t, harness.RedisOptions{})
	return newTestNode(t, r), r
}

func newTestNode(t *testing.T, r *harness.Redis) *Node {
	t.Helper()
	n := NewNode(NodeConfig{Addr: r.Addr, KeyPrefix: "lp:", Timeout: time.Second, Metrics: NewMetrics(nil)})
	t.Cleanup(func() { n.Close() })
	return n
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestNodeOperations runs each operation against a real redis-server and
// checks the node's state directly.
func TestNodeOperations(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 10*time.Second)
	req := quorum.Request{Key: "k", Token: "t1", TTL: 5 * time.Second}

	g, err := n.Acquire(ctx, req)
	if err != nil || !g.Acquired || g.Fence == 0 {
		t.Fatalf("Acquire = %+v, %v; want acquired with a fence", g, err)
	}
	if v := direct.Get(ctx, "lp:lock:k").Val(); v != "t1" {
		t.Fatalf("node has %q for the lock key; want t1", v)
	}
	if pttl := direct.PTTL(ctx, "lp:lock:k").Val(); pttl <= 0 || pttl > 5*time.Second {
		t.Fatalf("PTTL = %v; want in (0, 5s]", pttl)
	}
	g2, err := n.Acquire(ctx, quorum.Request{Key: "k", Token: "t2", TTL: 5 * time.Second})
	if err != nil || g2.Acquired {
		t.Fatalf("second Acquire = %+v, %v; want refused", g2, err)
	}

	ok, err := n.RaiseFence(ctx, "k", "t1", g.Fence+100)
	if err != nil || !ok {
		t.Fatalf("RaiseFence by holder = %v, %v; want true", ok, err)
	}
	if ok, _ := n.RaiseFence(ctx, "k", "t2", g.Fence+1000); ok {
		t.Fatal("RaiseFence by a non-holder = true; want false")
	}
	if ok, err := n.Extend(ctx, "k", "t2", time.Minute); ok || err != nil {
		t.Fatalf("Extend by a non-holder = %v, %v; want false", ok, err)
	}
	if ok, err := n.Extend(ctx, "k", "t1", time.Minute); !ok || err != nil {
		t.Fatalf("Extend by the holder = %v, %v; want true", ok, err)
	}
	if pttl := direct.PTTL(ctx, "lp:lock:k").Val(); pttl <= 5*time.Second {
		t.Fatalf("PTTL after Extend = %v; want > 5s", pttl)
	}
	if ok, _ := n.Release(ctx, "k", "t2", quorum.AnyHold); ok {
		t.Fatal("Release by a non-holder = true")
	}
	if ok, err := n.Release(ctx, "k", "t1", quorum.AnyHold); !ok || err != nil {
		t.Fatalf("Release by the holder = %v, %v; want true", ok, err)
	}
	if direct.Exists(ctx, "lp:lock:k").Val() != 0 {
		t.Fatal("lock key still on the node after Release")
	}
	// The next grant reads the raised counter.
	g3, err := n.Acquire(ctx, quorum.Request{Key: "k", Token: "t3", TTL: time.Second})
	if err != nil || !g3.Acquired || g3.Fence <= g.Fence+100 {
		t.Fatalf("Acquire after raise = %+v, %v; want fence > %d", g3, err, g.Fence+100)
	}
}

// TestNodeScriptCacheLost: after SCRIPT FLUSH (or a restart) the scripts
// are loaded again by EVAL.
func TestNodeScriptCacheLost(t *testing.T) {
	n, r := nodeOnRedis(t)
	ctx := ctxTimeout(t, 10*time.Second)
	if _, err := n.Acquire(ctx, quorum.Request{Key: "k", Token: "t", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := r.Client(t).ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if ok, err := n.Release(ctx, "k", "t", quorum.AnyHold); !ok || err != nil {
		t.Fatalf("Release after SCRIPT FLUSH = %v, %v; want true", ok, err)
	}
}

// TestNodeBatchesKeepOrder: many concurrent operations, batched, each
// answered correctly; operations on one key stay in order.
//
// The pairs often share a batch, where the grant's fence write would come
// after the release and leave the hold's lockf behind until its TTL: none
// may be left.
func TestNodeBatchesKeepOrder(t *testing.T) {
	n, r := nodeOnRedis(t)
	ctx := ctxTimeout(t, 30*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for c := 0; c < 64; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			key, tok := fmt.Sprintf("key%d", c), fmt.Sprintf("tok%d", c)
			for i := 0; i < 50; i++ {
				// Acquire and Release started back to back without
				// waiting: the release must not overtake the acquire.
				var g quorum.NodeGrant
				var gerr error
				done := make(chan struct{})
				n.StartAcquire(ctx, quorum.Request{Key: key, Token: tok, TTL: time.Minute}, func(ng quorum.NodeGrant, err error) {
					g, gerr = ng, err
					close(done)
				})
				ok, err := n.Release(ctx, key, tok, quorum.AnyHold)
				<-done
				if gerr != nil || !g.Acquired || err != nil || !ok {
					errs <- fmt.Errorf("client %d round %d: acquire %+v %v, release %v %v", c, i, g, gerr, ok, err)
					return
				}
			}
		}(c)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Fence writes go out on the writer's connection before their grants
	// are answered; one more operation on it, answered after them, makes
	// sure the node has run them all before the check.
	if _, err := n.Release(ctx, "other", "tok", quorum.AnyHold); err != nil {
		t.Fatal(err)
	}
	left, err := r.Client(t).Keys(ctx, "lp:lock*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		slices.Sort(left)
		t.Errorf("%d keys left after every hold was released: %q", len(left), left[:min(len(left), 5)])
	}
}

// TestNodeDownAndPaused: a dead node answers with an error, a paused one
// within the caller's deadline, and both work again once back.
func TestNodeDownAndPaused(t *testing.T) {
	n, r := nodeOnRedis(t)
	req := quorum.Request{Key: "k", Token: "t", TTL: time.Second}

	r.Pause()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_, err := n.Acquire(ctx, req)
	cancel()
	if err == nil || quorum.Reason(err) != "timeout" {
		t.Fatalf("Acquire on a paused node = %v; want a timeout", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Acquire on a paused node took %v; want about 100ms", d)
	}
	r.Resume()

	r.Kill()
	_, err = n.Acquire(ctxTimeout(t, time.Second), req)
	if err == nil {
		t.Fatal("Acquire on a dead node succeeded")
	}
	r.Restart()
	deadline := time.Now().Add(10 * time.Second)
	for {
		g, err := n.Acquire(ctxTimeout(t, time.Second), quorum.Request{Key: "k2", Token: "t", TTL: time.Second})
		if err == nil && g.Acquired {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node never came back: %+v, %v", g, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestNodeClosed(t *testing.T) {
	harness.RequireBinary(t, "redis-server", "redis-server")
	r := harness.StartRedis(t, harness.RedisOptions{})
	n := NewNode(NodeConfig{Addr: r.Addr, KeyPrefix: "lp:"})
	n.Close()
	_, err := n.Acquire(ctxTimeout(t, time.Second), quorum.Request{Key: "k", Token: "t", TTL: time.Second})
	if !errors.Is(err, errClosed) {
		t.Fatalf("Acquire on a closed node = %v; want errClosed", err)
	}
}

// fakeServer accepts connections and answers every read with reply (or
// nothing when reply is nil), standing in for a node that is not Redis.
func fakeServer(t *testing.T, reply []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
					if _, err := c.Read(buf); err != nil {
						return
					}
					if reply != nil {
						if _, err := c.Write(reply); err != nil {
							return
						}
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// TestNodeGarbage: a node that answers garbage, or nothing at all, yields an
// error within the caller's deadline and never a grant.
func TestNodeGarbage(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reply []byte
	}{
		{"http server", []byte("HTTP/1.1 400 Bad Request\r\n\r\n")},
		{"binary noise", []byte{0x00, 0xff, 0x13, '\r', '\n', '$', '9', '9'}},
		{"wrong RESP type", []byte("*1\r\n$2\r\nok\r\n")},
		{"integers for everything", []byte(":5\r\n:5\r\n:5\r\n:5\r\n")},
		{"silent", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := NewNode(NodeConfig{Addr: fakeServer(t, tc.reply), KeyPrefix: "lp:", DialTimeout: 200 * time.Millisecond})
			defer n.Close()
			for i := 0; i < 3; i++ {
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
				g, err := n.Acquire(ctx, quorum.Request{Key: "k", Token: "t", TTL: time.Second})
				cancel()
				if err == nil || g.Acquired {
					t.Fatalf("Acquire from a %s = %+v, %v; want an error", tc.name, g, err)
				}
				if d := time.Since(start); d > 2*time.Second {
					t.Fatalf("Acquire from a %s took %v; want about the 150ms deadline", tc.name, d)
				}
			}
		})
	}
}

// TestNodeSharedReleases starts many releases at once, over keys in every
// state a release meets, so that they share script calls (see
// Node.send), and checks each answer and what is left on the node: the
// shared call must give each release what a call of its own would.
func TestNodeSharedReleases(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 30*time.Second)
	const long = time.Minute

	type rel struct {
		key, token string
		hold       quorum.Hold
		want       bool
		left       string // the lock key's value afterwards; "" gone
	}
	type hold struct {
		token string
		mode  quorum.Mode
	}
	ex, sh := quorum.Exclusive, quorum.Shared
	// Each state is set up on count keys named after it; then one release
	// of token (hold kind) runs on each.
	states := []struct {
		name  string
		count int
		holds []hold
		token string
		hold  quorum.Hold
		want  bool
		left  string
	}{
		{"plain", 40, []hold{{"a", ex}}, "a", quorum.AnyHold, true, ""},
		{"reentrant", 10, []hold{{"a", ex}, {"a", ex}}, "a", quorum.AnyHold, true, "a"},
		{"other", 10, []hold{{"owner", ex}}, "stranger", quorum.AnyHold, false, "owner"},
		{"readers", 10, []hold{{"r1", sh}, {"r2", sh}}, "r1", quorum.AnyHold, true, readMarker},
		{"lastreader", 10, []hold{{"r1", sh}}, "r1", quorum.ReadHold, true, ""},
		// A roll-back of a write hold finds only a read hold: refused.
		{"wrongkind", 10, []hold{{"r1", sh}}, "r1", quorum.WriteHold, false, readMarker},
		{"downgraded", 10, []hold{{"a", ex}, {"a", sh}}, "a", quorum.AnyHold, true, readMarker},
		{"free", 10, nil, "nobody", quorum.AnyHold, false, ""},
	}
	var rels []rel
	for _, st := range states {
		for i := 0; i < st.count; i++ {
			k := fmt.Sprintf("%s%d", st.name, i)
			for _, h := range st.holds {
				g, err := n.Acquire(ctx, quorum.Request{Key: k, Token: h.token, TTL: long, Mode: h.mode})
				if err != nil || !g.Acquired {
					t.Fatalf("acquire %s by %s: %+v, %v", k, h.token, g, err)
				}
			}
			rels = append(rels, rel{k, st.token, st.hold, st.want, st.left})
		}
	}
	// Listeners on a few keys' channels: only the UNLOCKs that free their
	// keys are announced, and no channel without a listener gets a
	// PUBLISH.
	listened := []string{"plain0", "plain1", "plain2", "reentrant0", "other0", "readers0", "downgraded0", "free0"}
	announced := []string{"downgraded0", "plain0", "plain1", "plain2"} // sorted
	chans := make([]string, len(listened))
	for i, k := range listened {
		chans[i] = "lp:released:" + k
	}
	sub := direct.Subscribe(ctx, chans...)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the first confirmation
		t.Fatal(err)
	}
	if err := direct.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	type answer struct {
		ok  bool
		err error
	}
	answers := make([]chan answer, len(rels))
	for i, rl := range rels {
		answers[i] = make(chan answer, 1)
		n.StartRelease(ctx, rl.key, rl.token, rl.hold, func(ok bool, err error) { answers[i] <- answer{ok, err} })
	}
	for i, rl := range rels {
		a := <-answers[i]
		if a.err != nil || a.ok != rl.want {
			t.Errorf("release %s by %s (hold %v) = %v, %v; want %v", rl.key, rl.token, rl.hold, a.ok, a.err, rl.want)
		}
		v, err := direct.Get(ctx, "lp:lock:"+rl.key).Result()
		if err != nil {
			v = ""
		}
		if v != rl.left {
			t.Errorf("after releasing %s: lock key %q; want %q", rl.key, v, rl.left)
		}
	}
	// The plain releases freed their keys and the hold's fence with them.
	for i := 0; i < 40; i++ {
		if n := direct.Exists(ctx, fmt.Sprintf("lp:lockf:plain%d", i)).Val(); n != 0 {
			t.Errorf("lockf of plain%d left behind", i)
		}
	}
	stats := direct.Info(ctx, "commandstats").Val()
	calls := statCalls(stats, "evalsha") + statCalls(stats, "eval")
	t.Logf("%d releases in %d script calls", len(rels), calls)
	if calls >= int64(len(rels)) {
		t.Errorf("%d releases took %d script calls; want them to share calls", len(rels), calls)
	}
	if got := statCalls(stats, "publish"); got != int64(len(announced)) {
		t.Errorf("%d PUBLISH calls; want %d, one per freed key with a listener", got, len(announced))
	}
	expectAnnouncements(t, sub, announced)
}

// TestReleaseAnnouncedToPatternListeners: PUBSUB NUMSUB does not count a
// listener by pattern, so while one listens every release that frees a
// key is announced, in a shared call as in a call of its own.
func TestReleaseAnnouncedToPatternListeners(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 30*time.Second)
	keys := []string{"p0", "p1", "p2", "p3", "p4", "p5"}
	for _, k := range keys {
		g, err := n.Acquire(ctx, quorum.Request{Key: k, Token: "a", TTL: time.Minute})
		if err != nil || !g.Acquired {
			t.Fatalf("acquire %s: %+v, %v", k, g, err)
		}
	}
	sub := direct.PSubscribe(ctx, "lp:released:*")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the confirmation
		t.Fatal(err)
	}
	releaseTogether(ctx, t, n, keys, "a")
	expectAnnouncements(t, sub, keys)
}

// TestReleaseAnnouncedWithoutPubsub: a node user denied PUBSUB still
// releases, and announces every release that frees a key (it cannot tell
// who listens); the node's ACL LOG records the refused PUBSUB.
func TestReleaseAnnouncedWithoutPubsub(t *testing.T) {
	harness.RequireBinary(t, "redis-server", "redis-server")
	r := harness.StartRedis(t, harness.RedisOptions{})
	direct := r.Client(t)
	ctx := ctxTimeout(t, 30*time.Second)
	if err := direct.Do(ctx, "ACL", "SETUSER", "nopubsub", "on", ">pw", "~*", "&*", "+@all", "-pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	n := NewNode(NodeConfig{Addr: r.Addr, KeyPrefix: "lp:", Username: "nopubsub", Password: "pw", Timeout: time.Second, Metrics: NewMetrics(nil)})
	t.Cleanup(func() { n.Close() })
	keys := []string{"q0", "q1", "q2"}
	for _, k := range keys {
		g, err := n.Acquire(ctx, quorum.Request{Key: k, Token: "a", TTL: time.Minute})
		if err != nil || !g.Acquired {
			t.Fatalf("acquire %s: %+v, %v", k, g, err)
		}
	}
	sub := direct.Subscribe(ctx, "lp:released:q0", "lp:released:q1")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	if err := direct.Do(ctx, "ACL", "LOG", "RESET").Err(); err != nil {
		t.Fatal(err)
	}
	if err := direct.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	releaseTogether(ctx, t, n, keys, "a")
	for _, k := range keys {
		if n := direct.Exists(ctx, "lp:lock:"+k).Val(); n != 0 {
			t.Errorf("lock key of %s left behind", k)
		}
	}
	expectAnnouncements(t, sub, []string{"q0", "q1"})
	stats := direct.Info(ctx, "commandstats").Val()
	if got := statCalls(stats, "publish"); got != int64(len(keys)) {
		t.Errorf("%d PUBLISH calls; want %d, one per freed key", got, len(keys))
	}
	log, err := direct.Do(ctx, "ACL", "LOG").Slice()
	if err != nil {
		t.Fatal(err)
	}
	if len(log) == 0 || !strings.Contains(fmt.Sprint(log), "pubsub") {
		t.Errorf("ACL LOG %v; want the refused PUBSUB", log)
	}
}

// releaseTogether starts token's releases of keys at once, so that they
// share script calls, and fails t unless each released a hold.
func releaseTogether(ctx context.Context, t *testing.T, n *Node, keys []string, token string) {
	t.Helper()
	errs := make(chan error, len(keys))
	for _, k := range keys {
		n.StartRelease(ctx, k, token, quorum.AnyHold, func(ok bool, err error) {
			if err == nil && !ok {
				err = fmt.Errorf("release of %s refused", k)
			}
			errs <- err
		})
	}
	for range keys {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// expectAnnouncements reads len(want) release announcements from sub and
// checks that they name the keys of want (sorted), in any order.
func expectAnnouncements(t *testing.T, sub *goredis.PubSub, want []string) {
	t.Helper()
	var heard []string
	for range want {
		msg, err := sub.ReceiveMessage(ctxTimeout(t, 5*time.Second))
		if err != nil {
			t.Fatalf("announcements heard %v, then %v; want %v", heard, err, want)
		}
		heard = append(heard, strings.TrimPrefix(msg.Channel, "lp:released:"))
	}
	slices.Sort(heard)
	if !slices.Equal(heard, want) {
		t.Errorf("announcements on %v; want %v", heard, want)
	}
}

// TestFenceHashIsHashTable: the fence hash is a hash table from the first
// grant on (see fenceHashPad), not a listpack whose HINCRBY scans it, and
// re-seeding a restarted node ignores the pad.
func TestFenceHashIsHashTable(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 10*time.Second)
	g, err := n.Acquire(ctx, quorum.Request{Key: "k", Token: "a", TTL: time.Minute})
	if err != nil || !g.Acquired {
		t.Fatalf("acquire: %+v, %v", g, err)
	}
	if enc, err := direct.ObjectEncoding(ctx, "lp:fence").Result(); err != nil || enc != "hashtable" {
		t.Errorf("OBJECT ENCODING lp:fence = %q, %v; want hashtable", enc, err)
	}
	h, err := n.readFences(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := h[fenceHashPad]; !ok {
		t.Fatalf("fence hash %v has no pad field", h)
	}
	merged := mergeFences([]map[string]string{h})
	if _, ok := merged[fenceHashPad]; ok || len(merged) != 1 {
		t.Errorf("merged fences %v; want the one slot's counter, not the pad", merged)
	}
}

// statCalls reads calls= of cmdstat_<cmd> from INFO commandstats.
func statCalls(info, cmd string) int64 {
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls=")
		if !ok {
			continue
		}
		num, _, _ := strings.Cut(rest, ",")
		v, _ := strconv.ParseInt(num, 10, 64)
		return v
	}
	return 0
}

// TestNodeTLSHandshakeBounded: a node that takes the connection and never
// answers the TLS handshake fails the dial within the dial timeout, even
// when the caller's context has no deadline, so a writer is never stuck
// on it.
func TestNodeTLSHandshakeBounded(t *testing.T) {
	ca := harness.NewTestCA(t)
	n := NewNode(NodeConfig{Addr: fakeServer(t, nil), KeyPrefix: "lp:", DialTimeout: 200 * time.Millisecond, TLS: ca.ClientConfig()})
	defer n.Close()
	start := time.Now()
	c, err := n.connect(context.Background())
	if err == nil {
		c.close()
		t.Fatal("connect to a silent node succeeded")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("connect to a silent node took %v; want about the 200ms dial timeout", d)
	}
}

// lateFenceNodes starts a redis-server and two Nodes on it, a and b (two
// lockproxy instances). Each batch's fence writes on a wait: a value on
// stores says they are ready, and they go out once the test sends on turn.
func lateFenceNodes(t *testing.T) (direct *goredis.Client, a, b *Node, stores, turn chan struct{}) {
	r := harness.StartRedis(t, harness.RedisOptions{})
	a, b = newTestNode(t, r), newTestNode(t, r)
	stores, turn = make(chan struct{}), make(chan struct{})
	a.beforeFenceStore = func() {
		stores <- struct{}{}
		<-turn
	}
	return r.Client(t), a, b, stores, turn
}

// TestLateFenceStore: the holder of a fresh grant may reach the node
// through another lockproxy instance (here another Node) before the
// grant's fence write has run: written first is not run first. The late
// write must not undo what that operation stored: a downgrade's read
// hold, a reentrant grant's extra hold.
func TestLateFenceStore(t *testing.T) {
	direct, a, b, stores, turn := lateFenceNodes(t)
	ctx := ctxTimeout(t, 20*time.Second)
	for _, tc := range []struct {
		name  string
		mode  quorum.Mode // what b takes with the same token meanwhile
		state string      // after the write hold's release through b
	}{
		{"downgrade", quorum.Shared, "r:tok=1"},
		{"reentrant", quorum.Exclusive, "w:tok:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := fmt.Sprintf("late-%s-%d", tc.name, time.Now().UnixNano())
			type result struct {
				g   quorum.NodeGrant
				err error
			}
			granted := make(chan result, 1)
			go func() {
				g, err := a.Acquire(ctx, quorum.Request{Key: key, Token: "tok", TTL: 10 * time.Second, NoReentry: true})
				granted <- result{g, err}
			}()
			select {
			case <-stores:
			case <-ctx.Done():
				t.Fatal("the grant's fence write never came")
			}
			g, err := b.Acquire(ctx, quorum.Request{Key: key, Token: "tok", TTL: 10 * time.Second, Mode: tc.mode})
			if err != nil || !g.Acquired {
				t.Fatalf("%s before the fence write: %+v, %v; want granted", tc.name, g, err)
			}
			turn <- struct{}{}
			res := <-granted
			if res.err != nil || !res.g.Acquired {
				t.Fatalf("grant: %+v, %v", res.g, res.err)
			}
			// With no fence stored yet, a downgrade answers the slot
			// counter, at least the hold's fence; a reentrant grant 0 and
			// the counter, which the quorum makes up from.
			if tc.mode == quorum.Shared && g.Fence < res.g.Fence || tc.mode == quorum.Exclusive && (g.Fence != 0 || g.Counter < res.g.Fence) {
				t.Errorf("%s before the fence write: fence %d, counter %d; the hold's fence is %d", tc.name, g.Fence, g.Counter, res.g.Fence)
			}
			// The write is sent before the grant is answered but may run
			// after a GET on another connection.
			want := strconv.FormatUint(res.g.Fence, 10) + ",tok"
			waitFor(t, "the fence write", func() bool {
				return direct.Get(ctx, "lp:lockf:"+key).Val() == want
			})
			if ok, err := b.Release(ctx, key, "tok", quorum.AnyHold); !ok || err != nil {
				t.Fatalf("release of the write hold: %v, %v", ok, err)
			}
			st, err := b.LockState(ctx, key)
			if err != nil {
				t.Fatalf("LockState: %v", err)
			}
			if got := describeState(st); got != tc.state {
				t.Errorf("state after the write hold's release %q; want %q (the late fence write undid the %s)", got, tc.state, tc.name)
			}
		})
	}
}

// TestDowngradeThroughOtherNode: the holder of a fresh grant downgrades at
// once through another instance (another Node, on its own connection), as
// fast as it can, many times. Its read hold always outlives the write
// hold's release, and the downgrade's fence is the write hold's, or 0 when
// it ran before the fence write (the quorum then takes the other nodes').
func TestDowngradeThroughOtherNode(t *testing.T) {
	r := harness.StartRedis(t, harness.RedisOptions{})
	a, b := newTestNode(t, r), newTestNode(t, r)
	ctx := ctxTimeout(t, 30*time.Second)
	early := 0
	for i := 0; i < 300; i++ {
		key, tok := fmt.Sprintf("down%d", i), fmt.Sprintf("tok%d", i)
		w, err := a.Acquire(ctx, quorum.Request{Key: key, Token: tok, TTL: 10 * time.Second})
		if err != nil || !w.Acquired {
			t.Fatalf("round %d: grant: %+v, %v", i, w, err)
		}
		d, err := b.Acquire(ctx, quorum.Request{Key: key, Token: tok, TTL: 10 * time.Second, Mode: quorum.Shared})
		if err != nil || !d.Acquired || (d.Fence != w.Fence && d.Fence != 0) {
			t.Fatalf("round %d: downgrade through the other node: %+v, %v; want granted with the write fence %d (or 0)", i, d, err, w.Fence)
		}
		if d.Fence == 0 {
			early++
		}
		if ok, err := b.Release(ctx, key, tok, quorum.AnyHold); !ok || err != nil {
			t.Fatalf("round %d: release of the write hold: %v, %v", i, ok, err)
		}
		st, err := a.LockState(ctx, key)
		if err != nil {
			t.Fatalf("LockState: %v", err)
		}
		if got, want := describeState(st), "r:"+tok+"=1"; got != want {
			t.Fatalf("round %d: after the write hold's release %q; want %q", i, got, want)
		}
	}
	t.Logf("%d of 300 downgrades ran before the grant's fence write", early)
}

// TestDowngradeStoresExpiringMeta: a downgrade on a node without the
// hold's fence (its write still on the way, or lost) stores a lockm that
// expires with the hold, not one that lives for ever.
func TestDowngradeStoresExpiringMeta(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 10*time.Second)
	if err := direct.Set(ctx, "lp:lock:k", "a", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	g, err := n.Acquire(ctx, quorum.Request{Key: "k", Token: "a", TTL: time.Minute, Mode: quorum.Shared})
	if err != nil || !g.Acquired {
		t.Fatalf("downgrade: %+v, %v", g, err)
	}
	if v := direct.Get(ctx, "lp:lockm:k").Val(); v != "0,r,a" {
		t.Errorf("lockm after the downgrade %q; want %q", v, "0,r,a")
	}
	kp, mp := direct.PTTL(ctx, "lp:lock:k").Val(), direct.PTTL(ctx, "lp:lockm:k").Val()
	if mp <= 0 || mp > kp {
		t.Errorf("lockm PTTL %v, lock key's %v; want it to expire with the hold, not after", mp, kp)
	}
}

// TestStaleMetaIgnored: a lockm or lockf left by an earlier hold (its lock
// key deleted by hand) changes nothing for the next holder: its holds and
// downgrade flag are not inherited, and its fence is replaced.
func TestStaleMetaIgnored(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 10*time.Second)
	direct.Set(ctx, "lp:lockm:k", "3,r,old", time.Minute)
	direct.Set(ctx, "lp:lockf:k", "1", time.Minute)
	g, err := n.Acquire(ctx, quorum.Request{Key: "k", Token: "new", TTL: time.Minute})
	if err != nil || !g.Acquired || g.Holds != 1 {
		t.Fatalf("grant: %+v, %v", g, err)
	}
	want := strconv.FormatUint(g.Fence, 10) + ",new"
	waitFor(t, "the fence write", func() bool { return direct.Get(ctx, "lp:lockf:k").Val() == want })
	st, err := n.LockState(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if got := describeState(st); got != "w:new:1" {
		t.Errorf("state %q; want w:new:1 (not the old hold's extra holds)", got)
	}
	if ok, err := n.Release(ctx, "k", "new", quorum.AnyHold); !ok || err != nil {
		t.Fatalf("release: %v, %v", ok, err)
	}
	for _, k := range []string{"lp:lock:k", "lp:lockf:k", "lp:lockm:k"} {
		if direct.Exists(ctx, k).Val() != 0 {
			t.Errorf("%s left after the single hold's release", k)
		}
	}
}

// TestLateFenceAfterRelease: the holder releases through another instance
// before the grant's fence write ran, so the write leaves a lockf behind
// the hold. The next holder must not take that fence as its own: a
// reentrant grant before its own fence write answers 0 (the quorum makes
// it up), and LOCKINFO the slot counter.
func TestLateFenceAfterRelease(t *testing.T) {
	direct, a, b, stores, turn := lateFenceNodes(t)
	ctx := ctxTimeout(t, 20*time.Second)
	granted := make(chan error, 1)
	var first quorum.NodeGrant
	go func() {
		g, err := a.Acquire(ctx, quorum.Request{Key: "k", Token: "t1", TTL: 10 * time.Second, NoReentry: true})
		first = g
		granted <- err
	}()
	select {
	case <-stores:
	case <-ctx.Done():
		t.Fatal("the grant's fence write never came")
	}
	if ok, err := b.Release(ctx, "k", "t1", quorum.AnyHold); !ok || err != nil {
		t.Fatalf("release before the fence write: %v, %v", ok, err)
	}
	turn <- struct{}{}
	if err := <-granted; err != nil || !first.Acquired {
		t.Fatalf("grant: %+v, %v", first, err)
	}
	orphan := strconv.FormatUint(first.Fence, 10) + ",t1"
	waitFor(t, "the late fence write", func() bool { return direct.Get(ctx, "lp:lockf:k").Val() == orphan })
	// The next holder's grant, as the node sees it before its own fence
	// write: the lock key and a higher slot counter.
	direct.Set(ctx, "lp:lock:k", "t2", 10*time.Second)
	next := direct.HIncrBy(ctx, "lp:fence", strconv.Itoa(int(slot("k"))), 1).Val()
	g, err := b.Acquire(ctx, quorum.Request{Key: "k", Token: "t2", TTL: 10 * time.Second})
	if err != nil || !g.Acquired || g.Holds != 2 {
		t.Fatalf("reentrant grant: %+v, %v", g, err)
	}
	if g.Fence == first.Fence || g.Counter < uint64(next) {
		t.Errorf("reentrant grant of t2: fence %d, counter %d; want not t1's fence %d, counter ≥ %d", g.Fence, g.Counter, first.Fence, next)
	}
	st, err := b.LockState(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if st.fence == first.Fence {
		t.Errorf("LOCKINFO fence of t2's hold %d: t1's", st.fence)
	}
}

// TestMarkReleased: which fresh grants' fence writes a batch leaves out,
// because the batch itself released the hold.
func TestMarkReleased(t *testing.T) {
	acq := func(key, tok string) *op { return &op{kind: opAcquire, base: key, token: tok, mode: quorum.Exclusive} }
	rel := func(key, tok string, h quorum.Hold) *op { return &op{kind: opRelease, base: key, token: tok, hold: h} }
	granted := opResult{n: 7, holds: 1}
	released, notHeld := opResult{n: 1}, opResult{n: 0}
	failed := opResult{err: errors.New("node down")}
	for _, tc := range []struct {
		name string
		ops  []*op
		out  []opResult
		gone bool // the first grant's fence write is left out
	}{
		{"released by its holder", []*op{acq("k", "t"), rel("k", "t", quorum.AnyHold)}, []opResult{granted, released}, true},
		{"rolled back", []*op{acq("k", "t"), rel("k", "t", quorum.WriteHold)}, []opResult{granted, released}, true},
		{"release found nothing", []*op{acq("k", "t"), rel("k", "t", quorum.AnyHold)}, []opResult{granted, notHeld}, false},
		{"release failed", []*op{acq("k", "t"), rel("k", "t", quorum.AnyHold)}, []opResult{granted, failed}, false},
		{"another token's release", []*op{acq("k", "t"), rel("k", "u", quorum.AnyHold)}, []opResult{granted, notHeld}, false},
		{"a read hold's release", []*op{acq("k", "t"), rel("k", "t", quorum.ReadHold)}, []opResult{granted, released}, false},
		{"another key's release", []*op{acq("k", "t"), rel("j", "t", quorum.AnyHold)}, []opResult{granted, released}, false},
		{"downgrade between", []*op{acq("k", "t"), {kind: opAcquire, base: "k", token: "t", mode: quorum.Shared}, rel("k", "t", quorum.AnyHold)},
			[]opResult{granted, {n: 7, holds: 2}, released}, false},
		{"the next holder's grant after", []*op{acq("k", "t"), rel("k", "t", quorum.AnyHold), acq("k", "u")},
			[]opResult{granted, released, granted}, true},
		{"the next holder's grant and release after", []*op{acq("k", "t"), rel("k", "t", quorum.AnyHold), acq("k", "u"), rel("k", "u", quorum.AnyHold)},
			[]opResult{granted, released, granted, released}, true},
		{"another token's refused attempt between", []*op{acq("k", "t"), acq("k", "u"), rel("k", "t", quorum.AnyHold)},
			[]opResult{granted, {n: acquireRefused}, released}, true},
		{"a reentrant grant between", []*op{acq("k", "t"), acq("k", "t"), rel("k", "t", quorum.AnyHold)},
			[]opResult{granted, {n: 7, holds: 2}, released}, false},
		{"a release that found nothing, then one that released", []*op{acq("k", "t"), rel("k", "t", quorum.AnyHold), rel("k", "t", quorum.AnyHold)},
			[]opResult{granted, notHeld, released}, true},
		{"release before the grant", []*op{rel("k", "t", quorum.AnyHold), acq("k", "t")}, []opResult{notHeld, granted}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var writes []fenceWrite
			for i, o := range tc.ops {
				if o.kind == opAcquire && o.mode == quorum.Exclusive && tc.out[i].holds == 1 {
					writes = append(writes, fenceWrite{base: o.base, token: o.token, fence: tc.out[i].n, op: i, mark: true})
				}
			}
			markReleased(tc.ops, nil, tc.out, writes)
			if writes[0].gone != tc.gone {
				t.Errorf("gone = %v; want %v", writes[0].gone, tc.gone)
			}
			// A waiting writer's mark is cleared either way.
			want := 2 * len(writes)
			for _, w := range writes {
				if w.gone {
					want--
				}
			}
			if got := fenceWriteCommands(writes); got != want {
				t.Errorf("fenceWriteCommands = %d; want %d", got, want)
			}
		})
	}
}
