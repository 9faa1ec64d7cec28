package redis

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// TestWaitFindsUnannouncedFreeing: a LOCK … WAIT head that was refused
// and is subscribed to the key's announcements must still find the key
// free within its WAIT when it becomes free without an announcement the
// head can rely on, long before the lease it was told ends: a release
// through transparent mode (a plain DEL, a library's compare-and-delete
// script), the longest reader's UNLOCK followed by a shorter reader's
// expiry, and a RENEW that shortened the holder's lease, which then
// expires. Each frees the key about 1 s into a 4 s WAIT while the lease
// the refusal told is 30 s. Before, the head slept until that lease's end
// (past the WAIT: no fallback at all) and the WAIT failed with the key
// free; now its sleep is capped (Backend.leaseSleepMax).
//
// A transparent release is announced too (syncHoldsScript publishes on
// the key's release channel where the key is gone after the command):
// those cases must be granted well under the 1 s cap after the release,
// which they are freed about 100 ms after the head's last attempt, so
// that the fallback alone would take about 900 ms.
func TestWaitFindsUnannouncedFreeing(t *testing.T) {
	b, _ := newRealBackend(t, 3)
	ctx := ctxTimeout(t, 60*time.Second)
	const cad = `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`
	for _, tc := range []struct {
		name  string
		hold  func(t *testing.T, key string) // the holds that refuse the waiter
		free  func(t *testing.T, key string) // makes the key free, or about to be
		waitR bool                           // the waiter is a reader
		// announced: the freeing is announced, so the grant must come
		// within announcedGrant of it rather than by the fallback retry.
		announced bool
	}{
		{"transparent DEL", func(t *testing.T, key string) {
			holdKey(t, ctx, b, key, "h", 30*time.Second, backends.Write)
		}, func(t *testing.T, key string) {
			b.Run(ctx, []string{"DEL", key}, []int{1}, false)
		}, false, true},
		{"transparent compare-and-delete script", func(t *testing.T, key string) {
			holdKey(t, ctx, b, key, "h", 30*time.Second, backends.Write)
		}, func(t *testing.T, key string) {
			b.Run(ctx, []string{"EVAL", cad, "1", key, "h"}, []int{3}, false)
		}, false, true},
		{"transparent DEL, a reader waits", func(t *testing.T, key string) {
			holdKey(t, ctx, b, key, "h", 30*time.Second, backends.Write)
		}, func(t *testing.T, key string) {
			b.Run(ctx, []string{"DEL", key}, []int{1}, false)
		}, true, true},
		{"longest reader unlocks, a shorter one expires", func(t *testing.T, key string) {
			holdKey(t, ctx, b, key, "r-long", 30*time.Second, backends.Read)
			holdKey(t, ctx, b, key, "r-short", 1500*time.Millisecond, backends.Read)
		}, func(t *testing.T, key string) {
			if ok, err := b.Unlock(ctx, key, "r-long"); !ok || err != nil {
				t.Fatalf("UNLOCK r-long = %v, %v", ok, err)
			}
		}, false, false},
		{"RENEW shortens the lease, which expires", func(t *testing.T, key string) {
			holdKey(t, ctx, b, key, "h", 30*time.Second, backends.Write)
		}, func(t *testing.T, key string) {
			if _, err := b.Renew(ctx, key, "h", time.Second); err != nil {
				t.Fatalf("RENEW: %v", err)
			}
		}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "unheard-" + tc.name
			tc.hold(t, key)
			mode := backends.Write
			if tc.waitR {
				mode = backends.Read
			}
			before := acquireAttempts(t, b)
			got := make(chan error, 1)
			go func() {
				_, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "waiter", TTL: 5 * time.Second, Wait: 4 * time.Second, Mode: mode})
				got <- err
			}()
			// Refused, then once more when the subscription is confirmed.
			waitFor(t, "waiter tried twice", func() bool { return acquireAttempts(t, b)-before >= 2 })
			time.Sleep(100 * time.Millisecond)
			start := time.Now()
			tc.free(t, key)
			freed := acquireAttempts(t, b)
			err := <-got
			took := time.Since(start)
			if err != nil {
				t.Errorf("LOCK … WAIT 4 s = %v (%d attempts after the key was freed); want a grant: the key was free (or its last lease ended) about 1 s into the WAIT",
					err, acquireAttempts(t, b)-freed)
			}
			if tc.announced {
				t.Logf("granted %v after the release", took)
				if err == nil && took > announcedGrant {
					t.Errorf("LOCK … WAIT granted %v after the transparent release; want within %v: the release is announced, the 1 s fallback retry must not be what finds it",
						took, announcedGrant)
				}
			}
		})
	}
}

