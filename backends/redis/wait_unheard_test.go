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
func TestWaitFindsUnannouncedFreeing(t *testing.T) {
	b, _ := newRealBackend(t, 3)
	ctx := ctxTimeout(t, 60*time.Second)
	const cad = `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`
	for _, tc := range []struct {
		name  string
		hold  func(t *testing.T, key string) // the holds that refuse the waiter
		free  func(t *testing.T, key string) // makes the key free, or about to be
		waitR bool                           // the waiter is a reader
	}{
		{"transparent DEL", func(t *testing.T, key string) {
			holdKey(t, ctx, b, key, "h", 30*time.Second, backends.Write)
		}, func(t *testing.T, key string) {
			b.Run(ctx, []string{"DEL", key}, []int{1}, false)
		}, false},
		{"transparent compare-and-delete script", func(t *testing.T, key string) {
			holdKey(t, ctx, b, key, "h", 30*time.Second, backends.Write)
		}, func(t *testing.T, key string) {
			b.Run(ctx, []string{"EVAL", cad, "1", key, "h"}, []int{3}, false)
		}, false},
		{"transparent DEL, a reader waits", func(t *testing.T, key string) {
			holdKey(t, ctx, b, key, "h", 30*time.Second, backends.Write)
		}, func(t *testing.T, key string) {
			b.Run(ctx, []string{"DEL", key}, []int{1}, false)
		}, true},
		{"longest reader unlocks, a shorter one expires", func(t *testing.T, key string) {
			holdKey(t, ctx, b, key, "r-long", 30*time.Second, backends.Read)
			holdKey(t, ctx, b, key, "r-short", 1500*time.Millisecond, backends.Read)
		}, func(t *testing.T, key string) {
			if ok, err := b.Unlock(ctx, key, "r-long"); !ok || err != nil {
				t.Fatalf("UNLOCK r-long = %v, %v", ok, err)
			}
		}, false},
		{"RENEW shortens the lease, which expires", func(t *testing.T, key string) {
			holdKey(t, ctx, b, key, "h", 30*time.Second, backends.Write)
		}, func(t *testing.T, key string) {
			if _, err := b.Renew(ctx, key, "h", time.Second); err != nil {
				t.Fatalf("RENEW: %v", err)
			}
		}, false},
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
			tc.free(t, key)
			freed := acquireAttempts(t, b)
			err := <-got
			if err != nil {
				t.Errorf("LOCK … WAIT 4 s = %v (%d attempts after the key was freed); want a grant: the key was free (or its last lease ended) about 1 s into the WAIT",
					err, acquireAttempts(t, b)-freed)
			}
		})
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
