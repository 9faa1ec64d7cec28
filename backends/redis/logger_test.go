package redis

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestGoRedisLogger: go-redis's log lines reach zap (so they are JSON
// like every other line with log.format json), as warnings, and a line
// that repeats (a node down: every dial fails) is written once per
// period with the count held back, not once per dial.
func TestGoRedisLogger(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	l := newGoRedisLogger(zap.New(core), time.Second)
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	ctx := context.Background()
	const dial = "redis: connection pool: failed to dial after %d attempts: %v"
	for range 5 {
		l.Printf(ctx, dial, 1, "context deadline exceeded")
	}
	l.Printf(ctx, "redis: other %s", "line")
	now = now.Add(1100 * time.Millisecond)
	l.Printf(ctx, dial, 1, "connection refused")

	got := logs.All()
	want := []struct {
		msg  string
		held int64
	}{
		{"connection pool: failed to dial after 1 attempts: context deadline exceeded", 0},
		{"other line", 0},
		{"connection pool: failed to dial after 1 attempts: connection refused", 4},
	}
	if len(got) != len(want) {
		t.Fatalf("logged %d lines: %v; want %d", len(got), got, len(want))
	}
	for i, w := range want {
		e := got[i]
		held, _ := e.ContextMap()["held_back"].(int64)
		if e.Message != w.msg || e.Level != zap.WarnLevel || held != w.held || e.LoggerName != "go-redis" {
			t.Errorf("line %d = %s %q (logger %q, held back %d); want warn %q, held back %d", i, e.Level, e.Message, e.LoggerName, held, w.msg, w.held)
		}
	}
}