// announcedGrant is how soon after an announced release a waiting head
// must be granted: well under the 1 s cap on its sleep (leaseSleepMax),
// with room for a loaded machine.
const announcedGrant = 500 * time.Millisecond

// TestTransparentReleaseAnnouncedOnce: a transparent command that leaves
// a lock key free announces it on the key's release channel, as UNLOCK
// does, so that LOCK … WAIT waiters try at once: once per key however
// often the command names it (DEL a a b), through a script too
// (RunScript's compare-and-delete, on a node whose script cache was
// flushed: syncHoldsDone's re-run), and not at all for a key the command
// leaves held (a PEXPIRE renewal). Before, transparent releases were
// never announced and waiters found them by their 1 s fallback retry.
func TestTransparentReleaseAnnouncedOnce(t *testing.T) {
	b, rs := newRealBackend(t, 1)
	direct := rs[0].Client(t)
	ctx := ctxTimeout(t, 30*time.Second)
	for _, k := range []string{"a", "b", "c", "d"} {
		holdKey(t, ctx, b, k, "h", time.Minute, backends.Write)
	}
	sub := direct.Subscribe(ctx, "lp:released:a", "lp:released:b", "lp:released:c", "lp:released:d")
	defer sub.Close()
	for range 4 { // the confirmations
		if _, err := sub.Receive(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := direct.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const cad = `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`
	for _, r := range b.Run(ctx, []string{"DEL", "a", "a", "b"}, []int{1, 2, 3}, false) {
		if r.Err != nil || r.Val != int64(2) {
			t.Fatalf("DEL a a b = %v, %v; want 2", r.Val, r.Err)
		}
	}
	for _, r := range b.Run(ctx, []string{"PEXPIRE", "d", "60000"}, []int{1}, false) {
		if r.Err != nil || r.Val != int64(1) {
			t.Fatalf("PEXPIRE d = %v, %v; want 1", r.Val, r.Err)
		}
	}
	// A node that lost its script cache answers syncHoldsScript's
	// EVALSHA with NOSCRIPT; the script runs again alone, with the same
	// ARGV, and announces too.
	if err := direct.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	for _, r := range b.RunScript(ctx, cad, []string{"c"}, []string{"h"}) {
		if r.Err != nil || r.Val != int64(1) {
			t.Fatalf("compare-and-delete c = %v, %v; want 1", r.Val, r.Err)
		}
	}
	// A repeated announcement of a, or one of d, would be read here in
	// place of c's.
	expectAnnouncements(t, sub, []string{"a", "b", "c"})
	if got := statCalls(direct.Info(ctx, "commandstats").Val(), "publish"); got != 3 {
		t.Errorf("%d PUBLISH calls; want 3, one per freed key", got)
	}
}

// TestWaitHeadAttemptsCappedWhileHeld: the cap on the head's sleep
// (Backend.leaseSleepMax, 1 s here) is what it costs the nodes while a
// key stays held with nothing released: about one attempt per cap, after
// the first two (the refused one and the one when the subscription is
// confirmed), however long the lease left. The jittered retry made 13–16
// attempts in 1.5 s. The counts are logged for the README.
func TestWaitHeadAttemptsCappedWhileHeld(t *testing.T) {
	// RetryMin as in TestWaitHeadAttemptsWhileHeld: the subscription must
	// be confirmed before the short retry that covers the time until then.
	b, _ := newRealBackend(t, 3, func(c *Config) { c.RetryMin = 100 * time.Millisecond })
	ctx := ctxTimeout(t, 60*time.Second)
	capped := b.leaseSleepMax()
	for _, wait := range []time.Duration{1500 * time.Millisecond, 3500 * time.Millisecond} {
		t.Run(wait.String(), func(t *testing.T) {
			key := "capped-" + wait.String()
			// Counted from before the holder's grant (see
			// TestWaitHeadAttemptsWhileHeld).
			before := acquireAttempts(t, b) + 1
			holdKey(t, ctx, b, key, "holder", 30*time.Second, backends.Write)
			_, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "waiter", TTL: 10 * time.Second, Wait: wait})
			if err != backends.ErrNotAcquired {
				t.Fatalf("LOCK … WAIT = %v; want not acquired", err)
			}
			attempts := acquireAttempts(t, b) - before
			most := 2 + uint64(wait/capped)
			t.Logf("%d attempts in a %v WAIT on a key held throughout (cap %v)", attempts, wait, capped)
			if attempts > most {
				t.Errorf("one waiter made %d attempts in a %v WAIT on a key held throughout; want at most %d (one per %v after the first two)",
					attempts, wait, most, capped)
			}
		})
	}
}

