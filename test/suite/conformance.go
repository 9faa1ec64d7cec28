//go:build linux

package suite

import (
	"crypto/rand"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// rawCfg is the raw connections' waits: generous, a loaded machine and a
// ZooKeeper grant can take seconds.
var rawCfg = lockclient.Config{DialTimeout: 5 * time.Second, ReplyTimeout: 60 * time.Second}

// RunConformance checks PROTOCOL.md's "Lock commands" table option by
// option, through raw RESP2 and RESP3 connections, on lockproxies made by
// start: every backend must answer the same input with the same reply
// shape (map or flat array, integer or bulk, nil) and the same error
// text. The cases marked once check behaviour (waits, key sizes) whose
// replies have shapes the other cases check on both protocols: they run
// on RESP2 only, as they are the slow ones and CI time is short.
func RunConformance(t *testing.T, start Start) {
	addr := start(t)
	for _, proto := range []int{2, 3} {
		t.Run(fmt.Sprintf("RESP%d", proto), func(t *testing.T) {
			for _, sc := range conformance {
				if sc.once && proto != 2 {
					continue
				}
				t.Run(sc.name, func(t *testing.T) {
					rc := rawCfg.DialRaw(t, addr)
					if proto == 3 {
						if r := rc.Do("HELLO", "3"); r.Kind != '%' {
							t.Fatalf("HELLO 3 = %v", r)
						}
					}
					sc.run(t, rc, proto, "conf-"+lockclient.RandID())
				})
			}
		})
	}
}

// wantMap checks that r is a map (RESP3 %) or a flat array (RESP2 *)
// with exactly keys, in that order, each a bulk string.
func wantMap(t *testing.T, what string, r lockclient.Reply, proto int, keys ...string) map[string]lockclient.Reply {
	t.Helper()
	kind := byte('*')
	if proto == 3 {
		kind = '%'
	}
	if r.Kind != kind || r.Null || len(r.Elems) != 2*len(keys) {
		t.Fatalf("%s = %v; want a %c map of %v", what, r, kind, keys)
	}
	for i, k := range keys {
		if e := r.Elems[2*i]; e.Kind != '$' || e.Str != k {
			t.Errorf("%s: key %d = %v; want bulk %q", what, i, e, k)
		}
	}
	return r.Pairs()
}

func wantInt(t *testing.T, what string, r lockclient.Reply, lo, hi int64) int64 {
	t.Helper()
	if r.Kind != ':' || r.Int < lo || r.Int > hi {
		t.Errorf("%s = %v; want an integer in [%d, %d]", what, r, lo, hi)
	}
	return r.Int
}

func wantNil(t *testing.T, what string, r lockclient.Reply, proto int) {
	t.Helper()
	kind := byte('$')
	if proto == 3 {
		kind = '_'
	}
	if !r.Null || r.Kind != kind {
		t.Errorf("%s = %v (kind %q); want nil as %q", what, r, r.Kind, kind)
	}
}

func wantErr(t *testing.T, what string, r lockclient.Reply, text string) {
	t.Helper()
	if r.Kind != '-' || r.Str != text {
		t.Errorf("%s = %v; want -%s", what, r, text)
	}
}

// grant checks a LOCK/RLOCK grant's shape and returns its token and fence.
func grant(t *testing.T, what string, r lockclient.Reply, proto int, ttlMS int64) (string, int64) {
	t.Helper()
	return grantFence(t, what, r, proto, ttlMS, 1)
}

// grantFence is grant with the smallest fence allowed: RedLock documents
// a read grant's fence as the key's counter, 0 before any write grant.
func grantFence(t *testing.T, what string, r lockclient.Reply, proto int, ttlMS, minFence int64) (string, int64) {
	t.Helper()
	m := wantMap(t, what, r, proto, "token", "validity_ms", "fence")
	if m["token"].Kind != '$' || m["token"].Str == "" {
		t.Errorf("%s: token %v; want a bulk string", what, m["token"])
	}
	wantInt(t, what+" validity_ms", m["validity_ms"], 1, ttlMS)
	wantInt(t, what+" fence", m["fence"], minFence, 1<<62)
	return m["token"].Str, m["fence"].Int
}

// randBytes is n random bytes that do not start with the reserved token
// prefix.
func randBytes(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	if n > 0 {
		b[0] = 0xff
	}
	return string(b)
}

func randPrintable(n int) string {
	const abc = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := []byte(randBytes(n))
	for i := range b {
		b[i] = abc[int(b[i])%len(abc)]
	}
	return string(b)
}

var conformance = []struct {
	name string
	once bool // RESP2 only: see RunConformance
	run  func(t *testing.T, rc *lockclient.RawConn, proto int, key string)
}{
	{"LOCK UNLOCK shapes", false, func(t *testing.T, rc *lockclient.RawConn, proto int, key string) {
		tok, _ := grant(t, "LOCK PX 10000", rc.Do("LOCK", key, "PX", "10000"), proto, 10000)
		wantNil(t, "LOCK of a held key", rc.Do("LOCK", key, "PX", "10000"), proto)
		wantInt(t, "UNLOCK by another token", rc.Do("UNLOCK", key, "someone-else"), 0, 0)
		wantInt(t, "UNLOCK", rc.Do("UNLOCK", key, tok), 1, 1)
		wantInt(t, "second UNLOCK", rc.Do("UNLOCK", key, tok), 0, 0)
	}},
	{"EX, bare TTL, default lease", false, func(t *testing.T, rc *lockclient.RawConn, proto int, key string) {
		tok, _ := grant(t, "LOCK ex 5", rc.Do("lock", key, "ex", "5"), proto, 5000)
		wantInt(t, "UNLOCK", rc.Do("UNLOCK", key, tok), 1, 1)
		tok, _ = grant(t, "LOCK 3000", rc.Do("LOCK", key, "3000"), proto, 3000)
		wantInt(t, "UNLOCK", rc.Do("UNLOCK", key, tok), 1, 1)
		tok, _ = grant(t, "LOCK (default lease)", rc.Do("LOCK", key), proto, 30000)
		wantInt(t, "UNLOCK", rc.Do("UNLOCK", key, tok), 1, 1)
	}},
	{"options in any order", false, func(t *testing.T, rc *lockclient.RawConn, proto int, key string) {
		tok, _ := grant(t, "LOCK TOKEN WAIT PX", rc.Do("LOCK", key, "token", "t1", "wait", "10", "px", "4000"), proto, 4000)
		if tok != "t1" {
			t.Errorf("TOKEN t1 granted token %q", tok)
		}
		wantInt(t, "UNLOCK", rc.Do("UNLOCK", key, "t1"), 1, 1)
	}},
	{"RENEW", false, func(t *testing.T, rc *lockclient.RawConn, proto int, key string) {
		tok, _ := grant(t, "LOCK PX 3000", rc.Do("LOCK", key, "PX", "3000"), proto, 3000)
		wantInt(t, "RENEW EX 8", rc.Do("RENEW", key, tok, "EX", "8"), 1, 8000)
		wantInt(t, "RENEW px 6000", rc.Do("RENEW", key, tok, "px", "6000"), 1, 6000)
		wantInt(t, "RENEW by another token", rc.Do("RENEW", key, "nope", "PX", "6000"), 0, 0)
		wantInt(t, "UNLOCK", rc.Do("UNLOCK", key, tok), 1, 1)
		wantInt(t, "RENEW after UNLOCK", rc.Do("RENEW", key, tok, "PX", "6000"), 0, 0)
	}},
	{"WAIT runs out", true, func(t *testing.T, rc *lockclient.RawConn, proto int, key string) {
		tok, _ := grant(t, "LOCK PX 20000", rc.Do("LOCK", key, "PX", "20000"), proto, 20000)
		start := time.Now()
		wantNil(t, "LOCK WAIT 300 of a held key", rc.Do("LOCK", key, "PX", "1000", "WAIT", "300"), proto)
		if d := time.Since(start); d < 250*time.Millisecond {
			t.Errorf("LOCK … WAIT 300 answered after %v; want after about 300 ms", d)
		}
		wantInt(t, "UNLOCK", rc.Do("UNLOCK", key, tok), 1, 1)
	}},
	{"reentrancy", false, func(t *testing.T, rc *lockclient.RawConn, proto int, key string) {
		_, f1 := grant(t, "LOCK TOKEN r", rc.Do("LOCK", key, "PX", "10000", "TOKEN", "r"), proto, 10000)
		_, f2 := grant(t, "again LOCK TOKEN r", rc.Do("LOCK", key, "PX", "10000", "TOKEN", "r"), proto, 10000)
		if f1 != f2 {
			t.Errorf("reentrant fence %d; want %d", f2, f1)
		}
		wantInt(t, "UNLOCK 1", rc.Do("UNLOCK", key, "r"), 1, 1)
		wantInt(t, "UNLOCK 2", rc.Do("UNLOCK", key, "r"), 1, 1)
		wantInt(t, "UNLOCK 3", rc.Do("UNLOCK", key, "r"), 0, 0)
	}},
	{"RLOCK and LOCKINFO shapes", false, func(t *testing.T, rc *lockclient.RawConn, proto int, key string) {
		wantNil(t, "LOCKINFO of a free key", rc.Do("LOCKINFO", key), proto)
		_, rf := grantFence(t, "RLOCK", rc.Do("RLOCK", key, "PX", "10000", "TOKEN", "rd1"), proto, 10000, 0)
		grantFence(t, "RLOCK 2", rc.Do("rlock", key, "PX", "10000", "TOKEN", "rd2"), proto, 10000, 0)
		wantNil(t, "LOCK while read", rc.Do("LOCK", key, "PX", "10000"), proto)
		m := wantMap(t, "LOCKINFO", rc.Do("LOCKINFO", key, "TOKEN", "rd1"), proto, "mode", "holders", "ttl_ms", "fence", "waiters")
		if m["mode"].Kind != '$' || m["mode"].Str != "read" {
			t.Errorf("LOCKINFO mode %v; want bulk read", m["mode"])
		}
		wantInt(t, "LOCKINFO ttl_ms", m["ttl_ms"], 1, 10000)
		if f := wantInt(t, "LOCKINFO fence", m["fence"], 0, 1<<62); f < rf {
			t.Errorf("LOCKINFO fence %d; want at least the first RLOCK's %d", f, rf)
		}
		wantInt(t, "LOCKINFO waiters", m["waiters"], 0, 0)
		if h := m["holders"]; h.Kind != '*' || len(h.Elems) != 2 {
			t.Fatalf("LOCKINFO holders %v; want an array of 2", h)
		}
		var shown []string
		for i, h := range m["holders"].Elems {
			hm := wantMap(t, fmt.Sprintf("holder %d", i), h, proto, "token", "holds", "ttl_ms")
			wantInt(t, "holds", hm["holds"], 1, 1)
			wantInt(t, "holder ttl_ms", hm["ttl_ms"], 1, 10000)
			shown = append(shown, hm["token"].Str)
		}
		if !(shown[0] == "rd1" && strings.HasPrefix(shown[1], "sha256:")) && !(shown[1] == "rd1" && strings.HasPrefix(shown[0], "sha256:")) {
			t.Errorf("holders' tokens %q; want rd1 in full and the other as sha256:…", shown)
		}
		wantInt(t, "UNLOCK rd1", rc.Do("UNLOCK", key, "rd1"), 1, 1)
		wantInt(t, "UNLOCK rd2", rc.Do("UNLOCK", key, "rd2"), 1, 1)
		wantNil(t, "LOCKINFO after the UNLOCKs", rc.Do("LOCKINFO", key), proto)
	}},
	{"RENEW and UNLOCK of read holds", false, func(t *testing.T, rc *lockclient.RawConn, proto int, key string) {
		grantFence(t, "RLOCK", rc.Do("RLOCK", key, "PX", "3000", "TOKEN", "r"), proto, 3000, 0)
		grantFence(t, "RLOCK again", rc.Do("RLOCK", key, "PX", "3000", "TOKEN", "r"), proto, 3000, 0)
		m := wantMap(t, "LOCKINFO", rc.Do("LOCKINFO", key, "TOKEN", "r"), proto, "mode", "holders", "ttl_ms", "fence", "waiters")
		if h := m["holders"]; len(h.Elems) != 1 || h.Elems[0].Pairs()["holds"].Int != 2 {
			t.Errorf("LOCKINFO holders after two RLOCKs of one token = %v; want one holder with 2 holds", h)
		}
		wantInt(t, "RENEW of a read hold", rc.Do("RENEW", key, "r", "PX", "8000"), 1, 8000)
		wantInt(t, "UNLOCK 1", rc.Do("UNLOCK", key, "r"), 1, 1)
		wantInt(t, "UNLOCK 2", rc.Do("UNLOCK", key, "r"), 1, 1)
		wantInt(t, "UNLOCK 3", rc.Do("UNLOCK", key, "r"), 0, 0)
		wantNil(t, "LOCKINFO after", rc.Do("LOCKINFO", key), proto)
	}},
	{"waiters and RLOCK WAIT", true, func(t *testing.T, rc *lockclient.RawConn, proto int, key string) {
		tok, _ := grant(t, "LOCK", rc.Do("LOCK", key, "PX", "20000"), proto, 20000)
		w := rawCfg.DialRaw(t, rc.Conn.RemoteAddr().String())
		if proto == 3 {
			w.Do("HELLO", "3")
		}
		w.Send("RLOCK", key, "PX", "1000", "WAIT", "1500")
		var waiters int64
		for i := 0; i < 40; i++ {
			m := wantMap(t, "LOCKINFO", rc.Do("LOCKINFO", key), proto, "mode", "holders", "ttl_ms", "fence", "waiters")
			if waiters = m["waiters"].Int; waiters == 1 {
				break
			}
			time.Sleep(25 * time.Millisecond)
		}
		if waiters != 1 {
			t.Errorf("LOCKINFO waiters = %d with one RLOCK … WAIT blocked; want 1", waiters)
		}
		r, err := w.Read()
		if err != nil {
			t.Fatal(err)
		}
		wantNil(t, "RLOCK WAIT 1500 on a write-held key", r, proto)
		wantInt(t, "UNLOCK", rc.Do("UNLOCK", key, tok), 1, 1)
	}},
	{"MAXHOLD ends a KEEPALIVE lock, then LOCKLOST", false, func(t *testing.T, rc *lockclient.RawConn, proto int, key string) {
		start := time.Now()
		// PX 1000, not shorter: the node timeout is 5 % of the TTL, and
		// the watchdog's renewals must get through a loaded CI host
		// (with PX 300, 15 ms timeouts lost the lease before MAXHOLD).
		tok, _ := grant(t, "LOCK KEEPALIVE MAXHOLD", rc.Do("LOCK", key, "PX", "1000", "KEEPALIVE", "MAXHOLD", "2000"), proto, 1000)
		b := rawCfg.DialRaw(t, rc.Conn.RemoteAddr().String())
		if proto == 3 {
			b.Do("HELLO", "3")
		}
		btok, _ := grant(t, "rival LOCK WAIT", b.Do("LOCK", key, "PX", "5000", "WAIT", "6000"), proto, 5000)
		if d := time.Since(start); d < 1950*time.Millisecond || d > 5*time.Second {
			t.Errorf("the rival was granted %v after the MAXHOLD 2000 lock; want soon after 2000 ms", d)
		}
		r := rc.Do("RENEW", key, tok, "PX", "1000")
		if proto == 3 {
			if r.Kind != '>' || len(r.Elems) != 3 || r.Elems[0].Str != "lock-lost" || r.Elems[1].Str != key || r.Elems[2].Str != tok {
				t.Errorf("RESP3: first frame after the loss = %v; want the push [lock-lost %s %s]", r, key, tok)
			} else {
				var err error
				if r, err = rc.Read(); err != nil {
					t.Fatal(err)
				}
			}
		}
		if r.Kind != '-' || !strings.HasPrefix(r.Str, "LOCKLOST lock on '"+key+"' was lost: ") {
			t.Errorf("RENEW after MAXHOLD ran out = %v; want -LOCKLOST lock on '%s' was lost: …", r, key)
		}
		wantInt(t, "RENEW after the LOCKLOST", rc.Do("RENEW", key, tok, "PX", "1000"), 0, 0)
		wantInt(t, "rival UNLOCK", b.Do("UNLOCK", key, btok), 1, 1)
	}},
	{"reentry with a shorter TTL", false, func(t *testing.T, rc *lockclient.RawConn, proto int, key string) {
		grant(t, "LOCK PX 9000 TOKEN r", rc.Do("LOCK", key, "PX", "9000", "TOKEN", "r"), proto, 9000)
		// PROTOCOL.md: validity_ms = ttl − time spent acquiring − drift.
		grant(t, "LOCK PX 1000 TOKEN r (reentry)", rc.Do("LOCK", key, "PX", "1000", "TOKEN", "r"), proto, 1000)
		m := wantMap(t, "LOCKINFO", rc.Do("LOCKINFO", key, "TOKEN", "r"), proto, "mode", "holders", "ttl_ms", "fence", "waiters")
		wantInt(t, "LOCKINFO ttl_ms after a shorter reentry (never shortened)", m["ttl_ms"], 5000, 9000)
		wantInt(t, "RENEW PX 1000 (sets the lease exactly)", rc.Do("RENEW", key, "r", "PX", "1000"), 1, 1000)
		m = wantMap(t, "LOCKINFO", rc.Do("LOCKINFO", key, "TOKEN", "r"), proto, "mode", "holders", "ttl_ms", "fence", "waiters")
		wantInt(t, "LOCKINFO ttl_ms after RENEW PX 1000", m["ttl_ms"], 1, 1000)
		rc.Do("UNLOCK", key, "r")
		rc.Do("UNLOCK", key, "r")
	}},
	{"binary key and token", false, func(t *testing.T, rc *lockclient.RawConn, proto int, key string) {
		bkey := key + "\x00\r\n" + randBytes(4096)
		btok := randBytes(256) // limits.max_token_bytes
		tok, _ := grant(t, "LOCK binary", rc.Do("LOCK", bkey, "PX", "10000", "TOKEN", btok), proto, 10000)
		if tok != btok {
			t.Errorf("LOCK TOKEN <256 random bytes> granted another token (%d bytes)", len(tok))
		}
		wantNil(t, "LOCK binary by another", rc.Do("LOCK", bkey, "PX", "10000"), proto)
		m := wantMap(t, "LOCKINFO binary", rc.Do("LOCKINFO", bkey, "TOKEN", btok), proto, "mode", "holders", "ttl_ms", "fence", "waiters")
		if h := m["holders"]; len(h.Elems) != 1 || h.Elems[0].Pairs()["token"].Str != btok {
			t.Errorf("LOCKINFO binary holders %v; want the token in full", h)
		}
		wantInt(t, "RENEW binary", rc.Do("RENEW", bkey, btok, "PX", "10000"), 1, 10000)
		wantInt(t, "UNLOCK binary", rc.Do("UNLOCK", bkey, btok), 1, 1)
	}},
	{"longest key", true, func(t *testing.T, rc *lockclient.RawConn, proto int, key string) {
		// limits.max_key_bytes is 65536 by default: a key of that many
		// bytes is a key like any other.
		long := key + randPrintable(65536-len(key))
		tok, _ := grant(t, "LOCK <65536-byte key>", rc.Do("LOCK", long, "PX", "10000"), proto, 10000)
		if tok != "" {
			wantNil(t, "LOCK <65536-byte key> again", rc.Do("LOCK", long, "PX", "10000"), proto)
			wantInt(t, "UNLOCK <65536-byte key>", rc.Do("UNLOCK", long, tok), 1, 1)
		}
		wantErr(t, "LOCK <65537-byte key>", rc.Do("LOCK", long+"x", "PX", "10000"), "ERR key too long")
	}},
	{"a 3000-byte key", true, func(t *testing.T, rc *lockclient.RawConn, proto int, key string) {
		long := key + randPrintable(3000-len(key))
		tok, _ := grant(t, "LOCK <3000-byte key>", rc.Do("LOCK", long, "PX", "10000"), proto, 10000)
		if tok != "" {
			wantInt(t, "UNLOCK <3000-byte key>", rc.Do("UNLOCK", long, tok), 1, 1)
		}
	}},
	{"errors", false, func(t *testing.T, rc *lockclient.RawConn, proto int, key string) {
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"LOCK"}, "ERR wrong number of arguments for 'lock' command"},
			{[]string{"RLOCK"}, "ERR wrong number of arguments for 'rlock' command"},
			{[]string{"UNLOCK", key}, "ERR wrong number of arguments for 'unlock' command"},
			{[]string{"UNLOCK", key, "t", "x"}, "ERR wrong number of arguments for 'unlock' command"},
			{[]string{"RENEW", key, "t", "PX"}, "ERR wrong number of arguments for 'renew' command"},
			{[]string{"LOCKINFO"}, "ERR wrong number of arguments for 'lockinfo' command"},
			{[]string{"LOCK", key, "PX"}, "ERR syntax error"},
			{[]string{"LOCK", key, "PX", "100", "EX", "1"}, "ERR syntax error"},
			{[]string{"LOCK", key, "NX"}, "ERR syntax error"},
			{[]string{"LOCK", key, "PX", "abc"}, "ERR value is not an integer or out of range"},
			{[]string{"LOCK", key, "PX", "0"}, "ERR invalid expire time in 'lock' command"},
			{[]string{"RLOCK", key, "EX", "-1"}, "ERR invalid expire time in 'rlock' command"},
			{[]string{"RENEW", key, "t", "PX", "0"}, "ERR invalid expire time in 'renew' command"},
			{[]string{"RENEW", key, "t", "XX", "10"}, "ERR syntax error"},
			{[]string{"LOCK", key, "PX", "600001"}, "ERR TTL 600001 ms is above the maximum of 600000 ms (locks.max_ttl)"},
			{[]string{"LOCK", "", "PX", "100"}, "ERR empty key: lock keys must be at least one byte"},
			{[]string{"UNLOCK", key, ""}, "ERR empty token"},
			{[]string{"LOCK", key, "TOKEN", strings.Repeat("t", 257)}, "ERR token too long"},
			{[]string{"LOCKINFO", key, "TOKEN"}, "ERR syntax error"},
		} {
			wantErr(t, strconv.Quote(strings.Join(tc.args, " ")), rc.Do(tc.args...), tc.want)
		}
		if r := rc.Do("PING"); r.Str != "PONG" {
			t.Errorf("PING after the errors = %v", r)
		}
	}},
}
