package commands

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
)

// TestClientCachingSpentByLocalCommand: Redis applies CLIENT CACHING to
// the client's next command that is no CLIENT command. When that command
// was one lockproxy answers itself (PING, ECHO), the flag stayed on the
// pinned upstream connection and applied to the next relayed read: after
// CLIENT CACHING NO in OPTOUT mode, a GET that Redis tracks went
// untracked, the client got no invalidation when the key changed, and its
// cache kept the old value. Each case is run against redis-server directly
// and through lockproxy, and the bytes the client reads compared. Found by
// a review.
func TestClientCachingSpentByLocalCommand(t *testing.T) {
	up := harness.StartRedis(t, harness.RedisOptions{})
	addr := defaultsProxy(t, up, 1)
	uc := up.Client(t)
	ctx := context.Background()
	for _, tc := range []struct{ name, mode, batch string }{
		{"optout no then PING", "OPTOUT", "CLIENT CACHING no|PING|GET k"},
		{"optout no then ECHO", "OPTOUT", "CLIENT CACHING no|ECHO x|GET k"},
		{"optout no then PING then MULTI", "OPTOUT", "CLIENT CACHING no|PING|MULTI|GET k|EXEC"},
		{"optout no then GET", "OPTOUT", "CLIENT CACHING no|GET k"},
		{"optin yes then PING", "OPTIN", "CLIENT CACHING yes|PING|GET k"},
		{"optin yes then GET", "OPTIN", "CLIENT CACHING yes|GET k"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := func(target string) string {
				if err := uc.Del(ctx, "k").Err(); err != nil {
					t.Fatal(err)
				}
				c := dialFrames(t, target)
				if r := c.do("HELLO 3"); !strings.HasPrefix(r, "%") {
					t.Fatalf("HELLO 3: %s", r)
				}
				if r := c.do("CLIENT TRACKING on " + tc.mode); r != "+OK" {
					t.Fatalf("CLIENT TRACKING: %s", r)
				}
				c.send(strings.Split(tc.batch, "|")...)
				got := quietRead(c.nc, 300*time.Millisecond)
				if err := uc.Set(ctx, "k", "v", 0).Err(); err != nil {
					t.Fatal(err)
				}
				return got + "|after SET: " + quietRead(c.nc, 300*time.Millisecond)
			}
			direct, proxied := run(up.Addr), run(addr)
			if direct != proxied {
				t.Errorf("%s through lockproxy = %q; redis-server: %q", tc.batch, proxied, direct)
			}
		})
	}
}

// quietRead reads what arrives until nothing has for d.
func quietRead(nc net.Conn, d time.Duration) string {
	var got []byte
	buf := make([]byte, 4096)
	for range 100 {
		_ = nc.SetReadDeadline(time.Now().Add(d))
		n, err := nc.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			break
		}
	}
	return string(got)
}

// TestClientCachingKeptAcrossClientCommands: Redis keeps a CLIENT
// CACHING's flag across CLIENT commands (CLIENT GETNAME, CLIENT ID…),
// and applies it to the next command that is no CLIENT one. lockproxy
// dropped it at the next command of any kind, so after CLIENT CACHING YES
// (OPTIN) and CLIENT GETNAME it served a read of a lock key that Redis
// would track, a reply the client caches and that no invalidation ever
// reaches; and after CLIENT CACHING NO (OPTOUT) it refused one Redis would
// not track. Found by a review.
func TestClientCachingKeptAcrossClientCommands(t *testing.T) {
	up := harness.StartRedis(t, harness.RedisOptions{})
	addr := defaultsProxy(t, up, 1)
	const refusal = "-ERR transparent mode: lock keys (lock_patterns) are served by the lock nodes"
	for _, tc := range []struct {
		name, mode, batch string
		refused           bool // the last command, GET lock:x, a read Redis tracks
	}{
		{"optin yes then GET", "OPTIN", "CLIENT CACHING yes|GET lock:x", true},
		{"optin yes then CLIENT GETNAME", "OPTIN", "CLIENT CACHING yes|CLIENT GETNAME|GET lock:x", true},
		{"optin yes then CLIENT ID twice", "OPTIN", "CLIENT CACHING yes|CLIENT ID|CLIENT GETNAME|GET lock:x", true},
		{"optin yes then PING", "OPTIN", "CLIENT CACHING yes|PING|GET lock:x", false},
		{"optout no then CLIENT GETNAME", "OPTOUT", "CLIENT CACHING no|CLIENT GETNAME|GET lock:x", false},
		{"optout no then PING", "OPTOUT", "CLIENT CACHING no|PING|GET lock:x", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialFrames(t, addr)
			if r := c.do("HELLO 3"); !strings.HasPrefix(r, "%") {
				t.Fatalf("HELLO 3: %s", r)
			}
			if r := c.do("CLIENT TRACKING on " + tc.mode); r != "+OK" {
				t.Fatalf("CLIENT TRACKING: %s", r)
			}
			cmds := strings.Split(tc.batch, "|")
			c.send(cmds...)
			got := c.readAll(len(cmds), 5*time.Second)
			last := got[len(got)-1]
			if strings.HasPrefix(last, refusal) != tc.refused {
				t.Errorf("%s: GET lock:x = %q; want refused %v (as Redis would track it)", tc.batch, last, tc.refused)
			}
		})
	}
}
