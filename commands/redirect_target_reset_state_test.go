package commands

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/relay"
	"github.com/lockproxy/lockproxy/resp"
	"github.com/lockproxy/lockproxy/test/harness"
)

// readPubSub reads a pub/sub frame (an array in RESP2, a push in RESP3)
// whose first line do or reply returned, and fails the test unless its
// three elements are want.
func readPubSub(t *testing.T, c *rawConn, first string, want ...string) {
	t.Helper()
	if first != "*3" && first != ">3" {
		t.Fatalf("got %q; want a pub/sub frame %q", first, want)
	}
	for i, w := range want {
		if got := c.reply(t); got != w {
			t.Fatalf("element %d of the pub/sub frame = %q; want %q", i, got, w)
		}
	}
}

// resetTargetScenario: inv, pinned (by a subscription, or SELECT 1), in
// RESP2 or RESP3, is the target of data's tracking redirection, and
// RESETs. As on Redis, RESET ends inv's subscriptions and its database
// (they are no longer on the upstream connection kept for it: a PUBLISH
// reaches no one, a SET lands in database 0), answers +RESET once and
// leaves inv in RESP2, with its id, and the redirection still reaches it
// once it subscribes again.
func resetTargetScenario(t *testing.T, addr, pinBy string, hello3 bool) {
	t.Helper()
	inv, data, writer, id := dialRedirectTrio(t, addr, "rvstate:k")
	if hello3 {
		if got := inv.do(t, "HELLO 3"); got != "%7" {
			t.Fatalf("HELLO 3 = %q", got)
		}
		for range 14 {
			inv.reply(t)
		}
	}
	if pinBy == "SUBSCRIBE" {
		readPubSub(t, inv, inv.do(t, "SUBSCRIBE ch"), "subscribe", "ch", ":1")
	} else if got := inv.do(t, "SELECT 1"); got != "+OK" {
		t.Fatalf("SELECT 1 = %q", got)
	}
	trackRedirect(t, data, id)
	if pinBy == "SUBSCRIBE" {
		if got := writer.do(t, "PUBLISH ch m1"); got != ":1" {
			t.Fatalf("PUBLISH ch m1 = %q; want :1", got)
		}
		readPubSub(t, inv, inv.reply(t), "message", "ch", "m1")
	}
	if got := inv.do(t, "RESET"); got != "+RESET" {
		t.Fatalf("RESET = %q", got)
	}
	if got := inv.do(t, "PING"); got != "+PONG" {
		t.Errorf("PING after RESET = %q; want +PONG (one +RESET, no subscription left)", got)
	}
	if got := writer.do(t, "PUBLISH ch m2"); got != ":0" {
		t.Errorf("PUBLISH ch after the subscriber's RESET = %q; want :0", got)
	}
	if got := inv.do(t, "CLIENT ID"); got != ":"+id {
		t.Fatalf("CLIENT ID after RESET = %q; want :%s", got, id)
	}
	if got := inv.do(t, "SET rvstate:db 1"); got != "+OK" {
		t.Fatalf("SET after RESET = %q", got)
	}
	if got := writer.do(t, "GET rvstate:db"); got != "1" {
		t.Errorf("GET in database 0 of a key SET after RESET = %q; want 1 (RESET selects database 0)", got)
	}
	subscribeInvalidations(t, inv) // RESP2 after RESET: *3
	if got := data.do(t, "GET rvstate:k"); got != "1" {
		t.Fatalf("GET = %q", got)
	}
	writer.do(t, "SET rvstate:k 2")
	expectInvalidation(t, inv, "rvstate:k")
}

// TestRedirectTargetResetClearsItsState: the connection a RESET of a
// redirection's target keeps (TestRedirectTargetSurvivesReset) holds
// nothing of what the target had before it, as on Redis.
func TestRedirectTargetResetClearsItsState(t *testing.T) {
	for _, tc := range []struct {
		name, pinBy string
		hello3      bool
	}{
		{"subscribed RESP2", "SUBSCRIBE", false},
		{"subscribed RESP3", "SUBSCRIBE", true},
		{"SELECT 1 RESP2", "SELECT", false},
		{"SELECT 1 RESP3", "SELECT", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			onRedisAndLockproxy(t, func(t *testing.T, _, addr, _ string) {
				resetTargetScenario(t, addr, tc.pinBy, tc.hello3)
			})
		})
	}
}

// TestRedirectTargetResetSignsInAgain: RESET signs a connection out, so
// the connection kept for a redirection's target is signed in again with
// the relay's credentials: without, the target's next command there would
// get -NOAUTH from a password-protected upstream.
func TestRedirectTargetResetSignsInAgain(t *testing.T) {
	up := harness.StartRedis(t, harness.RedisOptions{Password: "s3cret"})
	r := relay.New(relay.Config{Addr: up.Addr, Password: "s3cret", PoolSize: 4, DialTimeout: time.Second, ReadTimeout: 5 * time.Second})
	srv := &resp.Server{EventLoop: true}
	o := Options{Relay: r, Backend: &fakeBackend{}, Limits: testLimits, Clients: srv.Sessions}
	h := NewHandler(o)
	srv.Handler = h
	proxy := serveRelayed(t, srv, h, r)
	for _, hello3 := range []bool{false, true} {
		resetTargetScenario(t, proxy, "SUBSCRIBE", hello3)
	}
}
