package clients

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

var raw = lockclient.Config{DialTimeout: 5 * time.Second, ReplyTimeout: 5 * time.Second}

// TestRelaySubscribeThenLock: a connection that subscribed and then
// unsubscribed leaves pub/sub mode and is served by lockproxy again. Before,
// SUBSCRIBE's count was taken for a shard subscription's, the mode never
// ended, and every later command, LOCK too, went to the upstream.
func TestRelaySubscribeThenLock(t *testing.T) {
	e := start(t)
	for _, kind := range [][2]string{{"SUBSCRIBE", "UNSUBSCRIBE"}, {"PSUBSCRIBE", "PUNSUBSCRIBE"}, {"SSUBSCRIBE", "SUNSUBSCRIBE"}} {
		c := raw.DialRaw(t, e.proxy)
		if r := c.Do(kind[0], "ch"); r.Kind != '*' || len(r.Elems) != 3 {
			t.Fatalf("%s = %v", kind[0], r)
		}
		if r := c.Do(kind[1], "ch"); r.Kind != '*' || len(r.Elems) != 3 || r.Elems[2].Int != 0 {
			t.Fatalf("%s = %v", kind[1], r)
		}
		if r := c.Do("LOCK", "after-"+kind[0], "PX", "5000"); r.Kind != '*' || len(r.Elems) != 6 {
			t.Errorf("LOCK after %s and %s = %v; want a grant", kind[0], kind[1], r)
		}
	}
}

// TestRelayPubsubModeRefusals: in pub/sub mode (RESP3 lets a subscribed
// connection send any command) every upstream frame goes to the client as
// it comes, so what lockproxy does around a command cannot happen: a lock
// command, a state change, a transaction, KEYS and SCAN are refused until
// the client unsubscribes; plain commands go through. Before, a SELECT
// there stayed on the connection, which went back to the shared pool in
// another database; KEYS showed lockproxy's keys; LOCK reached the
// upstream as an unknown command.
func TestRelayPubsubModeRefusals(t *testing.T) {
	e := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	up := e.up.Client(t)
	if err := up.Set(ctx, "lockproxy:secret", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	c := raw.DialRaw(t, e.proxy)
	if r := c.Do("HELLO", "3"); r.Kind != '%' {
		t.Fatalf("HELLO 3 = %v", r)
	}
	if r := c.Do("PSUBSCRIBE", "ch*"); r.Kind != '>' {
		t.Fatalf("PSUBSCRIBE = %v", r)
	}
	for _, args := range [][]string{
		{"SELECT", "5"}, {"HELLO", "2"}, {"CLIENT", "TRACKING", "ON"}, {"CLIENT", "SETNAME", "x"},
		{"MULTI"}, {"WATCH", "k"}, {"KEYS", "*"}, {"SCAN", "0"}, {"LOCK", "k", "PX", "5000"},
		{"BLPOP", "l", "1"},
	} {
		if r := c.Do(args...); r.Kind != '-' || !strings.Contains(r.Str, "not allowed in pub/sub mode") {
			t.Errorf("%v in pub/sub mode = %v; want the refusal", args, r)
		}
	}
	if r := c.Do("SET", "plain", "v"); r.Kind != '+' || r.Str != "OK" {
		t.Errorf("SET in pub/sub mode = %v; want it relayed", r)
	}
	if r := c.Do("PUNSUBSCRIBE", "ch*"); r.Kind != '>' {
		t.Fatalf("PUNSUBSCRIBE = %v", r)
	}
	if r := c.Do("LOCK", "k", "PX", "5000"); r.Kind != '%' {
		t.Errorf("LOCK after leaving pub/sub mode = %v; want a grant", r)
	}
	// Transactions of other clients, on whichever pooled connection they
	// get, run in database 0.
	other := proxyClient(t, e, 2)
	for i := range 3 {
		conn := other.Conn()
		if _, err := conn.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, "victim", i, 0)
			return nil
		}); err != nil {
			t.Errorf("transaction %d: %v", i, err)
		}
		conn.Close()
	}
	if v, err := up.Get(ctx, "victim").Result(); err != nil || v != "2" {
		t.Errorf("database 0 victim = %q, %v; want 2", v, err)
	}
}

