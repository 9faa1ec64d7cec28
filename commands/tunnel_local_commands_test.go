package commands

import (
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
)

// TestTunnelAnswersConnectionCommandsHere: RESP3 lets a subscribed client
// send any command, and lockproxy tunnelled every one it did not refuse to
// the client's pinned upstream connection, its own connection commands
// too. CLIENT ID then gave the upstream connection's id (which, used in a
// CLIENT UNBLOCK or TRACKING … REDIRECT, names another lockproxy client),
// CLIENT GETNAME the upstream's (no) name, CLIENT INFO and CLIENT LIST the
// upstream's connections (lockproxy's own, other clients' pinned ones
// among them), INFO the upstream's. They are answered by lockproxy, as
// outside pub/sub mode, after the replies to the commands tunnelled
// before them. Found by a review.
func TestTunnelAnswersConnectionCommandsHere(t *testing.T) {
	up := harness.StartRedis(t, harness.RedisOptions{})
	addr := defaultsProxy(t, up, 1)
	a := dialFrames(t, addr)
	if r := a.do("HELLO 3"); !strings.HasPrefix(r, "%[") {
		t.Fatalf("HELLO 3: %s", r)
	}
	if r := a.do("CLIENT SETNAME alice"); r != "+OK" {
		t.Fatalf("CLIENT SETNAME: %s", r)
	}
	id := a.do("CLIENT ID")
	info := a.do("CLIENT INFO")
	if r := a.do("SUBSCRIBE ch"); r != ">[$subscribe $ch :1]" {
		t.Fatalf("SUBSCRIBE: %s", r)
	}
	// In one write: the second subscription's confirmation comes first.
	a.send("SUBSCRIBE ch2", "CLIENT ID", "CLIENT GETNAME", "CLIENT INFO", "CLIENT LIST", "INFO server")
	got := a.readAll(6, 5*time.Second)
	if len(got) != 6 {
		t.Fatalf("replies: %q", got)
	}
	for _, c := range []struct {
		name, got string
		ok        bool
	}{
		{"SUBSCRIBE ch2", got[0], got[0] == ">[$subscribe $ch2 :2]"},
		{"CLIENT ID", got[1], got[1] == id},
		{"CLIENT GETNAME", got[2], got[2] == "$alice"},
		{"CLIENT INFO", got[3], strings.Contains(got[3], " name=alice ") && strings.Contains(got[3], "id="+strings.TrimPrefix(id, ":")+" ")},
		{"CLIENT LIST", got[4], strings.Contains(got[4], " name=alice ") && !strings.Contains(got[4], "qbuf-free=")},
		{"INFO server", got[5], strings.Contains(got[5], "lockproxy")},
	} {
		if !c.ok {
			t.Errorf("subscribed: %s = %q; want lockproxy's answer (before SUBSCRIBE: CLIENT ID %s, CLIENT INFO %q)", c.name, c.got, id, info)
		}
	}
	// Still subscribed, and still served in order.
	pub := dialFrames(t, addr)
	if r := pub.do("PUBLISH ch hi"); r != ":1" {
		t.Errorf("PUBLISH ch: %s; want :1", r)
	}
	if r, err := a.read(5 * time.Second); err != nil || r != ">[$message $ch $hi]" {
		t.Errorf("message: %q, %v", r, err)
	}
}
