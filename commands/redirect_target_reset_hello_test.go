package commands

import (
	"testing"
	"time"
)

// TestRedirectTargetHello3AfterReset: a RESP3 client that RESETs (which
// leaves it in RESP2) and says HELLO 3 again, as a pooled connection's
// library does, is in RESP3 on Redis: its replies are RESP3 (a missing
// key's GET is _), and as a tracking redirection's target it gets the
// invalidations as pushes, subscribed or not. Through lockproxy the
// redirection's target keeps its upstream connection through RESET,
// which leaves that connection in RESP2, and HELLO did not switch a
// pinned connection: the client got RESP2 replies in RESP3, and no
// invalidation at all (a RESP2 connection that is not subscribed gets
// none). Before RESET kept the connection, the RESET dropped it and the
// HELLO 3 that followed was served in RESP3.
func TestRedirectTargetHello3AfterReset(t *testing.T) {
	onRedisAndLockproxy(t, func(t *testing.T, _, addr, _ string) {
		inv, data, writer, id := dialRedirectTrio(t, addr, "rvhello:k")
		hello3 := func() {
			t.Helper()
			if got := inv.do(t, "HELLO 3"); got != "%7" {
				t.Fatalf("HELLO 3 = %q", got)
			}
			for range 14 {
				inv.reply(t)
			}
		}
		hello3()
		readPubSub(t, inv, inv.do(t, "SUBSCRIBE ch"), "subscribe", "ch", ":1")
		trackRedirect(t, data, id)
		if got := inv.do(t, "RESET"); got != "+RESET" {
			t.Fatalf("RESET = %q", got)
		}
		hello3()
		if got := inv.do(t, "GET rvhello:missing"); got != "_" {
			t.Errorf("GET of a missing key after RESET and HELLO 3 = %q; want _ (RESP3's null)", got)
		}
		if got := inv.do(t, "HGETALL rvhello:missing"); got != "%0" {
			t.Errorf("HGETALL of a missing key after RESET and HELLO 3 = %q; want %%0 (a RESP3 map)", got)
		}
		if got := data.do(t, "GET rvhello:k"); got != "1" {
			t.Fatalf("GET = %q", got)
		}
		writer.do(t, "SET rvhello:k 2")
		_ = inv.c.SetReadDeadline(time.Now().Add(3 * time.Second))
		var got []string
		for range 4 { // >2, invalidate, *1, the key
			line, err := inv.rd.ReadString('\n')
			if err != nil {
				t.Fatalf("the target got %q, then %v; want the invalidation of rvhello:k as a push", got, err)
			}
			got = append(got, line)
			if line[0] == '$' {
				l, _ := inv.rd.ReadString('\n')
				got[len(got)-1] = l
			}
		}
		if got[0] != ">2\r\n" || got[1] != "invalidate\r\n" || got[3] != "rvhello:k\r\n" {
			t.Errorf("the target got %q; want the invalidation of rvhello:k as a push", got)
		}
	})
}

// TestPinnedHelloSwitchesProtocol: HELLO switches the protocol of a
// client's pinned connection (here pinned by SELECT 1) both ways, and the
// connection keeps its database.
func TestPinnedHelloSwitchesProtocol(t *testing.T) {
	onRedisAndLockproxy(t, func(t *testing.T, _, addr, _ string) {
		c, other := dialRaw(t, addr), dialRaw(t, addr)
		if got := c.do(t, "SELECT 1"); got != "+OK" {
			t.Fatalf("SELECT 1 = %q", got)
		}
		for _, tc := range []struct{ proto, null string }{{"3", "_"}, {"2", "$-1"}, {"3", "_"}} {
			if got := c.do(t, "HELLO "+tc.proto); got != "%7" && got != "*14" {
				t.Fatalf("HELLO %s = %q", tc.proto, got)
			}
			for range 14 {
				c.reply(t)
			}
			if got := c.do(t, "GET pinhello:missing"); got != tc.null {
				t.Errorf("GET of a missing key after HELLO %s = %q; want %q", tc.proto, got, tc.null)
			}
		}
		if got := c.do(t, "SET pinhello:db 1"); got != "+OK" {
			t.Fatalf("SET = %q", got)
		}
		if got := other.do(t, "EXISTS pinhello:db"); got != ":0" {
			t.Errorf("EXISTS in database 0 of a key SET after HELLO = %q; want :0 (the key is in database 1)", got)
		}
	})
}
