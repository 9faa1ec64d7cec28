package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// PROTOCOL.md, RLOCK: a read lock, shared with other readers, exclusive
// with LOCK; each reader's lease is its own; the write holder may take a
// read lock with its own token (downgrade); upgrade is refused.

// TestRLock runs the read-lock rules through two lockproxy instances
// sharing three nodes, each case on its own key, under RESP2 and RESP3.
func TestRLock(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	inA := startSemInstance(t, cl)
	inB := startSemInstance(t, cl)

	cases := []struct {
		name string
		run  func(t *testing.T, a, b lockclient.Doer, key string)
	}{
		{"writer waiting", func(t *testing.T, a, b lockclient.Doer, key string) { rlockWriterWaiting(t, a, b, key, cl) }},
		{"shared readers", rlockShared},
		{"longest reader leaves first", rlockLongestLeaves},
		{"short reader expires first", func(t *testing.T, a, b lockclient.Doer, key string) { rlockOwnLeases(t, a, b, key, true) }},
		{"long reader first", func(t *testing.T, a, b lockclient.Doer, key string) { rlockOwnLeases(t, a, b, key, false) }},
		{"writer excludes readers", rlockWriterExcludes},
		{"downgrade", rlockDowngrade},
		{"upgrade refused", rlockUpgradeRefused},
		{"reentrant reader and RENEW", rlockReentrantRenew},
	}
	for _, tc := range cases {
		for _, proto := range []int{2, 3} {
			t.Run(fmt.Sprintf("%s/resp%d", tc.name, proto), func(t *testing.T) {
				t.Parallel()
				a := lc.NewClient(t, inA.addr, proto)
				b := lc.NewClient(t, inB.addr, proto)
				tc.run(t, a, b, "rw-"+lockclient.RandID())
			})
		}
	}
}

// rlockShared: three readers with their own tokens hold at once, through
// both instances; a writer is refused until the last one unlocks.
func rlockShared(t *testing.T, a, b lockclient.Doer, key string) {
	// An earlier write, so that the readers' fence has something to be at
	// least.
	w := lc.MustLock(t, a, key, "PX", 5000)
	if got := lc.Unlock(t, a, key, w.Token); got != 1 {
		t.Fatalf("UNLOCK of the first writer = %d; want 1", got)
	}
	tokens := []string{"reader-1-" + lockclient.RandID(), "reader-2-" + lockclient.RandID(), "reader-3-" + lockclient.RandID()}
	for i, tok := range tokens {
		c := []lockclient.Doer{a, b}[i%2]
		g := lc.MustRLock(t, c, key, "PX", 5000, "TOKEN", tok)
		checkReadGrant(t, "RLOCK", g, 5000)
		if g.Token != tok || g.Fence < w.Fence {
			t.Errorf("reader %d: token %q fence %d; want token %q, fence ≥ %d (the last write's)", i, g.Token, g.Fence, tok, w.Fence)
		}
	}
	li := mustLockInfo(t, b, key, tokens[0])
	if li.Mode != "read" || len(li.Holders) != 3 {
		t.Fatalf("LOCKINFO = %+v; want mode read with 3 holders", li)
	}
	for i, tok := range tokens {
		shown := hiddenToken(tok)
		if i == 0 {
			shown = tok // named with TOKEN
		}
		if h, ok := li.holder(shown); !ok || h.Holds != 1 || h.TTLMS <= 0 || h.TTLMS > 5000 {
			t.Errorf("LOCKINFO holder %q = %+v (found %v); want 1 hold, ttl_ms in (0, 5000]; holders %+v", shown, h, ok, li.Holders)
		}
	}
	lc.Refused(t, a, "LOCK", key, "PX", 5000)
	lc.Refused(t, b, "LOCK", key, "PX", 5000, "WAIT", 300)
	for _, args := range [][]any{
		{"UNLOCK", key, "not-a-reader"},
		{"RENEW", key, "not-a-reader", "PX", 5000},
	} {
		if got := lc.IntCmd(t, a, args...); got != 0 {
			t.Errorf("%v = %d; want 0", args, got)
		}
	}
	for i, tok := range tokens {
		if got := lc.Unlock(t, []lockclient.Doer{b, a}[i%2], key, tok); got != 1 {
			t.Fatalf("UNLOCK reader %d = %d; want 1", i, got)
		}
		if i < len(tokens)-1 {
			lc.Refused(t, a, "LOCK", key, "PX", 5000)
		}
	}
	if li, held := lockInfoOf(t, a, key, ""); held {
		t.Errorf("LOCKINFO after every reader unlocked = %+v; want nil", li)
	}
	g := lc.MustLock(t, b, key, "PX", 5000)
	if g.Fence <= w.Fence {
		t.Errorf("writer after the readers: fence %d; want > %d", g.Fence, w.Fence)
	}
}

