package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/test/harness"
)

// LateAcquireUser is the user lockproxy uses on the node that answers
// late: the default user, or an ACL user refused part of CLIENT.
type LateAcquireUser struct {
	Name string
	Rule string // the ACL rule that takes the permission away; "" for the default user
}

var (
	DefaultUser = LateAcquireUser{Name: "default user"}
	NoKillUser  = LateAcquireUser{Name: "CLIENT KILL refused", Rule: "-client|kill"}
	NoIDUser    = LateAcquireUser{Name: "CLIENT refused", Rule: "-client"}
)

// LateAcquireBackend is a Backend over three real nodes whose third is
// reached as user, at via(its address) when via is set (a fault proxy in
// front of it: late_acquire_killed_test.go, an external test, since
// faultproxy imports this package), with its logs.
func LateAcquireBackend(t *testing.T, user LateAcquireUser, via func(addr string) string) (*Backend, []*harness.Redis, *observer.ObservedLogs) {
	t.Helper()
	harness.RequireBinary(t, "redis-server", "redis-server")
	rs := harness.StartRedisN(t, 3, harness.RedisOptions{})
	core, logs := observer.New(zap.DebugLevel)
	cfg := Config{RetryMin: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond,
		Quorum: quorum.Config{DriftFactor: 0.01, DriftMin: 2 * time.Millisecond}, Logger: zap.New(core)}
	for _, r := range rs {
		cfg.Nodes = append(cfg.Nodes, NodeConfig{Addr: r.Addr, KeyPrefix: "lp:", Timeout: time.Second, Metrics: NewMetrics(nil)})
	}
	if user.Rule != "" {
		ctx := ctxTimeout(t, 5*time.Second)
		if err := rs[2].Client(t).Do(ctx, "ACL", "SETUSER", "lp", "on", ">pw", "~*", "&*", "+@all", user.Rule).Err(); err != nil {
			t.Fatal(err)
		}
		cfg.Nodes[2].Username, cfg.Nodes[2].Password = "lp", "pw"
	}
	if via != nil {
		cfg.Nodes[2].Addr = via(rs[2].Addr)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b, rs, logs
}

// LateAttempt makes every writer connection, has n0 held by another
// holder, runs fault (which makes n2 answer late) and a LOCK that fails
// there: n0 refuses, n1 grants and is rolled back, n2's acquire is sent and
// not answered within the node timeout. It returns when the LOCK was
// made.
func LateAttempt(ctx context.Context, t *testing.T, b *Backend, rs []*harness.Redis, key string, ttl time.Duration, fault func()) time.Time {
	t.Helper()
	// n2's writer must be done with the release before the fault, or the
	// attempt waits behind it.
	WarmUp(ctx, t, b, rs, key, ttl)
	if err := rs[0].Client(t).Set(ctx, "lp:lock:"+key, "other", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	fault()
	start := time.Now()
	_, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "late", TTL: ttl})
	if !errors.Is(err, backends.ErrNotAcquired) {
		t.Fatalf("LOCK with n0 held and n2 late = %v; want not acquired", err)
	}
	return start
}

// WatchLateKey polls n2's lock key every 10 ms until until, and returns
// when it first saw the failed attempt's key there and when it last did
// (zero when never).
func WatchLateKey(ctx context.Context, t *testing.T, r *harness.Redis, key string, until time.Time) (first, last time.Time) {
	t.Helper()
	c := r.Client(t)
	for time.Now().Before(until) {
		v, err := c.Get(ctx, "lp:lock:"+key).Result()
		if err == nil && v == "late" {
			if first.IsZero() {
				first = time.Now()
			}
			last = time.Now()
		}
		time.Sleep(10 * time.Millisecond)
	}
	return first, last
}