// TestRelayKeysBehindOtherCommands: KEYS and SCAN pipelined behind other
// relayed commands are filtered, and every reply stays with its command.
// Before, the filter read the first pending reply instead of KEYS's: the
// lock prefix showed, and replies shifted by one from there on.
func TestRelayKeysBehindOtherCommands(t *testing.T) {
	e := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	up := e.up.Client(t)
	if err := up.Set(ctx, "lockproxy:secret", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := up.RPush(ctx, "l", "lockproxy:v").Err(); err != nil {
		t.Fatal(err)
	}
	c := raw.DialRaw(t, e.proxy)
	c.Write(lockclient.Encode("GET", "nosuch") + lockclient.Encode("LRANGE", "l", "0", "-1") +
		lockclient.Encode("KEYS", "*") + lockclient.Encode("SCAN", "0", "COUNT", "100") + lockclient.Encode("PING"))
	got := replyTexts(readReplies(t, c, 5))
	want := []string{`(nil)`, `*[$"lockproxy:v"]`, `*[$"l"]`, `*[$"0" *[$"l"]]`, `+"PONG"`}
	if strings.Join(got, " | ") != strings.Join(want, " | ") {
		t.Errorf("pipelined replies:\n%q\nwant\n%q", got, want)
	}
}

// TestRelayTrackingPushOrder: with CLIENT TRACKING (RESP3), an
// invalidation Redis sends after a reply reaches the client after that
// reply, never before it: a client-side cache that saw the invalidation
// first would keep the old value for good. Before, the push went out as
// soon as the upstream connection's reader saw it, ahead of the replies
// the client's goroutine had not written yet.
func TestRelayTrackingPushOrder(t *testing.T) {
	e := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	up := e.up.Client(t)
	c := raw.DialRaw(t, e.proxy)
	if r := c.Do("HELLO", "3"); r.Kind != '%' {
		t.Fatalf("HELLO 3 = %v", r)
	}
	if r := c.Do("CLIENT", "TRACKING", "ON"); r.Kind != '+' {
		t.Fatalf("CLIENT TRACKING ON = %v", r)
	}
	for i := range 20 {
		key := "tracked" + strconv.Itoa(i)
		if err := up.Set(ctx, key, "old", 0).Err(); err != nil {
			t.Fatal(err)
		}
		c.Write(lockclient.Encode("GET", key) + lockclient.Encode("SET", key, "new") + lockclient.Encode("PING"))
		got := replyTexts(readReplies(t, c, 4))
		inv := `>[$"invalidate" *[$"` + key + `"]]`
		if got[0] != `$"old"` || got[1] != `+"OK"` || !(got[2] == inv && got[3] == `+"PONG"` || got[2] == `+"PONG"` && got[3] == inv) {
			t.Fatalf("round %d: %q; want the old value, OK, then the invalidation (before or after PONG)", i, got)
		}
	}
}

// TestRelayLongErrorLine: Redis does not bound a simple string or an
// error (a script's error_reply can be any length): a 70,000-byte one is
// relayed whole, and the shared upstream connection goes on serving.
// Before, a line over 64 KiB was taken for a broken stream: the shared
// connection was dropped, and every command in flight on it failed.
func TestRelayLongErrorLine(t *testing.T) {
	e := start(t)
	c := raw.DialRaw(t, e.proxy)
	c.Write(lockclient.Encode("SET", "a", "1") +
		lockclient.Encode("EVAL", "return redis.error_reply(string.rep('x', 70000))", "0") +
		lockclient.Encode("GET", "a"))
	got := readReplies(t, c, 3)
	if got[0].Str != "OK" || got[1].Kind != '-' || !strings.Contains(got[1].Str, strings.Repeat("x", 70000)) || got[2].Str != "1" {
		t.Errorf("replies: %.40v, %c of %d bytes, %.40v; want OK, the 70,000-byte error, 1", got[0], got[1].Kind, len(got[1].Str), got[2])
	}
}

// readReplies reads n replies off c, failing t when one does not come
// within 10 s.
func readReplies(t *testing.T, c *lockclient.RawConn, n int) []lockclient.Reply {
	t.Helper()
	var got []lockclient.Reply
	for range n {
		r, err := c.ReadWithin(10 * time.Second)
		if err != nil {
			t.Fatalf("after %v: %v", replyTexts(got), err)
		}
		got = append(got, r)
	}
	return got
}

func replyTexts(rs []lockclient.Reply) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.String()
	}
	return out
}
