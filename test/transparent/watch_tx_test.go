package transparent

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// rawConn speaks RESP to lockproxy and returns each reply's bytes as they
// came, to check the shapes of EXEC's replies byte for byte.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

// do sends one command and returns its reply's bytes.
func (r *rawConn) do(args ...string) string {
	r.t.Helper()
	_ = r.c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := r.c.Write([]byte(lockclient.Encode(args...))); err != nil {
		r.t.Fatal(err)
	}
	f, err := r.frame()
	if err != nil {
		r.t.Fatalf("%v: %v", args, err)
	}
	return f
}

func (r *rawConn) frame() (string, error) {
	line, err := r.br.ReadString('\n')
	if err != nil {
		return "", err
	}
	switch line[0] {
	case '$':
		n, _ := strconv.Atoi(strings.TrimSpace(line[1:]))
		if n < 0 {
			return line, nil
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(r.br, b); err != nil {
			return "", err
		}
		return line + string(b), nil
	case '*', '%', '~', '>':
		n, _ := strconv.Atoi(strings.TrimSpace(line[1:]))
		if line[0] == '%' {
			n *= 2
		}
		out := line
		for i := 0; i < n; i++ {
			f, err := r.frame()
			if err != nil {
				return "", err
			}
			out += f
		}
		return out, nil
	}
	return line, nil
}

// retake makes key's lock expire on every node and another client take
// it with value other, as a lock that ran out and was taken over.
func retake(t *testing.T, e *env, c *redis.Client, key, other string) {
	t.Helper()
	ctx := lockclient.CtxFor(t, 10*time.Second)
	for i, d := range e.direct {
		if err := d.Del(ctx, keyPrefix+"lock:"+key).Err(); err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
	}
	if ok, err := c.SetNX(ctx, key, other, 20*time.Second).Result(); err != nil || !ok {
		t.Fatalf("the other client's SET NX PX: %v %v", ok, err)
	}
	e.requireOnEveryNode(t, "the other client's lock", key)
}

// TestWatchTransactionOnLockKeys: the optimistic lock release and
// extension that StackExchange.Redis (LockRelease, LockExtend), go-redis
// (Client.Watch) and redis-py write by hand, WATCH k, GET k, MULTI, DEL k
// (or PEXPIRE k ms), EXEC, release and extend the lock on the lock nodes,
// with and without an upstream; when the lock changed hands after WATCH,
// EXEC answers nil and the other holder's lock stays on every node.
// Before, WATCH of a lock key was unknown (no upstream) or refused (with
// one), and the DEL inside MULTI refused, so EXEC answered EXECABORT.
func TestWatchTransactionOnLockKeys(t *testing.T) {
	t.Parallel()
	withAndWithoutUpstream(t, func(t *testing.T, e *env, withUp bool) {
		c := e.client(t)
		other := e.client(t)
		ctx := lockclient.CtxFor(t, 60*time.Second)

		take := func(key, tok string) {
			t.Helper()
			if ok, err := c.SetNX(ctx, key, tok, 10*time.Second).Result(); err != nil || !ok {
				t.Fatalf("SET %s NX PX: %v %v", key, ok, err)
			}
			e.requireOnEveryNode(t, "the lock", key)
		}
		// go-redis's own optimistic release and extension.
		release := func(key, tok string, between func()) ([]redis.Cmder, error) {
			var cmds []redis.Cmder
			err := c.Watch(ctx, func(tx *redis.Tx) error {
				v, err := tx.Get(ctx, key).Result()
				if err != nil {
					return err
				}
				if v != tok {
					return fmt.Errorf("GET %s: %q; want %q", key, v, tok)
				}
				if between != nil {
					between()
				}
				cmds, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
					p.Del(ctx, key)
					return nil
				})
				return err
			}, key)
			return cmds, err
		}

		t.Run("go-redis release", func(t *testing.T) {
			take("lock:gr", "tok")
			cmds, err := release("lock:gr", "tok", nil)
			if err != nil {
				t.Fatalf("Watch: %v", err)
			}
			if n, err := cmds[0].(*redis.IntCmd).Result(); n != 1 || err != nil {
				t.Errorf("DEL in EXEC: %v %v; want 1", n, err)
			}
			e.requireGone(t, "released through WATCH/MULTI/EXEC", "lock:gr")
		})
		t.Run("go-redis extend", func(t *testing.T) {
			take("lock:ge", "tok")
			err := c.Watch(ctx, func(tx *redis.Tx) error {
				if v, err := tx.Get(ctx, "lock:ge").Result(); err != nil || v != "tok" {
					return fmt.Errorf("GET: %q %v", v, err)
				}
				cmds, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
					p.PExpire(ctx, "lock:ge", 40*time.Second)
					return nil
				})
				if err == nil && !cmds[0].(*redis.BoolCmd).Val() {
					err = errors.New("PEXPIRE in EXEC answered 0")
				}
				return err
			}, "lock:ge")
			if err != nil {
				t.Fatalf("Watch: %v", err)
			}
			for i, d := range e.direct {
				if ms := d.PTTL(ctx, keyPrefix+"lock:lock:ge").Val(); ms < 30*time.Second {
					t.Errorf("node %d: PTTL %v after the extension to 40 s", i, ms)
				}
			}
			e.requireHeld(t, "extended", "lock:ge", "tok")
		})
		t.Run("go-redis release after the lock was taken over", func(t *testing.T) {
			take("lock:gt", "tok")
			_, err := release("lock:gt", "tok", func() { retake(t, e, other, "lock:gt", "theirs") })
			if !errors.Is(err, redis.TxFailedErr) {
				t.Errorf("Watch: %v; want %v", err, redis.TxFailedErr)
			}
			if n := e.holding(t, "lock:gt", "theirs"); n != 3 {
				t.Errorf("the other client's lock is on %d of 3 nodes after the failed release; want 3", n)
			}
		})
		t.Run("StackExchange.Redis LockRelease and LockExtend, byte for byte", func(t *testing.T) {
			r := dialRaw(t, e.addr)
			take("lock:se", "tok")
			for _, st := range []struct{ args, want string }{
				{"WATCH lock:se", "+OK\r\n"},
				{"GET lock:se", "$3\r\ntok\r\n"},
				{"MULTI", "+OK\r\n"},
				{"PEXPIRE lock:se 30000", "+QUEUED\r\n"},
				{"EXEC", "*1\r\n:1\r\n"},
				{"WATCH lock:se", "+OK\r\n"},
				{"GET lock:se", "$3\r\ntok\r\n"},
				{"MULTI", "+OK\r\n"},
				{"EXPIRE lock:se 30", "+QUEUED\r\n"},
				{"EXEC", "*1\r\n:1\r\n"},
				{"WATCH lock:se", "+OK\r\n"},
				{"GET lock:se", "$3\r\ntok\r\n"},
				{"MULTI", "+OK\r\n"},
				{"DEL lock:se", "+QUEUED\r\n"},
				{"EXEC", "*1\r\n:1\r\n"},
				// The condition failed: the client unwatches.
				{"WATCH lock:se", "+OK\r\n"},
				{"GET lock:se", "$-1\r\n"},
				{"UNWATCH", "+OK\r\n"},
			} {
				if got := r.do(strings.Fields(st.args)...); got != st.want {
					t.Errorf("%s: %q; want %q", st.args, got, st.want)
				}
			}
			e.requireGone(t, "LockRelease", "lock:se")

			// Taken over between WATCH and EXEC: nil, RESP2 and RESP3.
			for _, proto := range []string{"2", "3"} {
				take("lock:se", "tok")
				r.do("HELLO", proto)
				r.do("WATCH", "lock:se")
				r.do("GET", "lock:se")
				retake(t, e, other, "lock:se", "theirs")
				r.do("MULTI")
				r.do("DEL", "lock:se")
				want := map[string]string{"2": "*-1\r\n", "3": "_\r\n"}[proto]
				if got := r.do("EXEC"); got != want {
					t.Errorf("RESP%s: EXEC after the lock was taken over: %q; want %q", proto, got, want)
				}
				if n := e.holding(t, "lock:se", "theirs"); n != 3 {
					t.Errorf("RESP%s: the other client's lock is on %d of 3 nodes; want 3", proto, n)
				}
				if err := other.Del(ctx, "lock:se").Err(); err != nil {
					t.Fatal(err)
				}
				e.requireGone(t, "the other's release", "lock:se")
			}
			r.do("HELLO", "2")

			// Expired (and not taken): nil, nothing changed.
			if ok, err := c.SetNX(ctx, "lock:sx", "tok", 300*time.Millisecond).Result(); err != nil || !ok {
				t.Fatalf("SET NX PX 300: %v %v", ok, err)
			}
			r.do("WATCH", "lock:sx")
			time.Sleep(600 * time.Millisecond)
			r.do("MULTI")
			r.do("PEXPIRE", "lock:sx", "10000")
			if got := r.do("EXEC"); got != "*-1\r\n" {
				t.Errorf("EXEC after the lock expired: %q; want nil", got)
			}
			e.requireGone(t, "an expired lock not extended", "lock:sx")
		})
		t.Run("a key watched while free", func(t *testing.T) {
			r := dialRaw(t, e.addr)
			for _, st := range []struct{ args, want string }{
				{"WATCH lock:free", "+OK\r\n"},
				{"MULTI", "+OK\r\n"},
				{"GET lock:free", "+QUEUED\r\n"},
				{"EXISTS lock:free", "+QUEUED\r\n"},
				{"DEL lock:free", "+QUEUED\r\n"},
				{"PTTL lock:free", "+QUEUED\r\n"},
				{"EXEC", "*4\r\n$-1\r\n:0\r\n:0\r\n:-2\r\n"},
			} {
				if got := r.do(strings.Fields(st.args)...); got != st.want {
					t.Errorf("%s: %q; want %q", st.args, got, st.want)
				}
			}
			r.do("WATCH", "lock:free")
			take("lock:free", "theirs")
			r.do("MULTI")
			r.do("DEL", "lock:free")
			if got := r.do("EXEC"); got != "*-1\r\n" {
				t.Errorf("EXEC after a key watched free was taken: %q; want nil", got)
			}
			if n := e.holding(t, "lock:free", "theirs"); n != 3 {
				t.Errorf("the lock taken after WATCH is on %d of 3 nodes; want 3", n)
			}
		})
		t.Run("several watched keys", func(t *testing.T) {
			r := dialRaw(t, e.addr)
			take("lock:m1", "t1")
			take("lock:m2", "t2")
			for _, st := range []struct{ args, want string }{
				{"WATCH lock:m1", "+OK\r\n"},
				{"WATCH lock:m2 lock:m1", "+OK\r\n"},
				{"MULTI", "+OK\r\n"},
				{"EXISTS lock:m1 lock:m2", "+QUEUED\r\n"},
				{"DEL lock:m1 lock:m2", "+QUEUED\r\n"},
				{"EXEC", "*2\r\n:2\r\n:2\r\n"},
			} {
				if got := r.do(strings.Fields(st.args)...); got != st.want {
					t.Errorf("%s: %q; want %q", st.args, got, st.want)
				}
			}
			e.requireGone(t, "released together", "lock:m1")
			e.requireGone(t, "released together", "lock:m2")
			// One of them changed: nothing runs, the other stays.
			take("lock:m1", "t1")
			take("lock:m2", "t2")
			r.do("WATCH", "lock:m1", "lock:m2")
			retake(t, e, other, "lock:m2", "theirs")
			r.do("MULTI")
			r.do("DEL", "lock:m1", "lock:m2")
			if got := r.do("EXEC"); got != "*-1\r\n" {
				t.Errorf("EXEC after one of two watched keys changed: %q; want nil", got)
			}
			if n := e.holding(t, "lock:m1", "t1"); n != 3 {
				t.Errorf("lock:m1 on %d of 3 nodes after the failed transaction; want 3", n)
			}
			if n := e.holding(t, "lock:m2", "theirs"); n != 3 {
				t.Errorf("the other's lock:m2 on %d of 3 nodes; want 3", n)
			}
		})
		t.Run("refusals and the state's end", func(t *testing.T) {
			r := dialRaw(t, e.addr)
			take("lock:rf", "tok")
			for _, st := range []struct{ args, want string }{
				{"WATCH lock:rf plain", "-ERR transparent mode: 'watch' mixes lock keys"},
				{"WATCH lock:rf", "+OK"},
				{"WATCH lock:rf lock:rf2", "+OK"},
				{"WATCH plain", "-ERR transparent mode: this connection watches lock keys"},
				{"EXEC", "-ERR EXEC without MULTI"},
				{"MULTI", "+OK"},
				{"MULTI", "-ERR MULTI calls can not be nested"},
				{"WATCH lock:rf", "-ERR WATCH inside MULTI is not allowed"},
				{"SET lock:rf x", "-ERR 'set' is not queued: a transaction after WATCH of lock keys"},
				{"DEL lock:rf", "+QUEUED"},
				{"EXEC", "-EXECABORT Transaction discarded because of previous errors."},
				{"GET lock:rf", "$3\r\ntok"},
				{"WATCH lock:rf", "+OK"},
				{"MULTI", "+OK"},
				{"DEL lock:other", "-ERR 'del' is not queued"},
				{"PEXPIRE lock:rf 10 XX LT", "+QUEUED"},
				{"PEXPIRE lock:rf 10 NX XX", "+QUEUED"}, // its error is its reply in EXEC's, as in Redis
				{"PING", "+QUEUED"},                     // keyless: queued as in Redis (TestWatchTxKeylessCommandsAsRedis)
				{"INCR lock:rf", "-ERR 'incr' is not queued"},
				{"DISCARD", "+OK"},
				{"MULTI", "+OK"},
				{"EXEC", "*0"},
				{"UNWATCH", "+OK"}, // nothing watched: OK, as Redis
				// An empty transaction runs when the watch holds.
				{"WATCH lock:rf", "+OK"},
				{"MULTI", "+OK"},
				{"EXEC", "*0\r\n"},
				{"WATCH lock:rf", "+OK"},
				{"UNWATCH", "+OK"},
				{"WATCH lock:rf", "+OK"},
				{"RESET", "+RESET"},
				{"GET lock:rf", "$3\r\ntok"},
			} {
				got := r.do(strings.Fields(st.args)...)
				if !strings.HasPrefix(got, st.want) {
					t.Errorf("%s: %q; want %q…", st.args, got, st.want)
				}
			}
			e.requireHeld(t, "after the refused and discarded transactions", "lock:rf", "tok")
			if n := e.holding(t, "lock:rf", "tok"); n != 3 {
				t.Errorf("lock:rf on %d of 3 nodes; want 3", n)
			}
		})
	})
}

