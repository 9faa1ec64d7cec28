package quorum_test

import (
	"context"
	"testing"
	"time"
)

// TestValidityUnderOneMsIsNone: replies give validities in whole
// milliseconds, so a validity in (0, 1 ms) would read as 0: RENEW would
// answer "0, no longer held" for a lock a majority holds, so Extend
// answers 0, as for a validity ≤ 0; 1 ms is enough. (Acquire's rows are
// in TestAcquireValidity.)
func TestValidityUnderOneMsIsNone(t *testing.T) {
	const ttl = 10 * time.Second // drift 102ms
	for _, tc := range []struct {
		name string
		left time.Duration // the validity the time spent leaves
		want time.Duration // 0: none
	}{
		{"1ns", time.Nanosecond, 0},
		{"900µs", 900 * time.Microsecond, 0},
		{"1ms-1ns", time.Millisecond - time.Nanosecond, 0},
		{"1ms", time.Millisecond, time.Millisecond},
	} {
		spent := ttl - 102*time.Millisecond - tc.left
		t.Run("Extend/"+tc.name, func(t *testing.T) {
			checkGoroutines(t)
			clock := newFakeClock()
			nodes := makeNodes(t, 3, func(i int, nd *fakeNode) {
				if i == 0 {
					nd.clock, nd.advance = clock, spent
				} else {
					// Extend answers once a majority extended: n1, which
					// moves the clock, must be among the first to answer.
					nd.delay = 50 * time.Millisecond
				}
			})
			cfg := defaultConfig()
			cfg.Clock = clock
			q := newQuorum(t, cfg, nodes)
			got, err := q.Extend(context.Background(), req.Key, req.Token, ttl)
			if err != nil || got != tc.want {
				t.Errorf("Extend = %v, %v; want %v, nil", got, err, tc.want)
			}
			awaitOps(nodes, "extend", 1)
		})
	}
}
