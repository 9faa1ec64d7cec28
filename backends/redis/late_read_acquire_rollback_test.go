package redis

import (
	"errors"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestLateReadAcquireRolledBack: a failed RLOCK whose read acquire
// reached n1 and n2 (paused: sent, never answered within the node
// timeout) must not leave its read hold on them once they resume. The
// acquire runs on resume, from the dropped connection's socket buffer;
// its roll-back, sent after it on the next connection, must take the read
// hold away. Otherwise the token the client was told did not acquire
// holds the key for reading on a majority until its TTL: every writer is
// refused (a WAIT waits the whole TTL), and a retry by the same token
// joins the leftover hold as a reentry, so its one UNLOCK leaves a hold on
// the majority.
//
// The roll-back of an acquire in doubt goes out as lateGrantReleaseScript,
// which removes only a write hold made by SET NX: for a read acquire the
// lock key is the read marker, so it removed nothing. A plain release of
// the read hold (before 76d839f) removed it.
func TestLateReadAcquireRolledBack(t *testing.T) {
	cases := []struct {
		name   string
		resume time.Duration // after the RLOCK starts; the node timeout is 250 ms
		// open says why the case is skipped: it fails before and after
		// 76d839f, and is not fixed here.
		open string
	}{
		// The acquire's connection is dropped at 250 ms; the roll-back's
		// new connection is answered once the nodes resume, after the
		// acquire ran: the roll-back is written after it.
		{"roll-back written after the acquire ran", 350 * time.Millisecond, ""},
		// The roll-back's connection fails while paused: owed, sent after
		// the kill once the nodes resume (the acquire ran before).
		{"roll-back owed", 1500 * time.Millisecond, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.open != "" {
				t.Skip(c.open)
			}
			b, rs := newRealBackend(t, 3)
			ctx := ctxTimeout(t, 60*time.Second)
			const key = "late-read"
			const ttl = 20 * time.Second

			// Every writer has its connection, and the node has the read
			// script (an EVALSHA run on resume must not meet NOSCRIPT).
			for _, mode := range []backends.Mode{backends.Write, backends.Read} {
				if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "warm", TTL: ttl, Mode: mode}); err != nil {
					t.Fatal(err)
				}
				if ok, err := b.Unlock(ctx, key, "warm"); !ok || err != nil {
					t.Fatalf("UNLOCK warm = %v, %v", ok, err)
				}
			}
			for i := 0; ; i++ {
				free := 0
				for _, st := range holdStates(t, ctx, b, key) {
					if !st.held {
						free++
					}
				}
				if free == 3 {
					break
				}
				if i == 200 {
					t.Fatal("the warm-up key is still held 2 s after UNLOCK")
				}
				time.Sleep(10 * time.Millisecond)
			}

			// The nodes resume resume after the RLOCK was sent, in a
			// goroutine: the RLOCK returns once the quorum gave up.
			rs[1].Pause()
			rs[2].Pause()
			resumedCh := make(chan struct{})
			go func() {
				defer close(resumedCh)
				time.Sleep(c.resume)
				rs[1].Resume()
				rs[2].Resume()
			}()
			_, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "R", TTL: ttl, Mode: backends.Read})
			<-resumedCh
			if err == nil {
				t.Fatal("RLOCK with n1, n2 paused granted; want it refused")
			}

			readerOn := func() (nodes []int) {
				for i, st := range holdStates(t, ctx, b, key) {
					if _, ok := st.readers["R"]; ok {
						nodes = append(nodes, i)
					}
				}
				return nodes
			}
			// Settle: what the writers owe goes out within a few retries.
			resumed := time.Now()
			var on []int
			for time.Since(resumed) < 3*time.Second {
				if on = readerOn(); len(on) == 0 {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if len(on) > 0 {
				t.Errorf("3 s after the nodes resumed, the failed RLOCK's read hold is on nodes %v; want none", on)
			}
			// A writer is granted at once.
			if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "W", TTL: ttl}); err != nil {
				t.Errorf("LOCK by another token after the failed RLOCK = %v; want granted", err)
			} else if ok, err := b.Unlock(ctx, key, "W"); !ok || err != nil {
				t.Fatalf("UNLOCK W = %v, %v", ok, err)
			}
			// The same token's retry and its one UNLOCK leave the key free.
			if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "R", TTL: ttl, Mode: backends.Read}); err != nil {
				t.Fatalf("RLOCK retry: %v", err)
			}
			if ok, err := b.Unlock(ctx, key, "R"); !ok || err != nil {
				t.Fatalf("UNLOCK R = %v, %v", ok, err)
			}
			_, err = b.Lock(ctx, backends.LockRequest{Key: key, Token: "W2", TTL: ttl})
			if errors.Is(err, backends.ErrNotAcquired) {
				t.Errorf("LOCK after the retried RLOCK's UNLOCK refused: the retry joined the leftover read hold")
			} else if err != nil {
				t.Fatal(err)
			}
		})
	}
}