// TestWatchTransactionWithUpstreamKeepsUpstreamWatch: a WATCH of lock keys
// and one of the upstream's keys cannot share a connection, either way
// round; the upstream's own WATCH/MULTI/EXEC still work as before, also
// on a connection that watched lock keys before.
func TestWatchTransactionWithUpstreamKeepsUpstreamWatch(t *testing.T) {
	t.Parallel()
	e, c, upc := startWithUpstream(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)
	if err := upc.Set(ctx, "plain", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	r := dialRaw(t, e.addr)
	for _, st := range []struct{ args, want string }{
		{"WATCH plain", "+OK"},
		{"WATCH lock:u", "-ERR transparent mode: this connection already watches keys on the upstream"},
		{"MULTI", "+OK"},
		{"INCR plain", "+QUEUED"},
		{"EXEC", "*1\r\n:2"},
		{"WATCH lock:u", "+OK"},
		{"WATCH plain", "-ERR transparent mode: this connection watches lock keys"},
		{"UNWATCH", "+OK"},
		{"WATCH plain", "+OK"},
		{"MULTI", "+OK"},
		{"INCR plain", "+QUEUED"},
		{"EXEC", "*1\r\n:3"},
		{"MULTI", "+OK"},
		{"DEL lock:u", "-ERR 'DEL' on a lock key is not allowed inside MULTI"},
		{"EXEC", "-EXECABORT"},
	} {
		got := r.do(strings.Fields(st.args)...)
		if !strings.HasPrefix(got, st.want) {
			t.Errorf("%s: %q; want %q…", st.args, got, st.want)
		}
	}
	// Subscribed after a WATCH of a lock key: in pub/sub mode the
	// transaction commands are refused as always; after it the watch
	// still holds.
	c2 := e.client(t)
	if ok, err := c2.SetNX(ctx, "lock:u2", "tok", 10*time.Second).Result(); err != nil || !ok {
		t.Fatalf("SET NX PX: %v %v", ok, err)
	}
	e.requireOnEveryNode(t, "the lock", "lock:u2")
	for _, st := range []struct{ args, want string }{
		{"WATCH lock:u2", "+OK"},
		{"SUBSCRIBE ch", "*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1"},
		{"MULTI", "-ERR 'multi' is not allowed in pub/sub mode"},
		{"UNSUBSCRIBE ch", "*3\r\n$11\r\nunsubscribe\r\n$2\r\nch\r\n:0"},
		{"MULTI", "+OK"},
		{"DEL lock:u2", "+QUEUED"},
		{"EXEC", "*1\r\n:1\r\n"},
	} {
		got := r.do(strings.Fields(st.args)...)
		if !strings.HasPrefix(got, st.want) {
			t.Errorf("%s: %q; want %q…", st.args, got, st.want)
		}
	}
	e.requireGone(t, "released after the subscription", "lock:u2")

	// An upstream WATCH broken by another client still fails its EXEC.
	err := c.Watch(ctx, func(tx *redis.Tx) error {
		if err := upc.Set(ctx, "plain", "9", 0).Err(); err != nil {
			return err
		}
		_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Incr(ctx, "plain")
			return nil
		})
		return err
	}, "plain")
	if !errors.Is(err, redis.TxFailedErr) {
		t.Errorf("upstream WATCH broken before EXEC: %v; want %v", err, redis.TxFailedErr)
	}
}

