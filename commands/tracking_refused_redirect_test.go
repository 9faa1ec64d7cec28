package commands

import (
	"strings"
	"testing"
)

// TestRefusedTrackingPinsNoTarget: a CLIENT TRACKING on … REDIRECT
// id that Redis refuses after the id was translated (here PREFIX without
// BCAST) sets no redirection, yet the client named was made a
// redirection's target before the command was relayed (relay.Named): it
// keeps its pinned upstream connection for as long as it stays connected,
// as after CLIENT TRACKING off … REDIRECT
// (TestTrackingOffRedirectPinsNoTarget).
func TestRefusedTrackingPinsNoTarget(t *testing.T) {
	proxy, upstream := proxyWithUpstream(t, Options{})
	target, other, id := subscribedTarget(t, proxy)
	if got := other.do(t, "CLIENT TRACKING on REDIRECT "+id+" PREFIX p:"); !strings.HasPrefix(got, "-ERR") {
		t.Fatalf("CLIENT TRACKING on REDIRECT %s PREFIX p: = %q; want Redis's error (PREFIX needs BCAST)", id, got)
	}
	expectUnpinnedAfterUnsubscribe(t, target, upstream, "a redirection Redis refused")
}

// TestRefusedTrackingKeepsRedirection: a CLIENT TRACKING on … REDIRECT
// that Redis refuses leaves the redirection in force as it was, and
// CLIENT GETREDIR names its target as before. Through lockproxy the
// refused command's translation was kept as the one to give back: the
// reply to GETREDIR, the upstream id of the first target's connection,
// was compared with the refused target's and handed out untranslated.
func TestRefusedTrackingKeepsRedirection(t *testing.T) {
	onRedisAndLockproxy(t, func(t *testing.T, _, addr, _ string) {
		first, data, _, id := dialRedirectTrio(t, addr, "trkref:k")
		second := dialRaw(t, addr)
		other := clientID(t, second)
		subscribeInvalidations(t, first)
		pubSub(t, second, "SUBSCRIBE ch")
		trackRedirect(t, data, id)
		if got := data.do(t, "CLIENT TRACKING on REDIRECT "+other+" PREFIX p:"); !strings.HasPrefix(got, "-ERR") {
			t.Fatalf("CLIENT TRACKING on REDIRECT %s PREFIX p: = %q; want Redis's error (PREFIX needs BCAST)", other, got)
		}
		if got := data.do(t, "CLIENT GETREDIR"); got != ":"+id {
			t.Errorf("CLIENT GETREDIR after a refused REDIRECT %s = %q; want :%s, the redirection in force", other, got, id)
		}
	})
}
