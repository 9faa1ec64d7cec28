package commands

import "testing"

// TestTrackingOffRedirectPinsNoTarget: CLIENT TRACKING off …
// REDIRECT id sets no redirection (Redis only checks that the client
// exists), yet through lockproxy the client named was made a
// redirection's target (relay.Named with NameRedirect): it keeps its
// pinned upstream connection, off the shared pool and the event loop,
// for as long as it stays connected, after the state it was pinned for
// (here a subscription) is over. Any client can do that to any pinned
// client it knows the id of.
func TestTrackingOffRedirectPinsNoTarget(t *testing.T) {
	proxy, upstream := proxyWithUpstream(t, Options{})
	target, other, id := subscribedTarget(t, proxy)
	if got := other.do(t, "CLIENT TRACKING off REDIRECT "+id); got != "+OK" {
		t.Fatalf("CLIENT TRACKING off REDIRECT %s = %q; want +OK", id, got)
	}
	expectUnpinnedAfterUnsubscribe(t, target, upstream, "a redirection CLIENT TRACKING off never set")
}
