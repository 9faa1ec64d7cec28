package commands

import (
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
)

// TestSubscribedConnectionNeverReachesAnotherClient: on a RESP3 subscribed connection
// any command may be tunnelled, and upConn.tunnelFrame takes any 3-element
// array whose first element is "unsubscribe" and third an integer for the
// upstream's subscription count. A script returning such an array sets the
// count to 0 while the connection is still subscribed; the next marker PING
// then ends the tunnel, and maybeUnpin puts the still-subscribed connection
// back on the idle list. The next RESP3 client that pins a connection gets
// the first client's messages as pushes. Now a subscription's count is
// read from pushes only (RESP3), and a connection that was ever subscribed
// is closed when its client lets it go, never pooled. Found by a review.
func TestSubscribedConnectionNeverReachesAnotherClient(t *testing.T) {
	up := harness.StartRedis(t, harness.RedisOptions{})
	addr := defaultsProxy(t, up, 1)
	a := dialFrames(t, addr)
	if r := a.do("HELLO 3"); !strings.HasPrefix(r, "%[") {
		t.Fatalf("A: HELLO 3: %s", r)
	}
	if r := a.do("SUBSCRIBE secret"); r != ">[$subscribe $secret :1]" {
		t.Fatalf("A: SUBSCRIBE: %s", r)
	}
	if r := a.do("EVAL return{'unsubscribe','x',0} 0"); r != "*[$unsubscribe $x :0]" {
		t.Fatalf("A: EVAL: %s", r)
	}
	// A command refused in pub/sub mode makes lockproxy sync the tunnel
	// (marker PING): with the count spoofed it finds "no subscription left".
	r := a.do("GET lockproxy:x")
	t.Logf("A: GET lockproxy:x after the spoofed count: %s", r)
	// The pin lingers for WAIT (EVAL counts as a write); a write gives it
	// back to the idle list as clean.
	t.Logf("A: SET ak 1: %s", a.do("SET ak 1"))
	a.nc.Close()
	time.Sleep(200 * time.Millisecond)

	b := dialFrames(t, addr)
	if r := b.do("HELLO 3"); !strings.HasPrefix(r, "%[") {
		t.Fatalf("B: HELLO 3: %s", r)
	}
	if r := b.do("WATCH bk"); r != "+OK" {
		t.Fatalf("B: WATCH: %s", r)
	}
	pub := dialFrames(t, addr)
	if r := pub.do("PUBLISH secret for-A-only"); r != ":0" {
		t.Errorf("PUBLISH secret: %s subscriber(s) still on the upstream after A left (want :0)", r)
	}
	b.send("PING")
	got := b.readAll(2, 500*time.Millisecond)
	for _, g := range got {
		if strings.Contains(g, "for-A-only") {
			t.Errorf("B received A's pub/sub message: %q (all: %q)", g, got)
		}
	}
}
