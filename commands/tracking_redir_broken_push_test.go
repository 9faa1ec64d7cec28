package commands

import (
	"io"
	"testing"
	"time"
)

// TestRedirBrokenPushGivesClientID: a RESP3 client whose tracking
// redirection names a client that has gone gets, at the next
// invalidation, the push ["tracking-redir-broken", id], id being the
// client it redirected to, as CLIENT GETREDIR gives it. Through lockproxy
// the push carried the upstream id relayed in its place
// (trackingRedirect), which names no lockproxy client.
func TestRedirBrokenPushGivesClientID(t *testing.T) {
	onRedisAndLockproxy(t, func(t *testing.T, _, addr, upstream string) {
		raiseUpstreamIDs(t, upstream, 5)
		inv, data, writer, id := dialRedirectTrio(t, addr, "rvbroken:k")
		subscribeInvalidations(t, inv)
		if _, err := data.c.Write([]byte("HELLO 3\r\n")); err != nil {
			t.Fatal(err)
		}
		for { // HELLO's map ends with the empty modules array
			if l, err := data.rd.ReadString('\n'); err != nil {
				t.Fatal(err)
			} else if l == "*0\r\n" {
				break
			}
		}
		trackRedirect(t, data, id)
		if got := data.do(t, "GET rvbroken:k"); got != "1" {
			t.Fatalf("GET = %q", got)
		}
		inv.c.Close()
		time.Sleep(300 * time.Millisecond)
		writer.do(t, "SET rvbroken:k 2")
		_ = data.c.SetReadDeadline(time.Now().Add(time.Second))
		b, _ := io.ReadAll(data.rd)
		if want := ">2\r\n$21\r\ntracking-redir-broken\r\n:" + id + "\r\n"; string(b) != want {
			t.Errorf("after the redirection's target left, the tracking client got %q; want %q", b, want)
		}
	})
}
