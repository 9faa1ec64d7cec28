package e2e

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestUnlockAcrossProxyStop stops lockproxy (SIGSTOP, as a VM pause or a
// long stall does) for longer than the node timeout while clients LOCK,
// RENEW and UNLOCK, and counts the RENEWs and UNLOCKs in flight across a
// stop that were answered with an error. The nodes answered them during
// the stop (their answers waited in lockproxy's sockets), or they waited
// in lockproxy's queues: every deadline having passed by the time
// lockproxy runs again is no reason to tell a client its release failed,
// or that its lease was not renewed. Before, about a fifth of the UNLOCKs
// were answered -NOQUORUM … timeout, and the client's retry then found
// the lock gone (0), as if lost before its release; now at most 5 % may.
func TestUnlockAcrossProxyStop(t *testing.T) {
	cl := startCluster(t, 5)
	in := startInstance(t, cl.addrs())
	const (
		clients = 16
		stops   = 6
		stopFor = 400 * time.Millisecond
	)
	type span struct{ from, to time.Time }
	var (
		mu       sync.Mutex
		stopped  []span
		unlocks  []span // sent, answered
		renews   []span
		failures []string
		lockErrs int
	)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		rc := redis.NewClient(&redis.Options{Addr: in.addr, Protocol: 2, PoolSize: 1,
			ReadTimeout: 10 * time.Second, WriteTimeout: 5 * time.Second, MaxRetries: -1})
		t.Cleanup(func() { rc.Close() })
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			ctx := context.Background()
			key := fmt.Sprintf("stop-%d-%s", c, lockclient.RandID())
			for {
				select {
				case <-done:
					return
				default:
				}
				v, err := rc.Do(ctx, "LOCK", key, "PX", 10000).Result()
				if err != nil {
					mu.Lock()
					lockErrs++
					mu.Unlock()
					continue
				}
				g, err := lockclient.ParseGrant(v)
				if err != nil {
					continue // refused: the previous hold was not released
				}
				sent := time.Now()
				ms, err := rc.Do(ctx, "RENEW", key, g.Token, "PX", 10000).Int64()
				got := time.Now()
				mu.Lock()
				renews = append(renews, span{sent, got})
				if err != nil || ms <= 0 {
					failures = append(failures, fmt.Sprintf("RENEW sent %s answered %s: %v, %v",
						sent.Format("15:04:05.000"), got.Format("15:04:05.000"), ms, err))
				}
				mu.Unlock()
				sent = time.Now()
				n, err := rc.Do(ctx, "UNLOCK", key, g.Token).Int64()
				got = time.Now()
				mu.Lock()
				unlocks = append(unlocks, span{sent, got})
				if err != nil || n != 1 {
					failures = append(failures, fmt.Sprintf("UNLOCK sent %s answered %s: %v, %v",
						sent.Format("15:04:05.000"), got.Format("15:04:05.000"), n, err))
				}
				mu.Unlock()
			}
		}(c)
	}
	time.Sleep(500 * time.Millisecond)
	pid := in.proc.PID()
	for i := 0; i < stops; i++ {
		from := time.Now()
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatalf("SIGSTOP: %v", err)
		}
		time.Sleep(stopFor)
		to := time.Now()
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Fatalf("SIGCONT: %v", err)
		}
		mu.Lock()
		stopped = append(stopped, span{from, to})
		mu.Unlock()
		time.Sleep(300 * time.Millisecond)
	}
	close(done)
	wg.Wait()

	acrossStop := func(spans []span) int {
		n := 0
		for _, u := range spans {
			for _, s := range stopped {
				if u.from.Before(s.from) && u.to.After(s.to) {
					n++
					break
				}
			}
		}
		return n
	}
	across := acrossStop(unlocks) + acrossStop(renews)
	t.Logf("%d UNLOCKs and %d RENEWs, %d and %d of them in flight across one of %d stops of %v; %d failed (UNLOCK other than 1, RENEW other than a validity); %d LOCK errors",
		len(unlocks), len(renews), acrossStop(unlocks), acrossStop(renews), stops, stopFor, len(failures), lockErrs)
	for i, f := range failures {
		if i == 10 {
			break
		}
		t.Log(f)
	}
	if across == 0 {
		t.Errorf("no UNLOCK or RENEW was in flight across a stop: the test tested nothing")
	}
	// Not none: an operation queued behind a batch whose answers the
	// writer was still waiting for when the stop came can still fail
	// (the writer was waiting on its node then; 1 of 51 in one CI run).
	// Before, a fifth of those in flight failed (31 of 139 UNLOCKs over
	// three runs).
	if allowed := across / 20; len(failures) > allowed {
		t.Errorf("%d UNLOCKs or RENEWs of a held lock failed (%d in flight across a stop); want at most %d (5 %%)", len(failures), across, allowed)
	}
}