// TestRedisPyWatchTransaction runs redis-py's documented optimistic
// transaction on a lock key (python/redispy_watch.py): extend, release,
// and WatchError when the lock was taken over after WATCH, the other
// holder's lock then intact on every node.
func TestRedisPyWatchTransaction(t *testing.T) {
	t.Parallel()
	py := python(t)
	script, err := filepath.Abs("python/redispy_watch.py")
	if err != nil {
		t.Fatal(err)
	}
	e := start(t)
	if out := runScript(t, 60*time.Second, py, script, e.port(), e.nodePorts()); !strings.Contains(out, "ok") {
		t.Fatalf("redispy_watch.py: %s", out)
	}
}

// watchTx runs WATCH key, MULTI, the command, EXEC on r, checking the
// replies before EXEC's, and returns EXEC's reply.
func watchTx(t *testing.T, r *rawConn, key string, cmd ...string) string {
	t.Helper()
	for _, st := range [][]string{{"WATCH", key}, {"MULTI"}, cmd} {
		want := "+OK\r\n"
		if st[0] != "WATCH" && st[0] != "MULTI" {
			want = "+QUEUED\r\n"
		}
		if got := r.do(st...); got != want {
			t.Fatalf("%v: %q; want %q", st, got, want)
		}
	}
	return r.do("EXEC")
}

