package transparent

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestTrackingOptInReadsOfLockKeysServedUnlessCached: reads of lock keys
// on a CLIENT TRACKING connection are refused because a client-side cache
// would keep them for good (TestTrackedReadsOfLockKeysNotLeftStale). In
// OPTIN mode a read is tracked, and cached, only right after CLIENT
// CACHING YES; in OPTOUT mode every read is, except right after CLIENT
// CACHING NO. rueidis turns OPTIN tracking on for every RESP3 connection by
// default and sends CLIENT CACHING YES before the reads it caches only
// (DoCache): its plain GET of a lock key (Do) caches nothing, and was
// refused. Only the reads a cache keeps are refused.
func TestTrackingOptInReadsOfLockKeysServedUnlessCached(t *testing.T) {
	t.Parallel()
	e, c, _ := startWithUpstream(t)
	ctx := lockclient.CtxFor(t, 30*time.Second)
	if err := c.SetNX(ctx, "lock:optin", "tok", 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	nc, err := net.DialTimeout("tcp", e.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var got strings.Builder
	// do sends the commands, then a PING with a marker, and returns what
	// came before the marker's reply.
	marker := 0
	do := func(cmds ...[]string) string {
		t.Helper()
		marker++
		m := fmt.Sprintf("mark%d", marker)
		var b strings.Builder
		for _, args := range append(cmds, []string{"PING", m}) {
			fmt.Fprintf(&b, "*%d\r\n", len(args))
			for _, a := range args {
				fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
			}
		}
		if _, err := nc.Write([]byte(b.String())); err != nil {
			t.Fatal(err)
		}
		got.Reset()
		_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 4096)
		for !strings.Contains(got.String(), m) {
			n, err := nc.Read(buf)
			got.Write(buf[:n])
			if err != nil {
				t.Fatalf("reading the replies to %q: %v (so far %q)", cmds, err, got.String())
			}
		}
		return got.String()
	}
	if r := do([]string{"HELLO", "3"}); !strings.Contains(r, "proto") {
		t.Fatalf("HELLO 3: %q", r)
	}
	get := []string{"GET", "lock:optin"}
	for _, step := range []struct {
		name   string
		cmds   [][]string
		served bool // the last command's GET answers the token
	}{
		{"OPTIN, a read without CLIENT CACHING YES", [][]string{{"CLIENT", "TRACKING", "ON", "OPTIN"}, get}, true},
		{"OPTIN, a read right after CLIENT CACHING YES", [][]string{{"CLIENT", "CACHING", "YES"}, get}, false},
		{"OPTIN, the read after that one", [][]string{get}, true},
		{"OPTOUT, a read", [][]string{{"CLIENT", "TRACKING", "OFF"}, {"CLIENT", "TRACKING", "ON", "OPTOUT"}, get}, false},
		{"OPTOUT, a read right after CLIENT CACHING NO", [][]string{{"CLIENT", "CACHING", "NO"}, get}, true},
		{"default mode, a read", [][]string{{"CLIENT", "TRACKING", "OFF"}, {"CLIENT", "TRACKING", "ON"}, get}, false},
	} {
		r := do(step.cmds...)
		served := strings.Contains(r, "$3\r\ntok\r\n")
		refused := strings.Contains(r, "CLIENT TRACKING")
		switch {
		case step.served && !served:
			t.Errorf("%s: replies %q; want the lock key's value: nothing is cached, and the read was refused", step.name, r)
		case !step.served && !refused:
			t.Errorf("%s: replies %q; want the read refused: a client-side cache keeps it", step.name, r)
		}
	}
}
