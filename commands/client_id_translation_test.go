package commands

import (
	"regexp"
	"strings"
	"testing"
)

// upstreamIDOf returns the id the upstream at addr gives the connection
// whose CLIENT LIST line matches re, failing the test when none does.
func upstreamIDOf(t *testing.T, addr string, re *regexp.Regexp) string {
	t.Helper()
	list := dialRaw(t, addr).do(t, "CLIENT LIST")
	for _, line := range strings.Split(list, "\n") {
		if re.MatchString(line) {
			return strings.TrimPrefix(strings.Fields(line)[0], "id=")
		}
	}
	t.Fatalf("no upstream connection matches %v in CLIENT LIST:\n%s", re, list)
	return ""
}

// raiseUpstreamIDs opens and closes n connections to the upstream at addr,
// so that the ids it gives next are above those lockproxy gives its few
// clients in a test: an upstream id then names no lockproxy client.
func raiseUpstreamIDs(t *testing.T, addr string, n int) {
	t.Helper()
	for range n {
		c := dialRaw(t, addr)
		c.do(t, "PING")
		c.c.Close()
	}
}

// TestClientUnblockNeverReachesAnotherClient: CLIENT UNBLOCK with an id
// that names no blocked lockproxy client answers :0 and unblocks no one,
// even when the number is the upstream id of the connection another
// client is blocked on (relayed as it was, it ended that client's BLPOP),
// and whatever the id's client is doing (here: nothing upstream).
func TestClientUnblockNeverReachesAnotherClient(t *testing.T) {
	proxy, upstream := proxyWithUpstream(t, Options{})
	raiseUpstreamIDs(t, upstream, 20)
	blocked, other, idle := dialRaw(t, proxy), dialRaw(t, proxy), dialRaw(t, proxy)
	idleID := clientID(t, idle)
	blockOn(t, blocked, "BLPOP nounblock:q 5")
	upID := upstreamIDOf(t, upstream, regexp.MustCompile(`\bcmd=blpop\b`))
	if got := other.do(t, "CLIENT LIST ID "+upID); got != "" {
		t.Fatalf("lockproxy has a client of id %s, the blocked connection's upstream id: %q", upID, got)
	}
	for _, tc := range []struct{ name, id string }{
		{"the upstream id of another client's blocked connection", upID},
		{"a client that is not blocked", idleID},
		{"no client", "999999"},
	} {
		if got := other.do(t, "CLIENT UNBLOCK "+tc.id); got != ":0" {
			t.Errorf("CLIENT UNBLOCK %s (%s) = %q; want :0", tc.id, tc.name, got)
		}
	}
	if got := other.do(t, "CLIENT UNBLOCK "+idleID+" SOMETIMES"); got != "-ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR" {
		t.Errorf("CLIENT UNBLOCK %s SOMETIMES = %q; want Redis's error", idleID, got)
	}
	dialRaw(t, upstream).do(t, "RPUSH nounblock:q x")
	if got := blocked.reply(t); got != "*2" {
		t.Fatalf("BLPOP = %q; want the element pushed after the UNBLOCKs (*2): an UNBLOCK reached it", got)
	}
}

// TestClientUnblockErrorReason: CLIENT UNBLOCK id ERROR is relayed with
// its reason, and the blocked client gets Redis's UNBLOCKED error.
func TestClientUnblockErrorReason(t *testing.T) {
	proxy, _ := proxyWithUpstream(t, Options{})
	blocked, other := dialRaw(t, proxy), dialRaw(t, proxy)
	id := clientID(t, blocked)
	blockOn(t, blocked, "BRPOP unblockerr:q 5")
	if got := other.do(t, "CLIENT UNBLOCK "+id+" ERROR"); got != ":1" {
		t.Errorf("CLIENT UNBLOCK %s ERROR = %q; want :1", id, got)
	}
	if got := blocked.reply(t); !strings.HasPrefix(got, "-UNBLOCKED") {
		t.Errorf("BRPOP after CLIENT UNBLOCK … ERROR = %q; want -UNBLOCKED …", got)
	}
	// The client goes on, on a connection of its own or a shared one.
	if got := blocked.do(t, "PING"); got != "+PONG" {
		t.Errorf("PING after the unblocked BRPOP = %q", got)
	}
}

// TestClientIDCommandsRefused: a command that names a client by id is not
// queued inside MULTI (the id is translated when the command is served,
// and at EXEC that client may have another upstream connection or none),
// and CLIENT KILL ID, which would close a lockproxy client, is refused
// rather than relayed with an id that is not the upstream's.
func TestClientIDCommandsRefused(t *testing.T) {
	proxy, _ := proxyWithUpstream(t, Options{})
	c, target := dialRaw(t, proxy), dialRaw(t, proxy)
	id := clientID(t, target)
	for _, tc := range []struct{ name, cmd, want string }{
		{"unblock in multi", "CLIENT UNBLOCK " + id, "-ERR 'client|unblock' naming a client by id is not allowed inside MULTI"},
		{"kill id in multi", "CLIENT KILL ID " + id, "-ERR 'client|kill' naming a client by id is not allowed inside MULTI"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := c.do(t, "MULTI"); got != "+OK" {
				t.Fatalf("MULTI = %q", got)
			}
			if got := c.do(t, tc.cmd); !strings.HasPrefix(got, tc.want) {
				t.Errorf("%s in MULTI = %q; want %q…", tc.cmd, got, tc.want)
			}
			if got := c.do(t, "EXEC"); !strings.HasPrefix(got, "-EXECABORT") {
				t.Errorf("EXEC = %q; want -EXECABORT", got)
			}
		})
	}
	if got := c.do(t, "CLIENT KILL ID "+id); !strings.HasPrefix(got, "-ERR CLIENT KILL ID is not supported through lockproxy") {
		t.Errorf("CLIENT KILL ID %s = %q; want lockproxy's refusal", id, got)
	}
	if got := target.do(t, "PING"); got != "+PONG" {
		t.Errorf("the target's PING = %q; want +PONG", got)
	}
}