// TestLateMinorityAcquireRolledBackAfterResume: a failed LOCK whose
// acquire reached a paused node (sent, never answered within the node
// timeout) is rolled back there once the node resumes, within a bounded
// time that does not depend on the TTL. The writer dropped the connection
// the acquire was sent on, and the roll-back could not go out (a new
// connection's set-up is not answered while the node is paused): the
// writer kills the dropped connection from its next one and sends the
// roll-back after the kill. Before, the acquire landed when the node
// resumed and its key stayed for its whole TTL. Where the ACL refuses
// CLIENT KILL (or CLIENT ID) there is no kill, and the roll-back, owed
// and sent after the reconnect, still removes the key: the acquire was in the
// node's socket buffer, and ran when it resumed, before the reconnect.
// A later LOCK by another token is granted at once.
func TestLateMinorityAcquireRolledBackAfterResume(t *testing.T) {
	for _, user := range []LateAcquireUser{DefaultUser, NoKillUser, NoIDUser} {
		t.Run(user.Name, func(t *testing.T) {
			b, rs, logs := LateAcquireBackend(t, user, nil)
			ctx := ctxTimeout(t, 60*time.Second)
			const key = "late-minority"
			const ttl = 10 * time.Second // node timeout 250 ms

			LateAttempt(ctx, t, b, rs, key, ttl, rs[2].Pause)
			// The roll-back's node timeout has passed; the writer's own
			// attempts to pay meet the paused node too for a while.
			time.Sleep(300 * time.Millisecond)
			rs[2].Resume()
			resumed := time.Now()

			c2 := rs[2].Client(t)
			gone := time.Duration(-1)
			for time.Since(resumed) < 3*time.Second {
				if err := c2.Get(ctx, "lp:lock:"+key).Err(); errors.Is(err, goredis.Nil) {
					gone = time.Since(resumed)
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if gone < 0 {
				t.Fatalf("the failed attempt's key is on n2 3 s after it resumed (%v left of its %v TTL): its roll-back never ran after it",
					c2.PTTL(ctx, "lp:lock:"+key).Val(), ttl)
			}
			// And it stays gone: nothing of the attempt lands later.
			if first, _ := WatchLateKey(ctx, t, rs[2], key, time.Now().Add(500*time.Millisecond)); !first.IsZero() {
				t.Fatalf("the failed attempt's key came back on n2 %v after it resumed", first.Sub(resumed))
			}
			t.Logf("the failed attempt's key is gone from n2 %v after it resumed", gone)
			switch user {
			case NoKillUser:
				if logs.FilterMessage("killing a dropped connection refused").Len() == 0 {
					t.Errorf("no log line of the refused kill")
				}
			case NoIDUser:
				if n := logs.FilterMessageSnippet("cannot read CLIENT ID").Len(); n != 1 {
					t.Errorf("%d warnings that CLIENT ID is refused; want 1", n)
				}
			}

			// The other holder goes; a LOCK by a third token needs n0 and n1.
			if err := rs[0].Client(t).Del(ctx, "lp:lock:"+key).Err(); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "next", TTL: ttl}); err != nil {
				t.Fatalf("LOCK after the roll-back = %v", err)
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("LOCK took %v", d)
			}
		})
	}
}

