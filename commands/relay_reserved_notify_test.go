package commands

import (
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
)

// TestPubSubNeverNamesLockKeys: relayed commands may neither touch nor
// list keys under the lock key prefix, and a subscriber does not learn
// of them either. With keyspace notifications on upstream (the
// application's setting, on an upstream that is also a lock node), a
// keyspace channel of such a key, or a key-event message naming one,
// reached the client (found by a review); now they are not passed on,
// while notifications about other keys are.
func TestPubSubNeverNamesLockKeys(t *testing.T) {
	up := harness.StartRedis(t, harness.RedisOptions{Args: []string{"--notify-keyspace-events", "KEA"}})
	addr := defaultsProxy(t, up, 1)
	for _, sub := range []string{"PSUBSCRIBE __keyspace@0__:*", "SUBSCRIBE __keyevent@0__:set", "PSUBSCRIBE *"} {
		a := dialFrames(t, addr)
		if r := a.do(sub); !strings.Contains(r, "subscribe") {
			t.Fatalf("%s: %s", sub, r)
		}
		direct := dialFrames(t, up.Addr)
		for _, k := range []string{"lockproxy:lock:orders:42", "app:orders:42"} {
			if r := direct.do("SET " + k + " v"); r != "+OK" {
				t.Fatalf("direct SET %s: %s", k, r)
			}
		}
		var got []string
		for {
			f, err := a.read(300 * time.Millisecond)
			if err != nil {
				break
			}
			got = append(got, f)
		}
		seen := false
		for _, f := range got {
			if strings.Contains(f, "lockproxy:") {
				t.Errorf("%s: a relayed subscriber learned a key under the lock prefix: %s", sub, f)
			}
			seen = seen || strings.Contains(f, "app:orders:42")
		}
		if !seen {
			t.Errorf("%s: no notification about app:orders:42 (got %q)", sub, got)
		}
	}
}

// TestTrackingBcastCannotReachLockPrefix: CLIENT TRACKING ON BCAST tells
// the client the name of every key written under its PREFIXes (all keys
// without one), lock keys included (found by a review). It is refused
// without PREFIX and with a PREFIX a lock key may start with, and works
// with one outside the lock prefix.
func TestTrackingBcastCannotReachLockPrefix(t *testing.T) {
	up := harness.StartRedis(t, harness.RedisOptions{})
	addr := defaultsProxy(t, up, 1)
	a := dialFrames(t, addr)
	if r := a.do("HELLO 3"); !strings.HasPrefix(r, "%[") {
		t.Fatalf("HELLO 3: %s", r)
	}
	for _, cmd := range []string{"CLIENT TRACKING ON BCAST", "CLIENT TRACKING ON BCAST PREFIX lockproxy:lock:",
		"CLIENT TRACKING ON BCAST PREFIX app: PREFIX lock"} {
		if r := a.do(cmd); !strings.HasPrefix(r, "-ERR CLIENT TRACKING BCAST") {
			t.Errorf("%s: %s; want refused", cmd, r)
		}
	}
	if r := a.do("CLIENT TRACKING ON BCAST PREFIX app:"); r != "+OK" {
		t.Fatalf("CLIENT TRACKING ON BCAST PREFIX app: %s", r)
	}
	direct := dialFrames(t, up.Addr)
	for _, k := range []string{"lockproxy:lock:orders:42", "app:orders:42"} {
		if r := direct.do("SET " + k + " v"); r != "+OK" {
			t.Fatalf("direct SET %s: %s", k, r)
		}
	}
	got, _ := a.read(time.Second)
	if !strings.Contains(got, "app:orders:42") || strings.Contains(got, "lockproxy:") {
		t.Errorf("invalidation %q; want app:orders:42 alone", got)
	}
	if r := a.do("READONLY"); !strings.HasPrefix(r, "-ERR 'readonly' is not supported through lockproxy") {
		t.Errorf("READONLY: %s; want refused (it would set the mode of a shared connection)", r)
	}
}

// TestKeyLimitedUserBcastInsidePatterns: a user limited to app:* may turn
// on broadcast tracking only for PREFIXes its patterns cover: without
// one, or with another, it would be told the names of keys it may not
// touch (found by a review).
func TestKeyLimitedUserBcastInsidePatterns(t *testing.T) {
	proxy, _ := proxyWithUpstream(t, Options{Password: "pw",
		Permissions: map[string]Permission{"default": {Commands: []string{"+@all"}, Keys: []string{"app:*"}}}})
	a := dialFrames(t, proxy)
	if r := a.do("HELLO 3 AUTH default pw"); !strings.HasPrefix(r, "%[") {
		t.Fatalf("HELLO: %s", r)
	}
	for _, cmd := range []string{"CLIENT TRACKING ON BCAST", "CLIENT TRACKING ON BCAST PREFIX other:",
		"CLIENT TRACKING ON BCAST PREFIX app:x PREFIX ap"} {
		if r := a.do(cmd); !strings.HasPrefix(r, "-NOPERM") {
			t.Errorf("%s: %s; want -NOPERM", cmd, r)
		}
	}
	if r := a.do("CLIENT TRACKING ON BCAST PREFIX app:orders:"); r != "+OK" {
		t.Errorf("CLIENT TRACKING ON BCAST PREFIX app:orders: %s; want +OK", r)
	}
}