// TestClientTrackingRedirectNeverRelaysAnID: CLIENT TRACKING … REDIRECT
// with an id that names no lockproxy client with an upstream connection is
// refused as Redis refuses one that names no client, even when the number
// is the upstream id of another client's subscribed connection (relayed as
// it was, that client got the invalidations of this one's reads).
func TestClientTrackingRedirectNeverRelaysAnID(t *testing.T) {
	proxy, upstream := proxyWithUpstream(t, Options{})
	raiseUpstreamIDs(t, upstream, 20)
	sub, fresh := dialRaw(t, proxy), dialRaw(t, proxy)
	fresh.do(t, "SET trkno:k 0")
	freshID := clientID(t, fresh)
	subscribeInvalidations(t, sub)
	upID := upstreamIDOf(t, upstream, regexp.MustCompile(`\bcmd=subscribe\b`))
	if got := fresh.do(t, "CLIENT LIST ID "+upID); got != "" {
		t.Fatalf("lockproxy has a client of id %s, the subscriber's upstream id: %q", upID, got)
	}
	for _, tc := range []struct{ name, args, want string }{
		{"the upstream id of another client's connection", "on REDIRECT " + upID, "-" + errRedirectMissing},
		{"a client with no upstream connection", "on REDIRECT " + freshID, "-" + errRedirectMissing},
		{"no client", "on BCAST REDIRECT 999999", "-" + errRedirectMissing},
		{"not an id", "on REDIRECT abc", "-ERR value is not an integer or out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := dialRaw(t, proxy)
			if got := data.do(t, "CLIENT TRACKING "+tc.args); got != tc.want {
				t.Errorf("CLIENT TRACKING %s (%s) = %q; want %q", tc.args, tc.name, got, tc.want)
			}
			data.do(t, "GET trkno:k")
			data.do(t, "SET trkno:k 1")
		})
	}
	// The subscriber got no invalidation: the next frame is the PING's.
	if _, err := sub.c.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	if got := sub.reply(t); got != "*2" {
		t.Fatalf("the subscriber's next frame = %q; want PING's reply", got)
	}
	if got := sub.reply(t); got != "pong" {
		t.Errorf("the subscriber's next frame begins %q; want pong, not an invalidation", got)
	}
}

// TestClientTrackingRedirectOutlivesUnsubscribe: on Redis a redirection
// lasts as long as the client it names; that client may unsubscribe and
// subscribe again and still gets the invalidations. Through lockproxy the
// client named keeps the upstream connection the redirection names.
func TestClientTrackingRedirectOutlivesUnsubscribe(t *testing.T) {
	onRedisAndLockproxy(t, func(t *testing.T, _, addr, _ string) {
		inv, data, writer, id := dialRedirectTrio(t, addr, "trkout:k")
		subscribeInvalidations(t, inv)
		trackRedirect(t, data, id)
		pubSub(t, inv, "UNSUBSCRIBE")
		// A command between: the connection is out of pub/sub mode.
		if got := inv.do(t, "PING"); got != "+PONG" {
			t.Fatalf("PING = %q", got)
		}
		subscribeInvalidations(t, inv)
		if got := data.do(t, "GET trkout:k"); got != "1" {
			t.Fatalf("GET trkout:k = %q", got)
		}
		writer.do(t, "SET trkout:k 2")
		expectInvalidation(t, inv, "trkout:k")
	})
}

// TestClientTrackingRedirectInfoGivesClientID: CLIENT GETREDIR and CLIENT
// TRACKINGINFO give back the id the client redirected to, as on Redis:
// through lockproxy that client's lockproxy id, not the upstream id
// relayed in its place.
func TestClientTrackingRedirectInfoGivesClientID(t *testing.T) {
	onRedisAndLockproxy(t, func(t *testing.T, target, addr, _ string) {
		inv, data := dialRaw(t, addr), dialRaw(t, addr)
		id := clientID(t, inv)
		subscribeInvalidations(t, inv)
		trackRedirect(t, data, id)
		if got := data.do(t, "CLIENT GETREDIR"); got != ":"+id {
			t.Errorf("CLIENT GETREDIR = %q; want :%s", got, id)
		}
		if got := data.do(t, "CLIENT TRACKINGINFO"); got != "*6" {
			t.Fatalf("CLIENT TRACKINGINFO = %q", got)
		}
		var info []string
		for range 7 { // flags, *1, on, redirect, :id, prefixes, *0
			info = append(info, data.reply(t))
		}
		if info[3] != "redirect" || info[4] != ":"+id {
			t.Errorf("CLIENT TRACKINGINFO = %q; want redirect :%s", info, id)
		}
		if got := data.do(t, "MULTI"); got != "+OK" {
			t.Fatalf("MULTI = %q", got)
		}
		got := data.do(t, "CLIENT GETREDIR")
		data.do(t, "DISCARD")
		if target == "lockproxy" && !strings.HasPrefix(got, "-ERR 'client|getredir' is not allowed inside MULTI") {
			// EXEC would give the upstream's id.
			t.Errorf("CLIENT GETREDIR in MULTI = %q; want lockproxy's refusal", got)
		}
	})
}
