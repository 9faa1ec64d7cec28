package commands

import (
	"strings"
	"testing"
	"time"
)

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
	target, other := dialRaw(t, proxy), dialRaw(t, proxy)
	id := strings.TrimPrefix(target.do(t, "CLIENT ID"), ":")
	if got := target.do(t, "SUBSCRIBE ch"); got != "*3" {
		t.Fatalf("SUBSCRIBE = %q", got)
	}
	for range 3 {
		target.reply(t)
	}
	if got := other.do(t, "CLIENT TRACKING off REDIRECT "+id); got != "+OK" {
		t.Fatalf("CLIENT TRACKING off REDIRECT %s = %q; want +OK", id, got)
	}
	if got := target.do(t, "UNSUBSCRIBE"); got != "*3" {
		t.Fatalf("UNSUBSCRIBE = %q", got)
	}
	for range 3 {
		target.reply(t)
	}
	if got := target.do(t, "PING"); got != "+PONG" {
		t.Fatalf("PING = %q", got)
	}
	// RESET closes a pinned connection only: with none, the upstream
	// keeps as many connections.
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
			"kept for a redirection CLIENT TRACKING off never set", before, after)
	}
}
