package commands

import (
	"strings"
	"testing"
	"time"
)

// onRedisAndLockproxy runs scenario twice, as the subtests "redis" and
// "lockproxy", each against a fresh proxyWithUpstream: addr is the
// address the scenario's clients dial (the upstream's, or lockproxy's),
// upstream the upstream's either way.
func onRedisAndLockproxy(t *testing.T, scenario func(t *testing.T, target, addr, upstream string)) {
	t.Helper()
	for _, target := range []string{"redis", "lockproxy"} {
		t.Run(target, func(t *testing.T) {
			proxy, upstream := proxyWithUpstream(t, Options{})
			addr := proxy
			if target == "redis" {
				addr = upstream
			}
			scenario(t, target, addr, upstream)
		})
	}
}

// clientID returns c's CLIENT ID, without the reply's colon.
func clientID(t *testing.T, c *rawConn) string {
	t.Helper()
	return strings.TrimPrefix(c.do(t, "CLIENT ID"), ":")
}

// pubSub sends a (UN)SUBSCRIBE of one channel, or an UNSUBSCRIBE of the
// only one, fails the test unless its reply is a three-element array,
// and reads the three elements (the kind, the channel, the count).
func pubSub(t *testing.T, c *rawConn, cmd string) {
	t.Helper()
	if got := c.do(t, cmd); got != "*3" {
		t.Fatalf("%s = %q", strings.Fields(cmd)[0], got)
	}
	for range 3 {
		c.reply(t)
	}
}

// subscribeInvalidations subscribes c to __redis__:invalidate, the
// channel a tracking redirection's invalidations come on.
func subscribeInvalidations(t *testing.T, c *rawConn) {
	t.Helper()
	pubSub(t, c, "SUBSCRIBE __redis__:invalidate")
}

// dialRedirectTrio dials the three clients of a tracking redirection
// scenario at addr: inv, the redirection's target, data, the tracking
// client, and writer, which sets key to 1 first; it returns them with
// inv's CLIENT ID.
func dialRedirectTrio(t *testing.T, addr, key string) (inv, data, writer *rawConn, id string) {
	t.Helper()
	inv, data, writer = dialRaw(t, addr), dialRaw(t, addr), dialRaw(t, addr)
	writer.do(t, "SET "+key+" 1")
	return inv, data, writer, clientID(t, inv)
}

// trackRedirect turns tracking on for data, redirected to the client of
// id, and fails the test unless that answers +OK.
func trackRedirect(t *testing.T, data *rawConn, id string) {
	t.Helper()
	if got := data.do(t, "CLIENT TRACKING on REDIRECT "+id); got != "+OK" {
		t.Fatalf("CLIENT TRACKING on REDIRECT %s = %q; want +OK", id, got)
	}
}

// expectInvalidation reads, within 3 seconds, the next message on inv
// (subscribed to __redis__:invalidate), and reports an error unless it is
// the invalidation of key.
func expectInvalidation(t *testing.T, inv *rawConn, key string) {
	t.Helper()
	_ = inv.c.SetReadDeadline(time.Now().Add(3 * time.Second))
	var got []string
	for range 5 { // *3, message, the channel, *1, the key
		got = append(got, inv.reply(t))
	}
	if got[2] != "__redis__:invalidate" || got[4] != key {
		t.Errorf("the subscriber got %q; want the invalidation of %s", got, key)
	}
}

// blockOn sends cmd, a blocking command, on c without reading its reply,
// and waits until it is blocked.
func blockOn(t *testing.T, c *rawConn, cmd string) {
	t.Helper()
	if _, err := c.c.Write([]byte(cmd + "\r\n")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the command is blocked by now
}

// subscribedTarget dials two lockproxy clients at proxy, target
// subscribed to a channel (so pinned to an upstream connection) and
// other, and returns them with target's CLIENT ID.
func subscribedTarget(t *testing.T, proxy string) (target, other *rawConn, id string) {
	t.Helper()
	target, other = dialRaw(t, proxy), dialRaw(t, proxy)
	id = clientID(t, target)
	pubSub(t, target, "SUBSCRIBE ch")
	return target, other, id
}

// expectUnpinnedAfterUnsubscribe unsubscribes target (subscribedTarget's)
// and checks that it then keeps no pinned upstream connection: RESET
// closes a pinned connection only, so with none the upstream keeps as
// many connections. why, on failure, says what the connection would have
// been kept for.
func expectUnpinnedAfterUnsubscribe(t *testing.T, target *rawConn, upstream, why string) {
	t.Helper()
	pubSub(t, target, "UNSUBSCRIBE")
	if got := target.do(t, "PING"); got != "+PONG" {
		t.Fatalf("PING = %q", got)
	}
	lister := dialRaw(t, upstream)
	count := func() int {
		time.Sleep(200 * time.Millisecond)
		list := lister.do(t, "CLIENT LIST")
		return strings.Count(list, "id=")
	}
	before := count()
	if got := target.do(t, "RESET"); got != "+RESET" {
		t.Fatalf("RESET = %q", got)
	}
	if after := count(); after != before {
		t.Errorf("the target's RESET closed an upstream connection (%d then %d): it still had one pinned after its UNSUBSCRIBE, "+
			"kept for %s", before, after, why)
	}
}
