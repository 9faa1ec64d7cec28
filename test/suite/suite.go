//go:build linux

// Package suite is the end-to-end suite both lock backends run: the same
// commands through a real lockproxy binary and go-redis, with the same
// expected replies, whether the locks come from RedLock over Redis nodes
// (test/e2e) or from ZooKeeper (test/zk). Each backend's own package adds
// the tests only it can run (node faults, sessions).
package suite

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// lc is the suite's lock-client helpers: every reply waited for up to
// 15 s, go-redis's defaults for its clients.
var lc = lockclient.Config{AcquireTimeout: 15 * time.Second, CommandTimeout: 15 * time.Second}

// Start starts a lockproxy for one test and returns its RESP address.
type Start func(t *testing.T) string

// Run runs every scenario against lockproxies made by start.
func Run(t *testing.T, start Start) {
	addr := start(t)
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			for _, proto := range []int{2, 3} {
				c := lc.NewClient(t, addr, proto)
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
		g := lc.MustLock(t, c, key, "PX", 10000)
		if g.ValidityMS <= 0 || g.ValidityMS > 10000 || g.Fence <= 0 || g.Token == "" {
			t.Errorf("LOCK = %+v; want a token, 0 < validity_ms ≤ 10000, a fence", g)
		}
		if _, ok := lc.Lock(t, c, key, "PX", 10000); ok {
			t.Errorf("second LOCK granted; want nil")
		}
		if n := lc.IntCmd(t, c, "UNLOCK", key, g.Token); n != 1 {
			t.Errorf("UNLOCK = %d; want 1", n)
		}
		if n := lc.IntCmd(t, c, "UNLOCK", key, g.Token); n != 0 {
			t.Errorf("second UNLOCK = %d; want 0", n)
		}
		if n := lc.IntCmd(t, c, "RENEW", key, g.Token, "PX", 1000); n != 0 {
			t.Errorf("RENEW after UNLOCK = %d; want 0", n)
		}
	}},
	{"renew", func(t *testing.T, c *redis.Client, _, key string) {
		g := lc.MustLock(t, c, key, "PX", 5000)
		if v := lc.IntCmd(t, c, "RENEW", key, g.Token, "PX", 20000); v <= 5000 || v > 20000 {
			t.Errorf("RENEW PX 20000 = %d; want in (5000, 20000]", v)
		}
		if v := lc.IntCmd(t, c, "RENEW", key, "not-the-token", "PX", 20000); v != 0 {
			t.Errorf("RENEW by another token = %d; want 0", v)
		}
		lc.IntCmd(t, c, "UNLOCK", key, g.Token)
	}},
	{"fences increase", func(t *testing.T, c *redis.Client, _, key string) {
		var prev int64
		for i := 0; i < 20; i++ {
			g := lc.MustLock(t, c, key, "PX", 10000)
			if g.Fence <= prev {
				t.Fatalf("grant %d: fence %d; want > %d", i, g.Fence, prev)
			}
			prev = g.Fence
			lc.IntCmd(t, c, "UNLOCK", key, g.Token)
		}
	}},
	{"wait woken by unlock", func(t *testing.T, c *redis.Client, _, key string) {
		g := lc.MustLock(t, c, key, "PX", 30000)
		got := make(chan error, 1)
		var unlocked time.Time
		go func() {
			_, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 15*time.Second), c, key, "PX", 10000, "WAIT", 10000)
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
		lc.IntCmd(t, c, "UNLOCK", key, g.Token)
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		if d := time.Since(unlocked); d > 5*time.Second {
			t.Errorf("the waiter was granted %v after the UNLOCK; want it woken, not left to its deadline", d)
		}
	}},
	{"reentrancy", func(t *testing.T, c *redis.Client, _, key string) {
		first := lc.MustLock(t, c, key, "PX", 10000, "TOKEN", "tok-"+key)
		again := lc.MustLock(t, c, key, "PX", 10000, "TOKEN", "tok-"+key)
		if again.Fence != first.Fence {
			t.Errorf("reentrant fence %d; want the hold's %d", again.Fence, first.Fence)
		}
		if info := lockInfo(t, c, key, "tok-"+key); info.holds != 2 || info.mode != "write" {
			t.Errorf("LOCKINFO = %+v; want mode write, 2 holds", info)
		}
		for i, want := range []int64{1, 1, 0} {
			if n := lc.IntCmd(t, c, "UNLOCK", key, "tok-"+key); n != want {
				t.Errorf("UNLOCK %d = %d; want %d", i+1, n, want)
			}
		}
	}},
	{"read locks", func(t *testing.T, c *redis.Client, _, key string) {
		lc.MustAcquire(t, c, "RLOCK", key, "PX", 10000, "TOKEN", "r1")
		lc.MustAcquire(t, c, "RLOCK", key, "PX", 10000, "TOKEN", "r2")
		if _, ok := lc.Lock(t, c, key, "PX", 10000); ok {
			t.Errorf("LOCK granted while readers hold; want nil")
		}
		if info := lockInfo(t, c, key, ""); info.mode != "read" || info.holders != 2 {
			t.Errorf("LOCKINFO = %+v; want mode read, 2 holders", info)
		}
		lc.IntCmd(t, c, "UNLOCK", key, "r1")
		lc.IntCmd(t, c, "UNLOCK", key, "r2")
		g := lc.MustLock(t, c, key, "PX", 10000)
		if _, ok, _ := lockclient.TryAcquire(lockclient.CtxFor(t, 10*time.Second), c, "RLOCK", key, "PX", 10000); ok {
			t.Errorf("RLOCK granted while a writer holds; want nil")
		}
		lc.IntCmd(t, c, "UNLOCK", key, g.Token)
	}},
	{"downgrade, upgrade refused", func(t *testing.T, c *redis.Client, _, key string) {
		lc.MustLock(t, c, key, "PX", 10000, "TOKEN", "a")
		lc.MustAcquire(t, c, "RLOCK", key, "PX", 10000, "TOKEN", "a")
		if _, ok, _ := lockclient.TryAcquire(lockclient.CtxFor(t, 10*time.Second), c, "RLOCK", key, "PX", 10000, "TOKEN", "b"); ok {
			t.Errorf("another reader granted while the downgrading writer still holds; want nil")
		}
		if n := lc.IntCmd(t, c, "UNLOCK", key, "a"); n != 1 {
			t.Fatalf("UNLOCK of the write hold = %d; want 1", n)
		}
		lc.MustAcquire(t, c, "RLOCK", key, "PX", 10000, "TOKEN", "b")
		_, _, err := lockclient.TryAcquire(lockclient.CtxFor(t, 10*time.Second), c, "LOCK", key, "PX", 10000, "TOKEN", "b")
		if err == nil || !strings.Contains(err.Error(), "upgrade refused") {
			t.Errorf("LOCK by a reader = %v; want -ERR upgrade refused", err)
		}
		lc.IntCmd(t, c, "UNLOCK", key, "a")
		lc.IntCmd(t, c, "UNLOCK", key, "b")
	}},
	{"lockinfo", func(t *testing.T, c *redis.Client, _, key string) {
		if v, err := c.Do(lockclient.CtxFor(t, 10*time.Second), "LOCKINFO", key).Result(); err != redis.Nil {
			t.Errorf("LOCKINFO of a free key = %v, %v; want nil", v, err)
		}
		g := lc.MustLock(t, c, key, "PX", 10000, "TOKEN", "owner-"+key)
		hidden := lockInfo(t, c, key, "")
		shown := lockInfo(t, c, key, "owner-"+key)
		if !strings.HasPrefix(hidden.token, "sha256:") || shown.token != "owner-"+key {
			t.Errorf("tokens shown %q (no TOKEN) and %q (own TOKEN); want a sha256: digest, then the token", hidden.token, shown.token)
		}
		if shown.fence != g.Fence || shown.ttl <= 0 || shown.ttl > 10000 {
			t.Errorf("LOCKINFO = %+v; want fence %d and 0 < ttl_ms ≤ 10000", shown, g.Fence)
		}
		lc.IntCmd(t, c, "UNLOCK", key, g.Token)
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
		g, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 15*time.Second), c, key, "PX", 10000, "WAIT", 10000)
		if err != nil || !ok {
			t.Fatalf("LOCK … WAIT after the holder left = %v, %v", ok, err)
		}
		if d := time.Since(closed); d > 5*time.Second {
			t.Errorf("granted %v after the holder's connection closed; want at once, not at the 30 s lease", d)
		}
		lc.IntCmd(t, c, "UNLOCK", key, g.Token)
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
			err := c.Do(lockclient.CtxFor(t, 10*time.Second), tc.args...).Err()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v = %v; want an error containing %q", tc.args, err, tc.want)
			}
		}
		if err := c.Ping(lockclient.CtxFor(t, 10*time.Second)).Err(); err != nil {
			t.Errorf("PING after bad input: %v", err)
		}
	}},
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

func lockInfo(t *testing.T, c *redis.Client, key, token string) info {
	t.Helper()
	args := []any{"LOCKINFO", key}
	if token != "" {
		args = append(args, "TOKEN", token)
	}
	v, err := c.Do(lockclient.CtxFor(t, 15*time.Second), args...).Result()
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
