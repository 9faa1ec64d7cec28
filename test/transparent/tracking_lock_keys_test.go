package transparent

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestTrackedReadsOfLockKeysNotLeftStale: a client-side cache (redis-py's
// cache, rueidis, Lettuce, node-redis: RESP3 with CLIENT TRACKING ON)
// keeps a read's reply until the server sends an "invalidate" push for
// its key. Lock keys are read from the lock nodes, which send none: a
// cached GET of a lock key (redis-py's Lock.locked() and owned()) would
// answer the old holder's token for good, after the lock expired or
// passed to another client. So on a tracking connection a read of a lock
// key is refused, saying why; the other keys are tracked by the upstream
// as before, and after CLIENT TRACKING OFF lock keys are read again.
func TestTrackedReadsOfLockKeysNotLeftStale(t *testing.T) {
	t.Parallel()
	e, c, _ := startWithUpstream(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)
	if err := c.SetNX(ctx, "lock:tracked", "tok", 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, "plain:tracked", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	nc, err := net.DialTimeout("tcp", e.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	send := func(args ...string) {
		t.Helper()
		b := fmt.Sprintf("*%d\r\n", len(args))
		for _, a := range args {
			b += fmt.Sprintf("$%d\r\n%s\r\n", len(a), a)
		}
		if _, err := nc.Write([]byte(b)); err != nil {
			t.Fatal(err)
		}
	}
	var got strings.Builder
	// readUntil reads until want has come, or for wait at most.
	readUntil := func(want string, wait time.Duration) bool {
		_ = nc.SetReadDeadline(time.Now().Add(wait))
		buf := make([]byte, 4096)
		for !strings.Contains(got.String(), want) {
			n, err := nc.Read(buf)
			got.Write(buf[:n])
			if err != nil {
				return strings.Contains(got.String(), want)
			}
		}
		return true
	}
	send("HELLO", "3")
	if !readUntil("proto", 10*time.Second) {
		t.Fatalf("HELLO 3: %q", got.String())
	}
	got.Reset()
	send("CLIENT", "TRACKING", "ON")
	send("GET", "lock:tracked")
	send("GET", "plain:tracked")
	send("PING", "ready")
	if !readUntil("ready", 10*time.Second) {
		t.Fatalf("replies: %q", got.String())
	}
	served := !strings.Contains(got.String(), "-ERR")
	if served {
		// Served: then the lock key's change must be pushed, as Redis
		// would push it.
		if err := c.Del(ctx, "lock:tracked").Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.Set(ctx, "plain:tracked", "w", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if !readUntil("plain:tracked\r\n", 10*time.Second) {
			t.Fatalf("no invalidate push for the plain key: %q", got.String())
		}
		if !readUntil("$12\r\nlock:tracked\r\n", 2*time.Second) {
			t.Fatalf("GET of a lock key on a tracking connection was served (%q), and no invalidate push came when the lock was released: "+
				"a client-side cache keeps the old holder's token", got.String())
		}
		return
	}
	if !strings.Contains(got.String(), "CLIENT TRACKING") || !strings.Contains(got.String(), "$1\r\nv\r\n") {
		t.Fatalf("replies on a tracking connection = %q; want the lock key's GET refused, saying why, and the plain key's served", got.String())
	}
	// The plain key is still tracked by the upstream.
	if err := c.Set(ctx, "plain:tracked", "w", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if !readUntil("plain:tracked\r\n", 10*time.Second) {
		t.Fatalf("no invalidate push for the plain key: %q", got.String())
	}
	// Tracking off: lock keys are read as on any connection.
	got.Reset()
	send("CLIENT", "TRACKING", "OFF")
	send("GET", "lock:tracked")
	send("PING", "done")
	if !readUntil("done", 10*time.Second) || !strings.Contains(got.String(), "$3\r\ntok\r\n") {
		t.Fatalf("after CLIENT TRACKING OFF: %q; want the lock key's value", got.String())
	}
}