// TestOwedBoundedAndForgotten: what a writer owes after dropped
// connections is bounded (the oldest entries go) and forgotten once the
// acquire's TTL has passed since it was sent, or since the writer last
// failed to reach the node.
func TestOwedBoundedAndForgotten(t *testing.T) {
	t0 := time.Unix(1000, 0)
	acq := func(key, token string, ms int64) *op {
		return &op{kind: opAcquire, base: key, token: token, ms: ms}
	}
	rel := func(key, token string) *op { return &op{kind: opRelease, base: key, token: token, rollback: true} }

	t.Run("bounded", func(t *testing.T) {
		o := &owed{}
		for i := range 3000 {
			o.lost([]*op{acq(fmt.Sprint("k", i), "t", 60_000)}, nil, int64(i+1), "run", t0)
		}
		if len(o.kills) != maxOwed || len(o.doubts) != maxOwed {
			t.Fatalf("kills %d, doubts %d; want %d each", len(o.kills), len(o.doubts), maxOwed)
		}
		if id, k := o.kills[0].id, o.doubts[0].base; id != 3000-maxOwed+1 || k != fmt.Sprint("k", 3000-maxOwed) {
			t.Errorf("oldest kill %d, doubt %s; want the newest %d kept", id, k, maxOwed)
		}
		// Only the roll-backs of the acquires still in doubt are owed.
		for i := range 3000 {
			o.unsent([]*op{rel(fmt.Sprint("k", i), "t")}, t0)
		}
		if len(o.releases) != maxOwed || len(o.doubts) != 0 {
			t.Fatalf("releases %d, doubts %d; want %d, 0", len(o.releases), len(o.doubts), maxOwed)
		}
		if r := o.releases[maxOwed-1]; r.base != "k2999" {
			t.Errorf("newest release %s; want k2999", r.base)
		}
	})

	t.Run("forgotten past the TTL", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			down time.Duration // when the writer last failed to reach the node, after t0
			at   time.Duration
			kept bool
		}{
			{"within the TTL", 0, 999 * time.Millisecond, true},
			{"TTL passed", 0, time.Second, false},
			{"node out of reach since", 5 * time.Second, 5900 * time.Millisecond, true},
			{"TTL passed since out of reach", 5 * time.Second, 6 * time.Second, false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				o := &owed{}
				o.lost([]*op{acq("k", "t", 1000), acq("d", "t", 1000)}, nil, 7, "run", t0)
				o.unsent([]*op{rel("k", "t")}, t0.Add(tc.down))
				if len(o.kills) != 1 || len(o.releases) != 1 || len(o.doubts) != 1 {
					t.Fatalf("kills %d, releases %d, doubts %d; want 1 each", len(o.kills), len(o.releases), len(o.doubts))
				}
				o.prune(t0.Add(tc.at))
				if kept := len(o.kills) == 1 && len(o.releases) == 1 && len(o.doubts) == 1; kept != tc.kept || !tc.kept && !o.empty() {
					t.Errorf("kills %d, releases %d, doubts %d at %v; want all kept %v", len(o.kills), len(o.releases), len(o.doubts), tc.at, tc.kept)
				}
			})
		}
	})
}

