// Package suite is the end-to-end suite both lock backends run: the same
// commands through a real lockproxy binary and go-redis, with the same
// expected replies, whether the locks come from RedLock over Redis nodes
// (test/e2e) or from ZooKeeper (test/zk). Each backend's own package adds
// the tests only it can run (node faults, sessions).
package suite

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Start starts a lockproxy for one test and returns its RESP address.
type Start func(t *testing.T) string

// Run runs every scenario against lockproxies made by start.
func Run(t *testing.T, start Start) {
	addr := start(t)
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			for _, proto := range []int{2, 3} {
				c := client(t, addr, proto)
				sc.run(t, c, addr, fmt.Sprintf("suite-%s-%d-%d", strings.ReplaceAll(sc.name, " ", "-"), proto, time.Now().UnixNano()))
			}
		})
	}
}

var scenarios = []struct {
	name string
	run  func(t *testing.T, c *redis.Client, addr, key string)
}{
	{"lock, contend, unlock", func(t *testing.T, c *redis.Client, _, key string) {
		g := mustLock(t, c, key, "PX", 10000)
		if g.validity <= 0 || g.validity > 10000 || g.fence <= 0 || g.token == "" {
			t.Errorf("LOCK = %+v; want a token, 0 < validity_ms ≤ 10000, a fence", g)
		}
		if _, ok := lock(t, c, key, "PX", 10000); ok {
			t.Errorf("second LOCK granted; want nil")
		}
		if n := intCmd(t, c, "UNLOCK", key, g.token); n != 1 {
			t.Errorf("UNLOCK = %d; want 1", n)
		}
		if n := intCmd(t, c, "UNLOCK", key, g.token); n != 0 {
			t.Errorf("second UNLOCK = %d; want 0", n)
		}
		if n := intCmd(t, c, "RENEW", key, g.token, "PX", 1000); n != 0 {
			t.Errorf("RENEW after UNLOCK = %d; want 0", n)
		}
	}},
	{"renew", func(t *testing.T, c *redis.Client, _, key string) {
		g := mustLock(t, c, key, "PX", 5000)
		if v := intCmd(t, c, "RENEW", key, g.token, "PX", 20000); v <= 5000 || v > 20000 {
			t.Errorf("RENEW PX 20000 = %d; want in (5000, 20000]", v)
		}
		if v := intCmd(t, c, "RENEW", key, "not-the-token", "PX", 20000); v != 0 {
			t.Errorf("RENEW by another token = %d; want 0", v)
		}
		intCmd(t, c, "UNLOCK", key, g.token)
	}},
	{"fences increase", func(t *testing.T, c *redis.Client, _, key string) {
		var prev int64
		for i := 0; i < 20; i++ {
			g := mustLock(t, c, key, "PX", 10000)
			if g.fence <= prev {
				t.Fatalf("grant %d: fence %d; want > %d", i, g.fence, prev)
			}
			prev = g.fence
			intCmd(t, c, "UNLOCK", key, g.token)
		}
	}},
	{"wait woken by unlock", func(t *testing.T, c *redis.Client, _, key string) {
		g := mustLock(t, c, key, "PX", 30000)
		got := make(chan error, 1)
		var unlocked time.Time
		go func() {
			_, ok, err := tryLock(ctxFor(t, 15*time.Second), c, key, "PX", 10000, "WAIT", 10000)
			if err == nil && !ok {
				err = fmt.Errorf("LOCK … WAIT 10000 = nil")
			}
			got <- err
		}()
		time.Sleep(300 * time.Millisecond)
		select {
		case err := <-got:
			t.Fatalf("the waiter returned while the lock was held: %v", err)
		default:
		}
		unlocked = time.Now()
		intCmd(t, c, "UNLOCK", key, g.token)
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		if d := time.Since(unlocked); d > 5*time.Second {
			t.Errorf("the waiter was granted %v after the UNLOCK; want it woken, not left to its deadline", d)
		}
	}},
	{"reentrancy", func(t *testing.T, c *redis.Client, _, key string) {
		first := mustLock(t, c, key, "PX", 10000, "TOKEN", "tok-"+key)
		again := mustLock(t, c, key, "PX", 10000, "TOKEN", "tok-"+key)
		if again.fence != first.fence {
			t.Errorf("reentrant fence %d; want the hold's %d", again.fence, first.fence)
		}
		if info := lockInfo(t, c, key, "tok-"+key); info.holds != 2 || info.mode != "write" {
			t.Errorf("LOCKINFO = %+v; want mode write, 2 holds", info)
		}
		for i, want := range []int64{1, 1, 0} {
			if n := intCmd(t, c, "UNLOCK", key, "tok-"+key); n != want {
				t.Errorf("UNLOCK %d = %d; want %d", i+1, n, want)
			}
		}
	}},
	{"read locks", func(t *testing.T, c *redis.Client, _, key string) {
		mustAcquire(t, c, "RLOCK", key, "PX", 10000, "TOKEN", "r1")
		mustAcquire(t, c, "RLOCK", key, "PX", 10000, "TOKEN", "r2")
		if _, ok := lock(t, c, key, "PX", 10000); ok {
			t.Errorf("LOCK granted while readers hold; want nil")
		}
		if info := lockInfo(t, c, key, ""); info.mode != "read" || info.holders != 2 {
			t.Errorf("LOCKINFO = %+v; want mode read, 2 holders", info)
		}
		intCmd(t, c, "UNLOCK", key, "r1")
		intCmd(t, c, "UNLOCK", key, "r2")
		g := mustLock(t, c, key, "PX", 10000)
		if _, ok, _ := tryAcquire(ctxFor(t, 10*time.Second), c, "RLOCK", key, "PX", 10000); ok {
			t.Errorf("RLOCK granted while a writer holds; want nil")
		}
		intCmd(t, c, "UNLOCK", key, g.token)
	}},
	{"downgrade, upgrade refused", func(t *testing.T, c *redis.Client, _, key string) {
		mustLock(t, c, key, "PX", 10000, "TOKEN", "a")
		mustAcquire(t, c, "RLOCK", key, "PX", 10000, "TOKEN", "a")
		if _, ok, _ := tryAcquire(ctxFor(t, 10*time.Second), c, "RLOCK", key, "PX", 10000, "TOKEN", "b"); ok {
			t.Errorf("another reader granted while the downgrading writer still holds; want nil")
		}
		if n := intCmd(t, c, "UNLOCK", key, "a"); n != 1 {
			t.Fatalf("UNLOCK of the write hold = %d; want 1", n)
		}
		mustAcquire(t, c, "RLOCK", key, "PX", 10000, "TOKEN", "b")
		_, _, err := tryAcquire(ctxFor(t, 10*time.Second), c, "LOCK", key, "PX", 10000, "TOKEN", "b")
		if err == nil || !strings.Contains(err.Error(), "upgrade refused") {
			t.Errorf("LOCK by a reader = %v; want -ERR upgrade refused", err)
		}
		intCmd(t, c, "UNLOCK", key, "a")
		intCmd(t, c, "UNLOCK", key, "b")
	}},
	{"lockinfo", func(t *testing.T, c *redis.Client, _, key string) {
		if v, err := c.Do(ctxFor(t, 10*time.Second), "LOCKINFO", key).Result(); err != redis.Nil {
			t.Errorf("LOCKINFO of a free key = %v, %v; want nil", v, err)
		}
		g := mustLock(t, c, key, "PX", 10000, "TOKEN", "owner-"+key)
		hidden := lockInfo(t, c, key, "")
		shown := lockInfo(t, c, key, "owner-"+key)
		if !strings.HasPrefix(hidden.token, "sha256:") || shown.token != "owner-"+key {
			t.Errorf("tokens shown %q (no TOKEN) and %q (own TOKEN); want a sha256: digest, then the token", hidden.token, shown.token)
		}
		if shown.fence != g.fence || shown.ttl <= 0 || shown.ttl > 10000 {
			t.Errorf("LOCKINFO = %+v; want fence %d and 0 < ttl_ms ≤ 10000", shown, g.fence)
		}
		intCmd(t, c, "UNLOCK", key, g.token)
	}},
	{"keepalive released on close", func(t *testing.T, c *redis.Client, addr, key string) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "*5\r\n$4\r\nLOCK\r\n$%d\r\n%s\r\n$2\r\nPX\r\n$5\r\n30000\r\n$9\r\nKEEPALIVE\r\n", len(key), key)
		buf := make([]byte, 512)
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := conn.Read(buf); err != nil || !strings.Contains(string(buf[:n]), "token") {
			t.Fatalf("LOCK … KEEPALIVE = %q, %v; want a grant", buf[:n], err)
		}
		closed := time.Now()
		conn.Close()
		g, ok, err := tryLock(ctxFor(t, 15*time.Second), c, key, "PX", 10000, "WAIT", 10000)
		if err != nil || !ok {
			t.Fatalf("LOCK … WAIT after the holder left = %v, %v", ok, err)
		}
		if d := time.Since(closed); d > 5*time.Second {
			t.Errorf("granted %v after the holder's connection closed; want at once, not at the 30 s lease", d)
		}
		intCmd(t, c, "UNLOCK", key, g.token)
	}},
	{"bad input", func(t *testing.T, c *redis.Client, _, key string) {
		for _, tc := range []struct {
			args []any
			want string
		}{
			{[]any{"LOCK"}, "wrong number of arguments"},
			{[]any{"LOCK", key, "PX", "abc"}, "not an integer"},
			{[]any{"LOCK", key, "PX", 0}, "invalid expire time"},
			{[]any{"RENEW", key, "t", "PX", -5}, "invalid expire time"},
			{[]any{"LOCK", key, "PX", 100, "BOGUS", 1}, "syntax error"},
			{[]any{"UNLOCK", key}, "wrong number of arguments"},
			{[]any{"LOCKINFO", key, "TOKEN"}, "syntax error"},
		} {
			err := c.Do(ctxFor(t, 10*time.Second), tc.args...).Err()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v = %v; want an error containing %q", tc.args, err, tc.want)
			}
		}
		if err := c.Ping(ctxFor(t, 10*time.Second)).Err(); err != nil {
			t.Errorf("PING after bad input: %v", err)
		}
	}},
}

