package quorum_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
)

// TestRollbackSkipsLateRefusals: a failed attempt's roll-back reaches no
// node that refused it, also where that refusal came after the attempt
// was decided. A node refuses a NoReentry attempt (transparent mode's SET
// NX) where its own value holds the key: a release there would take that
// hold, which the attempt never made. Before, the nodes not heard when
// the outcome was known got the release whatever they answered.
func TestRollbackSkipsLateRefusals(t *testing.T) {
	const late = 20 * time.Millisecond // well within the node timeout (250 ms)
	for _, tc := range []struct {
		name    string
		n       int
		set     func(i int, nd *fakeNode)
		wantErr error
	}{
		{"N=3/two refuse at once, one late", 3, func(i int, nd *fakeNode) {
			nd.refuse = true
			if i == 2 {
				nd.delay = late
			}
		}, quorum.ErrNotAcquired},
		{"N=5/three refuse at once, two late", 5, func(i int, nd *fakeNode) {
			nd.refuse = true
			if i >= 3 {
				nd.delay = late
			}
		}, quorum.ErrNotAcquired},
		{"N=5/one grants, three refuse, one late", 5, func(i int, nd *fakeNode) {
			nd.refuse = i > 0
			if i == 4 {
				nd.delay = late
			}
		}, quorum.ErrNotAcquired},
		{"N=3/two grant, the fence cannot be settled, one refuses late", 3, func(i int, nd *fakeNode) {
			switch i {
			case 0:
				nd.fence = 7
			case 1:
				nd.fence, nd.raise = 5, raiseRefuse
			case 2:
				nd.refuse, nd.delay = true, late
			}
		}, quorum.ErrNoQuorum},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkGoroutines(t)
			nodes := makeNodes(t, tc.n, tc.set)
			q := newQuorum(t, defaultConfig(), nodes)
			r := req
			r.NoReentry = true
			lease, err := q.Acquire(context.Background(), r)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Acquire = %+v, %v; want %v", lease, err, tc.wantErr)
			}
			for _, nd := range nodes {
				rel := nd.ops("release")
				switch {
				case nd.refuse && len(rel) > 0:
					t.Errorf("%s refused, and got %d Release calls; want none", nd.name, len(rel))
				case !nd.refuse && len(rel) != 1:
					t.Errorf("%s granted, and got %d Release calls; want 1", nd.name, len(rel))
				}
			}
		})
	}
}