// TestOwedRules: what a dropped connection leaves owed. It is killed
// (and its unanswered acquires kept in doubt) only when an acquire and no
// release, owed release or unmark was left unanswered on it; a release is
// owed only as the roll-back of an acquire in doubt that could not be
// written (one per doubt), and a release written to a connection is never
// owed, answered or not: it may have run, and a second run would take
// another hold of its token.
func TestOwedRules(t *testing.T) {
	t0 := time.Unix(1000, 0)
	acq := func(key string) *op { return &op{kind: opAcquire, base: key, token: "t", ms: 5000} }
	rel := func(key, token string) *op { return &op{kind: opRelease, base: key, token: token, rollback: true} }
	other := func(k opKind) *op { return &op{kind: k, base: "x", token: "t"} }
	type want struct{ kills, doubts, releases int }
	for _, tc := range []struct {
		name string
		do   func(o *owed)
		want want
	}{
		{"an unanswered acquire: killed, in doubt", func(o *owed) {
			o.lost([]*op{acq("a")}, nil, 9, "run", t0)
		}, want{1, 1, 0}},
		{"fence writes, extends and raises do not prevent the kill", func(o *owed) {
			o.lost([]*op{other(opExtend), acq("a"), other(opRaiseFence)}, nil, 9, "run", t0)
		}, want{1, 1, 0}},
		{"an unanswered release: no kill, the acquire in doubt", func(o *owed) {
			o.lost([]*op{acq("a"), rel("y", "v")}, nil, 9, "run", t0)
		}, want{0, 1, 0}},
		{"an unanswered unmark: no kill, the acquire in doubt", func(o *owed) {
			o.lost([]*op{acq("a"), other(opUnmark)}, nil, 9, "run", t0)
		}, want{0, 1, 0}},
		{"no acquire: nothing recorded", func(o *owed) {
			o.lost([]*op{other(opExtend)}, nil, 9, "run", t0)
		}, want{0, 0, 0}},
		{"fence writes alone: killed", func(o *owed) {
			o.lost(nil, unansweredFences{{start: t0, ms: 1000}}, 9, "run", t0)
		}, want{1, 0, 0}},
		{"fence writes and an extend: killed", func(o *owed) {
			o.lost([]*op{other(opExtend)}, unansweredFences{{start: t0, ms: 1000}}, 9, "run", t0)
		}, want{1, 0, 0}},
		{"fence writes and a release: no kill", func(o *owed) {
			o.lost([]*op{rel("y", "v")}, unansweredFences{{start: t0, ms: 1000}}, 9, "run", t0)
		}, want{0, 0, 0}},
		{"fence writes clearing a waiting writer's mark: no kill", func(o *owed) {
			o.lost(nil, unansweredFences{{start: t0, ms: 1000, mark: true}}, 9, "run", t0)
		}, want{0, 0, 0}},
		{"an owed release unanswered on it: no kill, not owed again, the acquire in doubt", func(o *owed) {
			o.lost([]*op{acq("a")}, nil, 9, "run", t0)
			o.unsent([]*op{rel("a", "t")}, t0)
			o.inReleases, o.releases = o.releases, nil // written on the next connection
			o.lost([]*op{acq("b")}, nil, 10, "run", t0)
		}, want{1, 1, 0}},
		{"no client id or run_id: in doubt, no kill", func(o *owed) {
			o.lost([]*op{acq("a")}, nil, 0, "run", t0)
			o.lost([]*op{acq("b")}, nil, 10, "", t0)
		}, want{0, 2, 0}},
		{"the unsent roll-back of a doubt is owed once", func(o *owed) {
			o.lost([]*op{acq("a")}, nil, 9, "run", t0)
			o.unsent([]*op{rel("a", "t")}, t0)
			o.unsent([]*op{rel("a", "t")}, t0)
		}, want{1, 0, 1}},
		{"another token's, another key's release is not owed", func(o *owed) {
			o.lost([]*op{acq("a")}, nil, 9, "run", t0)
			o.unsent([]*op{rel("a", "u"), rel("b", "t"), acq("c")}, t0)
		}, want{1, 1, 0}},
		{"a written roll-back settles its doubt, never owed", func(o *owed) {
			o.lost([]*op{acq("a")}, nil, 9, "run", t0)
			r := rel("a", "t")
			o.written([]*op{r})
			if !r.lateGrant {
				t.Error("the written roll-back goes out as a plain release")
			}
			o.lost([]*op{r}, nil, 10, "run", t0) // unanswered
			o.unsent([]*op{rel("a", "t")}, t0)
		}, want{1, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := &owed{}
			tc.do(o)
			if got := (want{len(o.kills), len(o.doubts), len(o.releases)}); got != tc.want {
				t.Errorf("kills, doubts, releases = %v; want %v", got, tc.want)
			}
		})
	}
}

// TestOwedDebtsWritten: the first write on the next connection carries
// the kills, then the owed roll-backs (lateGrantReleaseScript), ahead of
// the batch; written, the roll-backs are owed no more, answered or not,
// and a kill not answered is sent again.
func TestOwedDebtsWritten(t *testing.T) {
	n := &Node{log: zap.NewNop(), prefix: "lp:"}
	o := &owed{}
	now := time.Now()
	o.lost([]*op{{kind: opAcquire, base: "k", token: "t", ms: 5000}}, nil, 3, "run", now)
	o.unsent([]*op{{kind: opRelease, base: "k", token: "t", rollback: true}}, now)
	c := &nodeConn{n: n, run: "run"}
	n.writeDebts(c, o, now)
	got := string(c.wbuf)
	kill, roll := strings.Index(got, "KILL"), strings.Index(got, scriptLateGrant.src)
	if kill < 0 || roll < kill || !strings.Contains(got, "lp:lockf:k") || o.inKills != 1 || len(o.inReleases) != 1 || len(o.releases) != 0 {
		t.Fatalf("wrote %q (%d kills, %d releases in flight, %d owed); want the kill, then k's late-grant roll-back", got, o.inKills, len(o.inReleases), len(o.releases))
	}
	o.lost(nil, nil, 4, "run", now) // the connection failed before any answer
	if len(o.kills) != 1 || len(o.releases) != 0 || len(o.inReleases) != 0 {
		t.Fatalf("after the failure: kills %d, releases %d; want the kill owed still, the roll-back not", len(o.kills), len(o.releases))
	}
}