// TestWatchTransactionReleaseIsAnUnlock: a DEL in a lock-key transaction
// releases as the transparent compare-and-delete does, with lockproxy's
// bookkeeping: a reentrant LOCK's extra holds go with it (a later LOCK of
// the token has one hold), the release is published to LOCK … WAIT
// waiters, and a waiter gets the lock; a PEXPIRE renews the
// whole hold, as RENEW does, so one UNLOCK of a token holding it twice
// leaves it held past the first TTL.
func TestWatchTransactionReleaseIsAnUnlock(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := redis.NewClient(&redis.Options{Addr: e.addr, Protocol: 2}) // LOCKINFO as a flat array
	t.Cleanup(func() { _ = c.Close() })
	waiter := e.client(t)
	ctx := lockclient.CtxFor(t, 60*time.Second)
	r := dialRaw(t, e.addr)

	const key = "lock:wtx:reentrant"
	for i := 0; i < 2; i++ {
		if err := c.Do(ctx, "LOCK", key, "PX", 10000, "TOKEN", "dt").Err(); err != nil {
			t.Fatal(err)
		}
	}
	e.requireOnEveryNode(t, "LOCK", key)
	publishes := func() (n []int64) {
		for _, d := range e.direct {
			cs, err := d.Info(ctx, "commandstats").Result()
			if err != nil {
				t.Fatal(err)
			}
			var calls int64
			for _, l := range strings.Split(cs, "\n") {
				if strings.HasPrefix(l, "cmdstat_publish:calls=") {
					calls, _ = strconv.ParseInt(strings.TrimPrefix(strings.SplitN(l, ",", 2)[0], "cmdstat_publish:calls="), 10, 64)
				}
			}
			n = append(n, calls)
		}
		return n
	}
	got := make(chan time.Time, 1)
	go func() {
		if err := waiter.Do(ctx, "LOCK", key, "PX", 5000, "WAIT", 20000).Err(); err != nil {
			t.Errorf("the waiter's LOCK … WAIT: %v", err)
		}
		got <- time.Now()
	}()
	time.Sleep(300 * time.Millisecond) // the waiter is waiting
	before := publishes()
	start := time.Now()
	if reply := watchTx(t, r, key, "DEL", key); reply != "*1\r\n:1\r\n" {
		t.Fatalf("EXEC of the release: %q; want *1 :1", reply)
	}
	// Announced where the waiter's instance listens (a node publishes only
	// on channels someone subscribes to there); a node that answered after
	// the fan-out's timeout (a loaded test machine) runs it a moment later.
	sum := func(n []int64) (s int64) {
		for _, x := range n {
			s += x
		}
		return s
	}
	for deadline := time.Now().Add(3 * time.Second); sum(publishes()) <= sum(before); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("the release was published on no node (PUBLISH calls %v before and after)", before)
			break
		}
	}
	select {
	case at := <-got:
		t.Logf("the waiter got the lock %v after EXEC", at.Sub(start).Round(time.Millisecond))
	case <-time.After(15 * time.Second):
		t.Fatal("the waiter did not get the lock")
	}

	// No extra holds left: a LOCK of the token after the release has
	// one hold.
	const key2 = "lock:wtx:holds"
	for i := 0; i < 2; i++ {
		if err := c.Do(ctx, "LOCK", key2, "PX", 10000, "TOKEN", "dt").Err(); err != nil {
			t.Fatal(err)
		}
	}
	e.requireOnEveryNode(t, "LOCK", key2)
	if reply := watchTx(t, r, key2, "DEL", key2); reply != "*1\r\n:1\r\n" {
		t.Fatalf("EXEC of the release: %q", reply)
	}
	if err := c.Do(ctx, "LOCK", key2, "PX", 10000, "TOKEN", "dt").Err(); err != nil {
		t.Fatal(err)
	}
	if holds, _ := lockInfoHolds(ctx, t, c, key2, "dt"); holds != 1 {
		t.Errorf("LOCKINFO holds after the transaction's DEL and a new LOCK = %d; want 1", holds)
	}

	// The extension renews the whole hold.
	const key3 = "lock:wtx:renew"
	for i := 0; i < 2; i++ {
		if err := c.Do(ctx, "LOCK", key3, "PX", 1500, "TOKEN", "rt").Err(); err != nil {
			t.Fatal(err)
		}
	}
	if reply := watchTx(t, r, key3, "PEXPIRE", key3, "20000"); reply != "*1\r\n:1\r\n" {
		t.Fatalf("EXEC of the extension: %q", reply)
	}
	time.Sleep(2 * time.Second) // past the first TTL
	if err := c.Do(ctx, "UNLOCK", key3, "rt").Err(); err != nil {
		t.Fatal(err)
	}
	if ok, err := c.SetNX(ctx, key3, "other", 5*time.Second).Result(); err != nil || ok {
		t.Errorf("SET NX PX after one of two holds' UNLOCK, past the first TTL: %v %v; want nil (still held)", ok, err)
	}
}

