package e2e

import (
	"fmt"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// PROTOCOL.md, LOCKINFO key [TOKEN t]: a map of mode (write/read),
// holders (token, holds, ttl_ms each; the token in full only to a caller
// that names it), ttl_ms, fence, waiters (on this instance); nil when free.

var hiddenTokenRE = regexp.MustCompile(`^sha256:[0-9a-f]{16}$`)

// TestLockInfoShape reads LOCKINFO on raw connections: a flat array under
// RESP2, a map under RESP3, with the fields in the documented order and
// types, and the RESP null of each protocol when the key is free.
func TestLockInfoShape(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	in := startSemInstance(t, cl)
	for _, proto := range []int{2, 3} {
		t.Run(fmt.Sprintf("resp%d", proto), func(t *testing.T) {
			t.Parallel()
			rc := lc.DialRaw(t, in.addr)
			mapKind, null := byte('*'), "$-1 or *-1"
			if proto == 3 {
				if r := rc.Do("HELLO", "3"); r.Kind != '%' {
					t.Fatalf("HELLO 3 = %v; want a map", r)
				}
				mapKind, null = '%', "_"
			}
			key, tok := "info-shape-"+lockclient.RandID(), "tok-"+lockclient.RandID()
			if r := rc.Do("LOCKINFO", key); !r.Null || (proto == 3 && r.Kind != '_') {
				t.Errorf("LOCKINFO of a free key = %v; want the RESP%d null (%s)", r, proto, null)
			}
			rawGrant(t, rc, key, "PX", "5000", "TOKEN", tok)
			rawGrant(t, rc, key, "PX", "5000", "TOKEN", tok)

			r := rc.Do("LOCKINFO", key, "TOKEN", tok)
			if r.Kind != mapKind || len(r.Elems) != 10 {
				t.Fatalf("LOCKINFO = %v; want %c with 5 key/value pairs", r, mapKind)
			}
			want := []struct {
				key  string
				kind byte
			}{{"mode", '$'}, {"holders", '*'}, {"ttl_ms", ':'}, {"fence", ':'}, {"waiters", ':'}}
			for i, w := range want {
				k, v := r.Elems[2*i], r.Elems[2*i+1]
				if k.Kind != '$' || k.Str != w.key || v.Kind != w.kind {
					t.Errorf("LOCKINFO field %d = %v: %v; want %q of type %c", i, k, v, w.key, w.kind)
				}
			}
			f := r.Pairs()
			if f["mode"].Str != "write" || f["waiters"].Int != 0 || f["ttl_ms"].Int <= 0 || f["ttl_ms"].Int > 5000 || f["fence"].Int <= 0 {
				t.Errorf("LOCKINFO = %v; want mode write, ttl_ms in (0, 5000], a fence, 0 waiters", r)
			}
			hs := f["holders"].Elems
			if len(hs) != 1 || hs[0].Kind != mapKind || len(hs[0].Elems) != 6 {
				t.Fatalf("LOCKINFO holders = %v; want one %c of 3 pairs", f["holders"], mapKind)
			}
			for i, w := range []string{"token", "holds", "ttl_ms"} {
				if k := hs[0].Elems[2*i]; k.Str != w {
					t.Errorf("holder field %d = %v; want %q", i, k, w)
				}
			}
			h := hs[0].Pairs()
			if h["token"].Kind != '$' || h["token"].Str != tok || h["holds"].Int != 2 || h["ttl_ms"].Int <= 0 || h["ttl_ms"].Int > 5000 {
				t.Errorf("LOCKINFO holder = %v; want token %q, holds 2, ttl_ms in (0, 5000]", hs[0], tok)
			}
		})
	}
}

// TestLockInfoHolders checks LOCKINFO's content through go-redis (RESP2
// and RESP3): token hiding, hold counts, the TTL as a majority sees it,
// the fence, read mode.
func TestLockInfoHolders(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	in := startSemInstance(t, cl)
	for _, proto := range []int{2, 3} {
		t.Run(fmt.Sprintf("resp%d", proto), func(t *testing.T) {
			t.Parallel()
			c := lc.NewClient(t, in.addr, proto)
			key, tok := "info-"+lockclient.RandID(), "writer-"+lockclient.RandID()
			if li, held := lockInfoOf(t, c, key, ""); held {
				t.Fatalf("LOCKINFO of a free key = %+v; want nil", li)
			}

			// Write mode, three holds.
			const ttl = 3000
			g := lc.MustLock(t, c, key, "PX", ttl, "TOKEN", tok)
			lc.MustLock(t, c, key, "PX", ttl, "TOKEN", tok)
			lc.MustLock(t, c, key, "PX", ttl, "TOKEN", tok)
			views := []struct {
				name, token, shown string
			}{
				{"no TOKEN", "", hiddenToken(tok)},
				{"the holder's TOKEN", tok, tok},
				{"another TOKEN", "someone-else", hiddenToken(tok)},
			}
			for _, v := range views {
				li := mustLockInfo(t, c, key, v.token)
				if li.Mode != "write" || len(li.Holders) != 1 || li.Fence != g.Fence || li.Waiters != 0 {
					t.Errorf("%s: LOCKINFO = %+v; want mode write, one holder, fence %d, 0 waiters", v.name, li, g.Fence)
					continue
				}
				h := li.Holders[0]
				if h.Token != v.shown || h.Holds != 3 {
					t.Errorf("%s: holder = %+v; want token %q with 3 holds", v.name, h, v.shown)
				}
				if li.TTLMS <= 0 || li.TTLMS > ttl || h.TTLMS <= 0 || h.TTLMS > ttl {
					t.Errorf("%s: ttl_ms %d, holder ttl_ms %d; want both in (0, %d]", v.name, li.TTLMS, h.TTLMS, ttl)
				}
				if v.token != tok && !hiddenTokenRE.MatchString(h.Token) {
					t.Errorf("%s: holder token %q; want sha256: and 16 hex digits", v.name, h.Token)
				}
			}
			for i := 0; i < 3; i++ {
				lc.Unlock(t, c, key, tok)
			}

			// Read mode: two readers with their own leases; ttl_ms is the
			// shorter one.
			r1, r2 := "reader-1-"+lockclient.RandID(), "reader-2-"+lockclient.RandID()
			lc.MustRLock(t, c, key, "PX", 2000, "TOKEN", r1)
			lc.MustRLock(t, c, key, "PX", 8000, "TOKEN", r2)
			lc.MustRLock(t, c, key, "PX", 8000, "TOKEN", r2)
			li := mustLockInfo(t, c, key, r1)
			h1, ok1 := li.holder(r1)
			h2, ok2 := li.holder(hiddenToken(r2))
			switch {
			case li.Mode != "read" || len(li.Holders) != 2 || !ok1 || !ok2:
				t.Errorf("LOCKINFO TOKEN r1 = %+v; want mode read, holders %q and %q", li, r1, hiddenToken(r2))
			case h1.Holds != 1 || h2.Holds != 2:
				t.Errorf("LOCKINFO holders %+v; want 1 and 2 holds", li.Holders)
			case h1.TTLMS <= 0 || h1.TTLMS > 2000 || h2.TTLMS <= 2000 || h2.TTLMS > 8000:
				t.Errorf("LOCKINFO holders %+v; want ttl_ms in (0, 2000] and (2000, 8000]", li.Holders)
			case li.TTLMS != h1.TTLMS:
				t.Errorf("LOCKINFO ttl_ms = %d; want the shortest lease left, %d", li.TTLMS, h1.TTLMS)
			case li.Fence < g.Fence:
				t.Errorf("LOCKINFO fence in read mode = %d; want ≥ %d, the last write's", li.Fence, g.Fence)
			}
			lc.Unlock(t, c, key, r1)
			lc.Unlock(t, c, key, r2)
			lc.Unlock(t, c, key, r2)
			if li, held := lockInfoOf(t, c, key, ""); held {
				t.Errorf("LOCKINFO after every UNLOCK = %+v; want nil", li)
			}
		})
	}
}

// TestLockInfoWaiters: waiters counts the clients blocked in LOCK or
// RLOCK … WAIT on that key on this instance only, and drops when one of
// them disconnects.
func TestLockInfoWaiters(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	inA := startSemInstance(t, cl)
	inB := startSemInstance(t, cl)
	a := lc.NewClient(t, inA.addr, 3)
	b := lc.NewClient(t, inB.addr, 2)
	key := "info-waiters-" + lockclient.RandID()
	g := lc.MustLock(t, a, key, "PX", 20000)

	// block sends cmd key … WAIT on a new connection to addr and leaves
	// it blocked.
	block := func(addr, cmd string) net.Conn {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		t.Cleanup(func() { _ = c.Close() })
		if _, err := c.Write([]byte(lockclient.Encode(cmd, key, "PX", "5000", "WAIT", "30000"))); err != nil {
			t.Fatalf("write %s: %v", cmd, err)
		}
		return c
	}
	waitWaiters := func(c lockclient.Doer, where string, want int64) {
		t.Helper()
		var li lockInfo
		err := eventually(200, 25*time.Millisecond, func() error {
			li = mustLockInfo(t, c, key, "")
			if li.Waiters != want {
				return fmt.Errorf("LOCKINFO on %s = %+v; want %d waiters", where, li, want)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	var onA []net.Conn
	for _, cmd := range []string{"LOCK", "LOCK", "RLOCK"} {
		onA = append(onA, block(inA.addr, cmd))
	}
	onB := []net.Conn{block(inB.addr, "LOCK"), block(inB.addr, "RLOCK")}
	waitWaiters(a, "A", 3)
	waitWaiters(b, "B", 2)

	// One waiter on A goes away.
	_ = onA[1].Close()
	waitWaiters(a, "A", 2)
	waitWaiters(b, "B", 2)

	// All go away, then the holder unlocks: nobody is left to take it.
	for _, c := range append(onA, onB...) {
		_ = c.Close()
	}
	waitWaiters(a, "A", 0)
	waitWaiters(b, "B", 0)
	if got := lc.Unlock(t, a, key, g.Token); got != 1 {
		t.Fatalf("UNLOCK = %d; want 1", got)
	}
	if li, held := lockInfoOf(t, b, key, ""); held {
		t.Errorf("LOCKINFO after the waiters left and the holder unlocked = %+v; want nil", li)
	}
}

// TestLockInfoBadInput: malformed LOCKINFO gets an -ERR and the
// connection keeps working.
func TestLockInfoBadInput(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	in := startSemInstance(t, cl)
	rc := lc.DialRaw(t, in.addr)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"LOCKINFO"}, "ERR wrong number of arguments for 'lockinfo' command"},
		{[]string{"LOCKINFO", ""}, "ERR empty key"},
		{[]string{"LOCKINFO", "k", "TOKEN"}, "ERR syntax error"},
		{[]string{"LOCKINFO", "k", "FOO", "bar"}, "ERR syntax error"},
		{[]string{"LOCKINFO", "k", "TOKEN", "t", "extra"}, "ERR syntax error"},
	}
	for _, tc := range cases {
		r := rc.Do(tc.args...)
		if r.Kind != '-' || !strings.HasPrefix(r.Str, tc.want) {
			t.Errorf("%q = %v; want -%s…", tc.args, r, tc.want)
		}
		if p := rc.Do("PING"); p.Kind != '+' || p.Str != "PONG" {
			t.Fatalf("PING after %q = %v; want +PONG", tc.args, p)
		}
	}
}