// TestOwedFenceWritesWrittenAgain: fence writes a kill stops (not the
// ones the batch already released: gone, nor those whose acquire started
// longer ago than its TTL) are written again on the next
// connection after the kill (owedFenceScript), before the owed
// roll-backs; one not answered is sent again.
func TestOwedFenceWritesWrittenAgain(t *testing.T) {
	n := &Node{log: zap.NewNop(), prefix: "lp:", fenceKey: "lp:fence"}
	o := &owed{}
	now := time.Now()
	fences := unansweredFences{
		{base: "f", token: "t", fence: 12, slot: 7, start: now, ms: 5000},
		{base: "g", token: "t", fence: 13, slot: 8, start: now, ms: 5000, gone: true},
		{base: "h", token: "t", fence: 14, slot: 9, start: now.Add(-6 * time.Second), ms: 5000},
	}
	o.lost([]*op{{kind: opAcquire, base: "k", token: "t", ms: 5000}}, fences, 3, "run", now)
	o.unsent([]*op{{kind: opRelease, base: "k", token: "t", rollback: true}}, now)
	c := &nodeConn{n: n, run: "run"}
	n.writeDebts(c, o, now)
	got := string(c.wbuf)
	kill, raise, roll := strings.Index(got, "KILL"), strings.Index(got, scriptOwedFence.src), strings.Index(got, scriptLateGrant.src)
	if kill < 0 || raise < kill || roll < raise || !strings.Contains(got, "lp:lockf:f") || strings.Contains(got, "lp:lockf:g") || strings.Contains(got, "lp:lockf:h") || o.inFences != 1 {
		t.Fatalf("wrote %q (%d fence writes in flight); want the kill, f's fence write (owedFenceScript), then k's roll-back", got, o.inFences)
	}
	o.lost(nil, nil, 4, "run", now) // the connection failed before any answer
	if len(o.fences) != 1 || o.inFences != 0 {
		t.Fatalf("after the failure: %d fence writes owed, %d in flight; want f's owed still", len(o.fences), o.inFences)
	}
}

// TestOwedKillOnlyOnSameServer: the kills written on a connection are
// those of connections to the server it is on (same run_id): after a
// restart the ids start again, and the id may be another client's.
func TestOwedKillOnlyOnSameServer(t *testing.T) {
	n := &Node{log: zap.NewNop()}
	o := &owed{}
	now := time.Now()
	o.lost([]*op{{kind: opAcquire, base: "k", token: "t", ms: 5000}}, nil, 3, "old", now)
	o.lost([]*op{{kind: opAcquire, base: "k", token: "t", ms: 5000}}, nil, 4, "new", now)
	c := &nodeConn{n: n, run: "new"}
	n.writeDebts(c, o, now)
	if got := string(c.wbuf); strings.Count(got, "KILL") != 1 || !strings.Contains(got, "$1\r\n4\r\n") || o.inKills != 1 {
		t.Fatalf("wrote %q (%d kills); want the kill of 4 alone", got, o.inKills)
	}
}

