package redis

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestReleasesAndRenewalsAcrossStop: releases and renewals handed to the
// node's writers right before the process stops for longer than their
// deadlines are answered as the nodes answer them, not failed for the
// deadlines that passed during the stop: those queued behind a batch
// whose answers wait in the socket, and those the writer had not taken
// yet. Acquires: TestAcquiresQueuedAcrossStop.
func TestReleasesAndRenewalsAcrossStop(t *testing.T) {
	harness.RequireBinary(t, "redis-server", "redis-server")
	rs := harness.StartRedisN(t, 3, harness.RedisOptions{})
	const timeout = 100 * time.Millisecond
	nodes := make([]*Node, len(rs))
	for i, r := range rs {
		// A small batch: most operations wait in the queue behind the
		// one on the wire when the process stops.
		nodes[i] = NewNode(NodeConfig{Addr: r.Addr, KeyPrefix: "lp:", Timeout: timeout, MaxBatch: 4})
		t.Cleanup(func() { nodes[i].Close() })
	}
	ctx := ctxTimeout(t, 20*time.Second)
	const keys = 48
	for k := 0; k < keys; k++ {
		for _, n := range nodes {
			g, err := n.Acquire(ctx, quorum.Request{Key: fmt.Sprint("stop-", k), Token: "t", TTL: time.Minute, NoReentry: true})
			if err != nil || !g.Acquired {
				t.Fatalf("Acquire key %d on %s = %+v, %v", k, n.Name(), g, err)
			}
		}
	}
	for _, kind := range []string{"renewal", "release"} {
		var (
			mu     sync.Mutex
			failed []string
			wg     sync.WaitGroup
		)
		opCtx, cancel := context.WithTimeout(context.Background(), timeout)
		for k := 0; k < keys; k++ {
			for _, n := range nodes {
				wg.Add(1)
				done := func(ok bool, err error) {
					if err != nil || !ok {
						mu.Lock()
						failed = append(failed, fmt.Sprintf("%s of key %d on %s: %v, %v", kind, k, n.Name(), ok, err))
						mu.Unlock()
					}
					wg.Done()
				}
				if kind == "release" {
					n.StartRelease(opCtx, fmt.Sprint("stop-", k), "t", quorum.AnyHold, done)
				} else {
					n.StartExtend(opCtx, fmt.Sprint("stop-", k), "t", time.Minute, done)
				}
			}
		}
		harness.StopProcess(t, 4*timeout)
		wg.Wait()
		cancel()
		for i, f := range failed {
			if i == 5 {
				t.Logf("…")
				break
			}
			t.Log(f)
		}
		if len(failed) > 0 {
			t.Errorf("%d of %d %ss handed to the writers right before a stop of %v failed; want none", len(failed), keys*len(nodes), kind, 4*timeout)
		}
	}
}

// pastDeadline is a context whose deadline had passed when it was made,
// with no timer to end it (as the quorum's node contexts carry theirs).
type pastDeadline struct{ context.Context }

func (pastDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// TestRenewalPastItsCallersDeadlineGivenUp: a renewal whose deadline had
// passed before it was handed to the writer is its caller's, not
// lockproxy's lateness (a KEEPALIVE renewal asked for after the validity
// it last answered ended): it is given up unsent, as before, not sent
// because the writer was idle.
func TestRenewalPastItsCallersDeadlineGivenUp(t *testing.T) {
	n, _ := nodeOnRedis(t)
	ctx := ctxTimeout(t, 10*time.Second)
	if g, err := n.Acquire(ctx, quorum.Request{Key: "k", Token: "t", TTL: time.Minute, NoReentry: true}); err != nil || !g.Acquired {
		t.Fatalf("Acquire = %+v, %v", g, err)
	}
	time.Sleep(50 * time.Millisecond) // the writer idle
	done := make(chan error, 1)
	n.StartExtend(pastDeadline{context.Background()}, "k", "t", time.Minute, func(_ bool, err error) { done <- err })
	if err := <-done; !quorum.Unsent(err) {
		t.Fatalf("renewal past its caller's deadline = %v; want given up unsent", err)
	}
}
