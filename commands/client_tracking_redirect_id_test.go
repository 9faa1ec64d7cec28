package commands

import (
	"strings"
	"testing"
	"time"
)

// TestClientTrackingRedirectToClientID: RESP2 client-side caching (the
// "two connections" mode) subscribes one connection to
// __redis__:invalidate, reads its id with CLIENT ID, and turns tracking on
// for the data connection with CLIENT TRACKING on REDIRECT <id>. On Redis
// that answers +OK and a write to a key the data connection read sends an
// invalidation message to the subscribed connection. Through lockproxy
// CLIENT ID answers lockproxy's own id, and CLIENT TRACKING is relayed
// with it to the upstream, which knows no such client ("-ERR The client
// ID you want redirect to does not exist"), or, when an upstream
// connection happens to carry that id, sends the invalidations to that
// connection instead: some other client's, or a shared one.
func TestClientTrackingRedirectToClientID(t *testing.T) {
	for _, target := range []string{"redis", "lockproxy"} {
		t.Run(target, func(t *testing.T) {
			proxy, upstream := proxyWithUpstream(t, Options{})
			addr := proxy
			if target == "redis" {
				addr = upstream
			}
			inv, data, writer := dialRaw(t, addr), dialRaw(t, addr), dialRaw(t, addr)
			writer.do(t, "SET trk:k 1")
			id := strings.TrimPrefix(inv.do(t, "CLIENT ID"), ":")
			if got := inv.do(t, "SUBSCRIBE __redis__:invalidate"); got != "*3" {
				t.Fatalf("SUBSCRIBE = %q", got)
			}
			for i := 0; i < 3; i++ { // subscribe, the channel, :1
				inv.reply(t)
			}
			if got := data.do(t, "CLIENT TRACKING on REDIRECT "+id); got != "+OK" {
				t.Fatalf("CLIENT TRACKING on REDIRECT %s (the subscriber's CLIENT ID) = %q; want +OK", id, got)
			}
			if got := data.do(t, "GET trk:k"); got != "1" {
				t.Fatalf("GET trk:k = %q", got)
			}
			writer.do(t, "SET trk:k 2")
			_ = inv.c.SetReadDeadline(time.Now().Add(3 * time.Second))
			var got []string
			for i := 0; i < 5; i++ {
				got = append(got, inv.reply(t))
			}
			if got[2] != "__redis__:invalidate" || got[4] != "trk:k" {
				t.Errorf("the subscriber got %q; want the invalidation of trk:k", got)
			}
		})
	}
}