// TestUnmarkFromAnswerDoesNotBlockClose: a waiting writer's refusal that
// comes after its attempt was granted takes its mark off from the
// writer's answer callback (noteAnswer → Node.Unmark). Unmark took the
// node's closing read lock, which blocks while Close waits for the write
// lock, and Close waits for every enqueue holding the read lock, one of
// which waits for room in that same writer's full queue: Close, the
// writer and the enqueue waited for one another for ever. The writer must
// never block there: Unmark from an answer callback skips a closing node
// (the mark ends by itself, as a dead instance's does).
func TestUnmarkFromAnswerDoesNotBlockClose(t *testing.T) {
	n, _ := nodeOnRedis(t)
	// A second node on the same server, with one writer and a queue of 4,
	// so that it is easy to fill.
	n = NewNode(NodeConfig{Addr: n.Name(), KeyPrefix: "lp:", Timeout: time.Second, MaxBatch: 1, Workers: 1})
	ctx := ctxTimeout(t, 30*time.Second)
	if g, err := n.Acquire(ctx, quorum.Request{Key: "k", Token: "holder", TTL: 20 * time.Second}); err != nil || !g.Acquired {
		t.Fatalf("holder's Acquire = %+v, %v", g, err)
	}
	// The writer is held in an answer callback while the queue fills and
	// Close starts.
	gate, held := make(chan struct{}), make(chan struct{})
	n.StartExtend(ctx, "other", "t", time.Second, func(bool, error) {
		close(held)
		<-gate
	})
	<-held
	// A waiting writer's attempt whose grant already won elsewhere: its
	// refusal here takes the mark off from the callback.
	rs := &refusals{wasGranted: true, key: "k", token: "w"}
	n.StartAcquire(withRefusals(ctx, rs), quorum.Request{Key: "k", Token: "w", TTL: time.Second, WriterWait: time.Second},
		func(quorum.NodeGrant, error) {})
	// More than the queue holds: the last ones wait in enqueue, holding the
	// closing read lock, with no deadline of their own.
	for range 8 {
		go n.StartExtend(context.Background(), "other", "t", time.Second, func(bool, error) {})
	}
	q := n.queues[0]
	waitFor(t, "queue full", func() bool { return len(q) == cap(q) })
	time.Sleep(50 * time.Millisecond) // the rest block in enqueue
	closed := make(chan struct{})
	go func() {
		_ = n.Close()
		close(closed)
	}()
	time.Sleep(100 * time.Millisecond) // Close waits for the write lock
	close(gate)
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Node.Close did not return within 10 s: the writer blocked taking a waiting writer's mark off from an answer callback")
	}
}

// holdKey takes key for tok, without WAIT.
func holdKey(t *testing.T, ctx context.Context, b *Backend, key, tok string, ttl time.Duration, mode backends.Mode) {
	t.Helper()
	if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: tok, TTL: ttl, Mode: mode}); err != nil {
		t.Fatalf("LOCK %s by %s: %v", key, tok, err)
	}
}