// grant is a LOCK or RLOCK reply.
type grant struct {
	token    string
	validity int64
	fence    int64
}

// info is the part of a LOCKINFO reply the scenarios check (the first
// holder only).
type info struct {
	mode    string
	holders int
	token   string
	holds   int64
	ttl     int64
	fence   int64
}

func client(t *testing.T, addr string, proto int) *redis.Client {
	c := redis.NewClient(&redis.Options{
		Addr: addr, Protocol: proto, MaxRetries: -1, DisableIdentity: true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// pairs reads a map reply: a RESP3 map or a RESP2 flat array.
func pairs(v any) (map[string]any, error) {
	switch v := v.(type) {
	case map[any]any:
		m := map[string]any{}
		for k, x := range v {
			m[fmt.Sprint(k)] = x
		}
		return m, nil
	case []any:
		if len(v)%2 != 0 {
			return nil, fmt.Errorf("odd flat map %v", v)
		}
		m := map[string]any{}
		for i := 0; i < len(v); i += 2 {
			m[fmt.Sprint(v[i])] = v[i+1]
		}
		return m, nil
	}
	return nil, fmt.Errorf("not a map: %T %v", v, v)
}

func tryAcquire(ctx context.Context, c *redis.Client, cmd, key string, opts ...any) (grant, bool, error) {
	v, err := c.Do(ctx, append([]any{cmd, key}, opts...)...).Result()
	if err == redis.Nil {
		return grant{}, false, nil
	}
	if err != nil {
		return grant{}, false, err
	}
	m, err := pairs(v)
	if err != nil {
		return grant{}, false, err
	}
	g := grant{token: fmt.Sprint(m["token"])}
	g.validity, _ = m["validity_ms"].(int64)
	g.fence, _ = m["fence"].(int64)
	return g, true, nil
}

func tryLock(ctx context.Context, c *redis.Client, key string, opts ...any) (grant, bool, error) {
	return tryAcquire(ctx, c, "LOCK", key, opts...)
}

func lock(t *testing.T, c *redis.Client, key string, opts ...any) (grant, bool) {
	t.Helper()
	g, ok, err := tryLock(ctxFor(t, 15*time.Second), c, key, opts...)
	if err != nil {
		t.Fatalf("LOCK %s %v: %v", key, opts, err)
	}
	return g, ok
}

func mustLock(t *testing.T, c *redis.Client, key string, opts ...any) grant {
	t.Helper()
	return mustAcquire(t, c, "LOCK", key, opts...)
}

func mustAcquire(t *testing.T, c *redis.Client, cmd, key string, opts ...any) grant {
	t.Helper()
	g, ok, err := tryAcquire(ctxFor(t, 15*time.Second), c, cmd, key, opts...)
	if err != nil || !ok {
		t.Fatalf("%s %s %v = %v, %v; want a grant", cmd, key, opts, ok, err)
	}
	return g
}

func intCmd(t *testing.T, c *redis.Client, args ...any) int64 {
	t.Helper()
	n, err := c.Do(ctxFor(t, 15*time.Second), args...).Int64()
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return n
}

func lockInfo(t *testing.T, c *redis.Client, key, token string) info {
	t.Helper()
	args := []any{"LOCKINFO", key}
	if token != "" {
		args = append(args, "TOKEN", token)
	}
	v, err := c.Do(ctxFor(t, 15*time.Second), args...).Result()
	if err != nil {
		t.Fatalf("LOCKINFO %s: %v", key, err)
	}
	m, err := pairs(v)
	if err != nil {
		t.Fatalf("LOCKINFO %s: %v", key, err)
	}
	in := info{mode: fmt.Sprint(m["mode"])}
	in.ttl, _ = m["ttl_ms"].(int64)
	in.fence, _ = m["fence"].(int64)
	hs, _ := m["holders"].([]any)
	in.holders = len(hs)
	if len(hs) > 0 {
		h, err := pairs(hs[0])
		if err != nil {
			t.Fatalf("LOCKINFO %s holder: %v", key, err)
		}
		in.token = fmt.Sprint(h["token"])
		in.holds, _ = h["holds"].(int64)
	}
	return in
}
