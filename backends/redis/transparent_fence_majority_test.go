package redis

import (
	"errors"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
)

// TestScriptAcquisitionFenceNeedsMajority: a script acquisition's fence
// (Fence) counts only where it was raised, as LOCK's does: the next grant
// reads the counters of a majority, which must meet a raised one. Before,
// the raises' answers were not looked at, and a fence raised on one node
// of three was returned as the grant's: the next grant, on the other two,
// could get the same fence or a lower one.
func TestScriptAcquisitionFenceNeedsMajority(t *testing.T) {
	b, rs := newRealBackend(t, 3)
	ctx := ctxTimeout(t, 20*time.Second)
	for _, tc := range []struct {
		name    string
		holders []int // nodes holding the key with the token when Fence runs
		ok      bool
	}{
		{"all hold", []int{0, 1, 2}, true},
		{"a majority holds", []int{0, 2}, true},
		{"one holds", []int{1}, false},
		{"none holds", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "fence-majority-" + tc.name
			for i, r := range rs {
				c := r.Client(t)
				if err := c.Del(ctx, "lp:lock:"+key).Err(); err != nil {
					t.Fatal(err)
				}
				for _, h := range tc.holders {
					if h == i {
						if err := c.Set(ctx, "lp:lock:"+key, "v", 10*time.Second).Err(); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			fence, err := b.Fence(ctx, []int{0, 1, 2}, key, "v")
			switch {
			case tc.ok && (err != nil || fence == 0):
				t.Errorf("Fence with the token holding on nodes %v = %d, %v; want a fence", tc.holders, fence, err)
			case !tc.ok && !errors.Is(err, quorum.ErrNoQuorum):
				t.Errorf("Fence with the token holding on nodes %v = %d, %v; want a no-quorum error", tc.holders, fence, err)
			}
		})
	}
}