// payDebtsDirect writes what o owes as n's writer would on a new
// connection to the server at addr (of another run than any owed kill:
// those are dropped), on a plain connection, and waits until the node
// has run it all.
func payDebtsDirect(t *testing.T, n *Node, addr string, o *owed, now time.Time) {
	t.Helper()
	c := &nodeConn{n: n, run: "this-run"}
	n.writeDebts(c, o, now)
	c.add("PING")
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Write(c.wbuf); err != nil {
		t.Fatal(err)
	}
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 256)
	for got := ""; !strings.HasSuffix(got, "+PONG\r\n"); {
		k, err := nc.Read(buf)
		got += string(buf[:k])
		if err != nil {
			t.Fatalf("paying debts: %v (read %q)", err, got)
		}
	}
}

// WarmUp locks and unlocks key once, so that every writer has its
// connection and the node its scripts: it waits until n2 has the
// warm-up's hold and fence, and after UNLOCK until it has none of the
// key's lock keys left (LOCK and UNLOCK answer once a majority did) and
// every node's writer has read the release's answer.
func WarmUp(ctx context.Context, t *testing.T, b *Backend, rs []*harness.Redis, key string, ttl time.Duration) {
	t.Helper()
	c2 := rs[2].Client(t)
	// The LOCK answers once a majority granted: n2's hold and fence write
	// may still be on their way. Seen there first, they cannot come after
	// what the caller does next (a fence write a test means to hold on
	// n2's link, say), and the wait below for their removal cannot pass
	// before they came. On a loaded host n2 may miss the node timeout, and
	// its hold is rolled back: the warm-up is then tried again; so is a
	// LOCK answered NOQUORUM there (a fresh backend's first batches set up
	// their connections: two nodes missed the node timeout in a CI run).
	for try := 1; ; try++ {
		if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "warm", TTL: ttl}); err != nil {
			if try == 3 {
				t.Fatalf("warm-up LOCK, three times: %v", err)
			}
			t.Logf("warm-up %d: LOCK: %v; again", try, err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		onN2 := false
		for i := 0; i < 200 && !onN2; i++ {
			if onN2 = c2.Exists(ctx, "lp:lock:"+key, "lp:lockf:"+key).Val() == 2; !onN2 {
				time.Sleep(10 * time.Millisecond)
			}
		}
		if ok, err := b.Unlock(ctx, key, "warm"); !ok || err != nil {
			t.Fatalf("UNLOCK warm = %v, %v", ok, err)
		}
		if onN2 {
			break
		}
		if try == 3 {
			t.Fatal("n2 has not the warm-up's hold and fence 2 s after LOCK, three times")
		}
		t.Logf("warm-up %d: n2 has not the hold and fence 2 s after LOCK; again", try)
	}
	for i := 0; c2.Exists(ctx, "lp:lock:"+key, "lp:lockf:"+key).Val() != 0; i++ {
		if i == 200 {
			t.Fatal("the warm-up keys are still on n2 2 s after UNLOCK")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Run on the node is not answered to the writer: the release's answer
	// may still be on its way back (on a loaded host, still in a test
	// proxy when the caller makes it hold what it reads), and an attempt
	// queued behind it then waits for it, goes out after its node timeout
	// unsent, and never reaches the node. A settle marker is answered once
	// the writer has the answers to what was queued before it.
	for _, n := range b.nodes {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := n.awaitSettle(sctx, n.startSettle(sctx, key))
		cancel()
		if err != nil {
			t.Fatalf("%s's writer has not answered the warm-up's release 2 s after UNLOCK: %v", n.name, err)
		}
	}
}

// BeforeNextFenceStore runs f on the writer of the node at addr before
// its next batch's fence writes are written, once.
func BeforeNextFenceStore(t *testing.T, b *Backend, addr string, f func()) {
	i := slices.IndexFunc(b.nodes, func(n *Node) bool { return n.name == addr })
	if i < 0 {
		t.Fatalf("no node %s", addr)
	}
	n := b.nodes[i]
	n.beforeFenceStore = func() {
		n.beforeFenceStore = nil
		f()
	}
}
