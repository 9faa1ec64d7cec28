package quorum

import (
	"context"
	"testing"
	"time"
)

// TestDeadlineSet: the node contexts the quorum sets its deadline in tell
// when (so a node handed an operation past it knows the time went by in
// lockproxy), and no other context does, nor one whose deadline is its
// caller's.
func TestDeadlineSet(t *testing.T) {
	q := &Quorum{allAsync: true}
	short, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	for _, tc := range []struct {
		name string
		ctx  func() context.Context
		set  bool
	}{
		{"node context", func() context.Context { c, _ := q.nodeContext(context.Background(), time.Second); return c }, true},
		{"node context under a later deadline", func() context.Context {
			p, cancel := context.WithTimeout(context.Background(), time.Minute)
			t.Cleanup(cancel)
			c, _ := q.nodeContext(p, time.Second)
			return c
		}, true},
		{"node context under the caller's earlier deadline", func() context.Context { c, _ := q.nodeContext(short, time.Second); return c }, false},
		{"NodeContext", func() context.Context { return NodeContext(short, time.Second) }, true},
		{"a context with a timeout", func() context.Context { return short }, false},
		{"background", context.Background, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := time.Now()
			ctx := tc.ctx()
			set, ok := DeadlineSet(ctx)
			if ok != tc.set {
				t.Fatalf("DeadlineSet = %v, %v; want set %v", set, ok, tc.set)
			}
			if !ok {
				return
			}
			if d, _ := ctx.Deadline(); set.Before(before) || d.Sub(set) != time.Second {
				t.Errorf("DeadlineSet = %v, deadline %v; want when the context was made, a second before its deadline", set, d)
			}
		})
	}
	// NodeContext has neither its parent's cancellation nor its deadline.
	c := NodeContext(short, time.Second)
	if c.Done() != nil {
		t.Errorf("NodeContext's Done = %v; want nil (nothing cancels it)", c.Done())
	}
}
