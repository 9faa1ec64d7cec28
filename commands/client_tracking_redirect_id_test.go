package commands

import "testing"

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
	onRedisAndLockproxy(t, func(t *testing.T, _, addr, _ string) {
		inv, data, writer, id := dialRedirectTrio(t, addr, "trk:k")
		subscribeInvalidations(t, inv)
		trackRedirect(t, data, id) // id: the subscriber's CLIENT ID
		if got := data.do(t, "GET trk:k"); got != "1" {
			t.Fatalf("GET trk:k = %q", got)
		}
		writer.do(t, "SET trk:k 2")
		expectInvalidation(t, inv, "trk:k")
	})
}