// rlockOwnLeases: a reader with a short lease and one with a long lease;
// the short one's expiry does not end the long one's, in whichever order
// they came.
func rlockOwnLeases(t *testing.T, a, b lockclient.Doer, key string, shortFirst bool) {
	const shortTTL, longTTL = 300, 8000
	short, long := "short-"+lockclient.RandID(), "long-"+lockclient.RandID()
	take := func(tok string, ttl int) { lc.MustRLock(t, a, key, "PX", ttl, "TOKEN", tok) }
	if shortFirst {
		take(short, shortTTL)
		take(long, longTTL)
	} else {
		take(long, longTTL)
		take(short, shortTTL)
	}
	// Wait for the short lease to end, as LOCKINFO sees it.
	var li lockInfo
	err := eventually(100, 50*time.Millisecond, func() error {
		var held bool
		li, held = lockInfoOf(t, b, key, "")
		if !held || len(li.Holders) != 1 {
			return fmt.Errorf("LOCKINFO = %+v (held %v); want the long reader alone", li, held)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if h := li.Holders[0]; li.Mode != "read" || h.Token != hiddenToken(long) || h.TTLMS <= shortTTL || h.TTLMS > longTTL {
		t.Errorf("LOCKINFO after the short lease = %+v; want the long reader %q with ttl_ms in (%d, %d]", li, hiddenToken(long), shortTTL, longTTL)
	}
	lc.Refused(t, b, "LOCK", key, "PX", 5000)
	for _, args := range [][]any{
		{"RENEW", key, short, "PX", 5000},
		{"UNLOCK", key, short},
	} {
		if got := lc.IntCmd(t, a, args...); got != 0 {
			t.Errorf("%v after the short lease ended = %d; want 0", args, got)
		}
	}
	if v := lc.IntCmd(t, b, "RENEW", key, long, "PX", 10000); v <= 0 || v > maxValidityMS(10000) {
		t.Errorf("RENEW of the long reader = %d; want in (0, %d]", v, maxValidityMS(10000))
	}
	if li := mustLockInfo(t, a, key, long); len(li.Holders) != 1 || li.Holders[0].Token != long || li.TTLMS <= longTTL || li.TTLMS > 10000 {
		t.Errorf("LOCKINFO after RENEW PX 10000 = %+v; want holder %q with ttl_ms in (%d, 10000]", li, long, longTTL)
	}
	if got := lc.Unlock(t, b, key, long); got != 1 {
		t.Fatalf("UNLOCK of the long reader = %d; want 1", got)
	}
	lc.MustLock(t, b, key, "PX", 5000)
}

// rlockWriterExcludes: readers are refused while a writer holds, at once
// and after a WAIT, and get in once it unlocks.
func rlockWriterExcludes(t *testing.T, a, b lockclient.Doer, key string) {
	w := lc.MustLock(t, a, key, "PX", 5000)
	lc.Refused(t, a, "RLOCK", key, "PX", 5000)
	lc.Refused(t, b, "RLOCK", key, "PX", 5000)
	lc.Refused(t, b, "RLOCK", key, "PX", 5000, "WAIT", 300)
	if got := lc.Unlock(t, a, key, w.Token); got != 1 {
		t.Fatalf("UNLOCK of the writer = %d; want 1", got)
	}
	g := lc.MustRLock(t, b, key, "PX", 5000)
	if g.Fence < w.Fence {
		t.Errorf("reader after the writer: fence %d; want ≥ %d", g.Fence, w.Fence)
	}
}

// rlockDowngrade: the write holder takes a read lock with its token; the
// first UNLOCK gives back the write hold, which lets other readers in.
func rlockDowngrade(t *testing.T, a, b lockclient.Doer, key string) {
	tok := "downgrade-" + lockclient.RandID()
	w := lc.MustLock(t, a, key, "PX", 5000, "TOKEN", tok)
	r := lc.MustRLock(t, b, key, "PX", 5000, "TOKEN", tok)
	if r.Token != tok || r.Fence != w.Fence {
		t.Errorf("downgrade RLOCK: token %q fence %d; want %q and the write fence %d", r.Token, r.Fence, tok, w.Fence)
	}
	if li := mustLockInfo(t, a, key, tok); li.Mode != "write" || len(li.Holders) != 1 || li.Holders[0].Token != tok {
		t.Errorf("LOCKINFO while holding both = %+v; want mode write, holder %q", li, tok)
	}
	lc.Refused(t, a, "RLOCK", key, "PX", 5000)
	lc.Refused(t, b, "LOCK", key, "PX", 5000)
	// A reader waits meanwhile; giving back the write hold lets it in.
	waiting := make(chan error, 1)
	var other lockclient.Grant
	go func() {
		g, ok, err := lockclient.TryAcquire(lockclient.CtxFor(t, 30*time.Second), b, "RLOCK", key, "PX", 5000, "WAIT", 15000)
		if err == nil && !ok {
			err = fmt.Errorf("RLOCK … WAIT 15000 = nil")
		}
		other = g
		waiting <- err
	}()
	waitWaitersInfo(t, b, key, 1)

	if got := lc.Unlock(t, a, key, tok); got != 1 {
		t.Fatalf("first UNLOCK after the downgrade = %d; want 1", got)
	}
	if err := <-waiting; err != nil {
		t.Fatalf("the reader waiting while the write hold was given back: %v; want a grant", err)
	}
	li := mustLockInfo(t, b, key, tok)
	if h, ok := li.holder(tok); li.Mode != "read" || len(li.Holders) != 2 || !ok || h.Holds != 1 {
		t.Errorf("LOCKINFO after giving back the write hold = %+v; want mode read, holder %q with 1 hold and the other reader", li, tok)
	}
	lc.Refused(t, b, "LOCK", key, "PX", 5000)
	if got := lc.Unlock(t, b, key, tok); got != 1 {
		t.Fatalf("second UNLOCK after the downgrade = %d; want 1", got)
	}
	if got := lc.Unlock(t, a, key, tok); got != 0 {
		t.Errorf("third UNLOCK after the downgrade = %d; want 0", got)
	}
	lc.Refused(t, a, "LOCK", key, "PX", 5000)
	if got := lc.Unlock(t, a, key, other.Token); got != 1 {
		t.Fatalf("UNLOCK of the other reader = %d; want 1", got)
	}
	if g := lc.MustLock(t, a, key, "PX", 5000); g.Fence <= w.Fence {
		t.Errorf("next writer's fence %d; want > %d", g.Fence, w.Fence)
	}
}

// rlockUpgradeRefused: LOCK by a token that holds a read lock is an error,
// with WAIT too, and leaves the read hold as it was.
func rlockUpgradeRefused(t *testing.T, a, b lockclient.Doer, key string) {
	tok := "upgrade-" + lockclient.RandID()
	lc.MustRLock(t, a, key, "PX", 5000, "TOKEN", tok)
	peer := lc.MustRLock(t, b, key, "PX", 5000)
	for _, opts := range [][]any{
		{"PX", 5000, "TOKEN", tok},
		{"PX", 5000, "TOKEN", tok, "WAIT", 2000},
	} {
		for _, c := range []lockclient.Doer{a, b} {
			_, ok, err := lockclient.TryAcquire(lockclient.CtxFor(t, 20*time.Second), c, "LOCK", key, opts...)
			if err == nil || !strings.HasPrefix(err.Error(), "ERR upgrade refused") {
				t.Errorf("LOCK %q %v by a reader = granted %v, %v; want -ERR upgrade refused …", key, opts, ok, err)
			}
		}
	}
	li := mustLockInfo(t, a, key, tok)
	if h, ok := li.holder(tok); li.Mode != "read" || len(li.Holders) != 2 || !ok || h.Holds != 1 {
		t.Errorf("LOCKINFO after the refused upgrades = %+v; want mode read, 2 holders, %q with 1 hold", li, tok)
	}
	if v := lc.IntCmd(t, b, "RENEW", key, tok, "PX", 5000); v <= 0 {
		t.Errorf("RENEW of the reader after the refused upgrades = %d; want > 0", v)
	}
	for _, tk := range []string{tok, peer.Token} {
		if got := lc.Unlock(t, a, key, tk); got != 1 {
			t.Fatalf("UNLOCK reader %q = %d; want 1", tk, got)
		}
	}
	if li, held := lockInfoOf(t, a, key, ""); held {
		t.Errorf("LOCKINFO after the readers unlocked = %+v; want nil", li)
	}
	// Now free, the same token may take the write lock.
	lc.MustLock(t, b, key, "PX", 5000, "TOKEN", tok)
}

// rlockReentrantRenew: a reader's second RLOCK adds a hold; RENEW extends
// its own lease beyond the first one's.
func rlockReentrantRenew(t *testing.T, a, b lockclient.Doer, key string) {
	tok := "reader-" + lockclient.RandID()
	lc.MustRLock(t, a, key, "PX", 1000, "TOKEN", tok)
	g := lc.MustRLock(t, b, key, "PX", 1000, "TOKEN", tok)
	checkReadGrant(t, "second RLOCK", g, 1000)
	if li := mustLockInfo(t, a, key, tok); len(li.Holders) != 1 || li.Holders[0].Holds != 2 {
		t.Errorf("LOCKINFO after two RLOCKs = %+v; want one holder with 2 holds", li)
	}
	if v := lc.IntCmd(t, a, "RENEW", key, tok, "PX", 6000); v <= 0 || v > maxValidityMS(6000) {
		t.Errorf("RENEW of the reader = %d; want in (0, %d]", v, maxValidityMS(6000))
	}
	// Past the first lease: still held, by the renewed lease.
	time.Sleep(1300 * time.Millisecond)
	if li := mustLockInfo(t, b, key, tok); len(li.Holders) != 1 || li.Holders[0].TTLMS <= 1000 {
		t.Errorf("LOCKINFO 1.3 s after RENEW PX 6000 = %+v; want the reader with ttl_ms > 1000", li)
	}
	lc.Refused(t, b, "LOCK", key, "PX", 5000)
	if got := lc.Unlock(t, b, key, tok); got != 1 {
		t.Fatalf("first UNLOCK of the reader = %d; want 1", got)
	}
	lc.Refused(t, b, "LOCK", key, "PX", 5000)
	if got := lc.Unlock(t, a, key, tok); got != 1 {
		t.Fatalf("second UNLOCK of the reader = %d; want 1", got)
	}
	lc.MustLock(t, a, key, "PX", 5000)
}

// rlockWriterWaiting: while a writer waits with WAIT (its mark on the
// nodes), a reader that already holds may take another hold, a new reader
// is refused; the writer gets the lock once the holder's holds are gone.
func rlockWriterWaiting(t *testing.T, a, b lockclient.Doer, key string, cl *cluster) {
	tok := "holding-reader-" + lockclient.RandID()
	lc.MustRLock(t, a, key, "PX", 8000, "TOKEN", tok)
	type result struct {
		g   lockclient.Grant
		ok  bool
		err error
	}
	res := make(chan result, 1)
	go func() {
		g, ok, err := lockclient.TryAcquire(lockclient.CtxFor(t, 30*time.Second), b, "LOCK", key, "PX", 5000, "WAIT", 15000)
		res <- result{g, ok, err}
	}()
	if err := eventually(200, 25*time.Millisecond, func() error {
		if n := cl.markedNodes(t, key); n <= len(cl.nodes)/2 {
			return fmt.Errorf("the waiting writer's mark is on %d of %d nodes; want a majority", n, len(cl.nodes))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	g := lc.MustRLock(t, a, key, "PX", 8000, "TOKEN", tok)
	checkReadGrant(t, "RLOCK by a holding reader while a writer waits", g, 8000)
	lc.Refused(t, a, "RLOCK", key, "PX", 8000)
	lc.Refused(t, b, "RLOCK", key, "PX", 8000, "TOKEN", "new-reader-"+lockclient.RandID())
	for i := 0; i < 2; i++ {
		select {
		case r := <-res:
			t.Fatalf("the writer answered %+v, %v, %v while the reader still held %d holds", r.g, r.ok, r.err, 2-i)
		default:
		}
		if got := lc.Unlock(t, a, key, tok); got != 1 {
			t.Fatalf("UNLOCK of the reader = %d; want 1", got)
		}
	}
	select {
	case r := <-res:
		if r.err != nil || !r.ok {
			t.Fatalf("the waiting writer = %+v, %v, %v; want a grant", r.g, r.ok, r.err)
		}
		lc.Unlock(t, b, key, r.g.Token)
	case <-time.After(20 * time.Second):
		t.Fatalf("the waiting writer was not granted within 20 s of the reader's last UNLOCK")
	}
	lc.MustRLock(t, a, key, "PX", 5000)
}

// TestRLockQueueReadersTogether: on one instance, waiters queued R1, R2
// (RLOCK), W (LOCK), R3 (RLOCK) behind a writer are served in that order,
// with R1 and R2 holding together, and R3 only after W.
func TestRLockQueueReadersTogether(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	in := startSemInstance(t, cl)
	c := lc.NewClient(t, in.addr, 2)
	key := "rw-queue-" + lockclient.RandID()
	first := lc.MustLock(t, c, key, "PX", 20000)

	type event struct {
		who string
		g   lockclient.Grant
		err error
	}
	events := make(chan event, 4)
	order := []struct{ who, cmd string }{{"R1", "RLOCK"}, {"R2", "RLOCK"}, {"W", "LOCK"}, {"R3", "RLOCK"}}
	conns := map[string]*lockclient.RawConn{}
	for i, o := range order {
		rc := lc.DialRaw(t, in.addr)
		conns[o.who] = rc
		rc.Write(lockclient.Encode(o.cmd, key, "PX", "8000", "WAIT", "30000"))
		go func() {
			_ = rc.Conn.SetReadDeadline(time.Now().Add(45 * time.Second))
			r, err := lockclient.ReadReply(rc.BR)
			if err != nil {
				events <- event{who: o.who, err: err}
				return
			}
			g, err := lockclient.ParseGrant(toAny(r))
			events <- event{o.who, g, err}
		}()
		waitWaitersInfo(t, c, key, int64(i+1))
	}
	next := func(what string) event {
		t.Helper()
		select {
		case e := <-events:
			if e.err != nil {
				t.Fatalf("%s: %v", e.who, e.err)
			}
			return e
		case <-time.After(30 * time.Second):
			t.Fatalf("no grant within 30 s; want %s", what)
		}
		return event{}
	}
	if got := lc.Unlock(t, c, key, first.Token); got != 1 {
		t.Fatalf("UNLOCK of the first writer = %d; want 1", got)
	}
	e1, e2 := next("R1 and R2"), next("R1 and R2")
	if got := []string{e1.who, e2.who}; !(got[0] == "R1" && got[1] == "R2" || got[0] == "R2" && got[1] == "R1") {
		t.Fatalf("first two grants went to %v; want R1 and R2", got)
	}
	li := mustLockInfo(t, c, key, "")
	if li.Mode != "read" || len(li.Holders) != 2 || li.Waiters != 2 {
		t.Errorf("LOCKINFO with R1 and R2 granted = %+v; want mode read, 2 holders, 2 waiters (W, R3)", li)
	}
	select {
	case e := <-events:
		t.Fatalf("%s granted while R1 and R2 hold; want W next, after they unlock", e.who)
	case <-time.After(300 * time.Millisecond):
	}
	for _, e := range []event{e1, e2} {
		if r := conns[e.who].Do("UNLOCK", key, e.g.Token); r.Kind != ':' || r.Int != 1 {
			t.Fatalf("UNLOCK by %s = %v; want :1", e.who, r)
		}
	}
	w := next("W")
	if w.who != "W" {
		t.Fatalf("after the readers, %s was granted; want W (first come, first served)", w.who)
	}
	select {
	case e := <-events:
		t.Fatalf("%s granted while W holds", e.who)
	case <-time.After(200 * time.Millisecond):
	}
	if r := conns["W"].Do("UNLOCK", key, w.g.Token); r.Kind != ':' || r.Int != 1 {
		t.Fatalf("UNLOCK by W = %v; want :1", r)
	}
	if r3 := next("R3"); r3.who != "R3" || r3.g.Fence < w.g.Fence {
		t.Errorf("last grant: %s with fence %d; want R3 with a fence ≥ W's %d", r3.who, r3.g.Fence, w.g.Fence)
	}
}

// waitWaitersInfo polls LOCKINFO until it shows want waiters, for at most
// 10 s.
func waitWaitersInfo(t *testing.T, c lockclient.Doer, key string, want int64) {
	t.Helper()
	var li lockInfo
	err := eventually(400, 25*time.Millisecond, func() error {
		li = mustLockInfo(t, c, key, "")
		if li.Waiters != want {
			return fmt.Errorf("LOCKINFO %q = %+v; want %d waiters", key, li, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRLockKeepalive: RLOCK takes KEEPALIVE like LOCK: the read lock lives
// past several leases while its connection keeps talking, next to another
// reader, and is released when the connection closes.
func TestRLockKeepalive(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	in := startSemInstance(t, cl)
	c := lc.NewClient(t, in.addr, 3)
	key := "rw-keepalive-" + lockclient.RandID()
	const ttl = 600

	rc := lc.DialRaw(t, in.addr)
	r := rc.Do("RLOCK", key, "PX", fmt.Sprint(ttl), "KEEPALIVE")
	tok := r.Pairs()["token"].Str
	if tok == "" {
		t.Fatalf("RLOCK KEEPALIVE = %v; want a grant", r)
	}
	other := lc.MustRLock(t, c, key, "PX", 20000)
	for end := time.Now().Add(4 * ttl * time.Millisecond); time.Now().Before(end); {
		if p := rc.Do("PING"); p.Str != "PONG" {
			t.Fatalf("PING = %v", p)
		}
		time.Sleep(100 * time.Millisecond)
	}
	li := mustLockInfo(t, c, key, tok)
	if h, ok := li.holder(tok); li.Mode != "read" || len(li.Holders) != 2 || !ok || h.TTLMS <= 0 || h.TTLMS > ttl {
		t.Fatalf("LOCKINFO after 4 leases of PINGs = %+v; want the keepalive reader %q (ttl_ms in (0, %d]) and another", li, tok, ttl)
	}
	_ = rc.Conn.Close()
	if err := eventually(200, 25*time.Millisecond, func() error {
		if li := mustLockInfo(t, c, key, tok); len(li.Holders) != 1 || li.Holders[0].Token != hiddenToken(other.Token) {
			return fmt.Errorf("LOCKINFO after the keepalive reader's connection closed = %+v; want the other reader alone", li)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	lc.Refused(t, c, "LOCK", key, "PX", 5000)
	lc.Unlock(t, c, key, other.Token)
	lc.MustLock(t, c, key, "PX", 5000)
}

// rlockLongestLeaves: the lock key lives as long as the longest reader
// lease; when that reader leaves (UNLOCK, or a RENEW to a shorter lease),
// the lock is free once the remaining readers' leases end, not at the
// departed reader's.
func rlockLongestLeaves(t *testing.T, a, b lockclient.Doer, key string) {
	short, long := "short-"+lockclient.RandID(), "long-"+lockclient.RandID()
	lc.MustRLock(t, a, key, "PX", 800, "TOKEN", short)
	lc.MustRLock(t, a, key, "PX", 15000, "TOKEN", long)
	if got := lc.Unlock(t, b, key, long); got != 1 {
		t.Fatalf("UNLOCK of the long reader = %d; want 1", got)
	}
	// Free within the short lease (plus slack), long before 15 s.
	if err := eventually(100, 50*time.Millisecond, func() error {
		if _, ok, err := lockclient.TryAcquire(lockclient.CtxFor(t, 10*time.Second), b, "LOCK", key, "PX", 5000, "TOKEN", "writer-after-readers"); err != nil || !ok {
			return fmt.Errorf("LOCK after the short reader's lease = %v, %v; want a grant", ok, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	lc.Unlock(t, b, key, "writer-after-readers")

	// RENEW to a shorter lease shortens the lock too.
	lc.MustRLock(t, a, key, "PX", 15000, "TOKEN", long)
	if v := lc.IntCmd(t, a, "RENEW", key, long, "PX", 500); v <= 0 {
		t.Fatalf("RENEW PX 500 of the reader = %d; want > 0", v)
	}
	if err := eventually(100, 50*time.Millisecond, func() error {
		if _, ok, err := lockclient.TryAcquire(lockclient.CtxFor(t, 10*time.Second), b, "LOCK", key, "PX", 5000); err != nil || !ok {
			return fmt.Errorf("LOCK after the reader renewed to 500 ms = %v, %v; want a grant", ok, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