// TestWatchTransactionLeavesOtherValuesOnNodes: EXEC runs the queued
// commands on a node only where the watched key still has the value WATCH
// saw, so a node where another value is held keeps it, whatever a
// majority decides: released on the majority holding the watched value,
// nil when a majority changed (the minority still holding the watched
// value, the client's own, released there), an error when no majority
// agrees.
func TestWatchTransactionLeavesOtherValuesOnNodes(t *testing.T) {
	t.Parallel()
	e := start(t)
	ctx := lockclient.CtxFor(t, 60*time.Second)
	r := dialRaw(t, e.addr)
	set := func(key string, vals ...string) {
		t.Helper()
		for i, v := range vals {
			if err := e.direct[i].Set(ctx, keyPrefix+"lock:"+key, v, 20*time.Second).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	onNode := func(i int, key string) string {
		v, _ := e.direct[i].Get(ctx, keyPrefix+"lock:"+key).Result()
		return v
	}

	// A majority holds v, one node w: released where v was.
	set("lock:n1", "w", "v", "v")
	if reply := watchTx(t, r, "lock:n1", "DEL", "lock:n1"); reply != "*1\r\n:1\r\n" {
		t.Errorf("EXEC with v on 2 of 3: %q; want *1 :1", reply)
	}
	if got := []string{onNode(0, "lock:n1"), onNode(1, "lock:n1"), onNode(2, "lock:n1")}; got[0] != "w" || got[1] != "" || got[2] != "" {
		t.Errorf("after the release the nodes hold %q; want [w, none, none]", got)
	}

	// Watched as v everywhere, then w on two: nil; w stays.
	set("lock:n2", "v", "v", "v")
	r.do("WATCH", "lock:n2")
	set("lock:n2", "v", "w", "w")
	r.do("MULTI")
	r.do("PEXPIRE", "lock:n2", "60000")
	if reply := r.do("EXEC"); reply != "*-1\r\n" {
		t.Errorf("EXEC with w on 2 of 3: %q; want nil", reply)
	}
	for i := 1; i < 3; i++ {
		if v := onNode(i, "lock:n2"); v != "w" {
			t.Errorf("node %d: %q; want w", i, v)
		}
		if ms := e.direct[i].PTTL(ctx, keyPrefix+"lock:lock:n2").Val(); ms > 21*time.Second {
			t.Errorf("node %d: the other value's TTL was extended to %v", i, ms)
		}
	}

	// Watched as v, then w on one node and another down: no majority.
	set("lock:n3", "v", "v", "v")
	r.do("WATCH", "lock:n3")
	set("lock:n3", "v", "w")
	e.nodes[2].Kill()
	r.do("MULTI")
	r.do("DEL", "lock:n3")
	if reply := r.do("EXEC"); !strings.HasPrefix(reply, "-ERR no majority") && !strings.HasPrefix(reply, "-NOQUORUM") {
		t.Errorf("EXEC with v on 1, w on 1, 1 down: %q; want an error", reply)
	}
	if v := onNode(1, "lock:n3"); v != "w" {
		t.Errorf("node 1: %q; want w", v)
	}

	// A WATCH that cannot read its key from a majority answers the error,
	// and the transaction after it does not run.
	set("lock:n4", "v")
	e.nodes[1].Kill()
	if got := r.do("WATCH", "lock:n4"); !strings.HasPrefix(got, "-NOQUORUM") {
		t.Errorf("WATCH with 2 of 3 nodes down: %q; want NOQUORUM", got)
	}
	r.do("MULTI")
	r.do("DEL", "lock:n4")
	if got := r.do("EXEC"); !strings.HasPrefix(got, "-ERR transparent mode: the WATCH of lock key 'lock:n4' could not read it from the lock nodes (NOQUORUM") {
		t.Errorf("EXEC after a failed WATCH: %q; want the WATCH's failure", got)
	}
	if v := onNode(0, "lock:n4"); v != "v" {
		t.Errorf("node 0 after a transaction that did not run: %q; want v", v)
	}
}

// TestLockTransactionStaysOffTheEventLoop: the commands of a lock-key
// transaction are answered by lockproxy, never relayed, however many
// there are: a connection that could go back to the event loop (16
// batches the loop could serve in a row) would have its relayable
// commands relayed there, past the transaction.
func TestLockTransactionStaysOffTheEventLoop(t *testing.T) {
	t.Parallel()
	e, _, upc := startWithUpstream(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)
	if err := upc.Set(ctx, "plain", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	r := dialRaw(t, e.addr)
	// Relayed once: lockproxy reads the upstream's command table, which
	// the event loop needs.
	if got := r.do("GET", "plain"); got != "$1\r\n1\r\n" {
		t.Fatalf("GET plain: %q", got)
	}
	r.do("WATCH", "lock:loop")
	r.do("MULTI")
	for i := 0; i < 24; i++ {
		if got := r.do("GET", "plain"); !strings.HasPrefix(got, "-ERR 'get' is not queued") {
			t.Fatalf("GET plain #%d inside the lock-key transaction: %q; want refused", i+1, got)
		}
	}
	if got := r.do("EXEC"); !strings.HasPrefix(got, "-EXECABORT") {
		t.Errorf("EXEC: %q; want EXECABORT", got)
	}
}
