package redis

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestEpochBusyScriptDoesNotQuarantine: a node running a long script
// (another client's, past busy-reply-threshold) answers every command with
// -BUSY, the epoch GET too. That says nothing about its data, which the
// script cannot have replaced: the batch's answers are errors anyway, and
// the node must not be quarantined for max TTL as if it had been flushed.
func TestEpochBusyScriptDoesNotQuarantine(t *testing.T) {
	b, rs := newRealBackend(t, 3, func(cfg *Config) {
		cfg.Quarantine, cfg.MaxTTL, cfg.CheckInterval = true, time.Minute, 0
	})
	ctx := ctxTimeout(t, 20*time.Second)
	for _, n := range b.nodes {
		cctx, cancel := context.WithTimeout(ctx, checkTimeout)
		n.check(cctx)
		cancel()
	}
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "k1", Token: "A", TTL: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	direct := rs[2].Client(t)
	if err := direct.Do(ctx, "CONFIG", "SET", "busy-reply-threshold", "50").Err(); err != nil {
		t.Fatal(err)
	}
	busy := rs[2].Client(t)
	scriptDone := make(chan error, 1)
	go func() {
		scriptDone <- busy.Eval(context.Background(), "local i = 0 while true do i = i + 1 end", nil).Err()
	}()
	killed := false
	kill := func() {
		if killed {
			return
		}
		killed = true
		for i := 0; i < 200; i++ {
			if err := direct.Do(ctx, "SCRIPT", "KILL").Err(); err == nil || strings.Contains(err.Error(), "NOTBUSY") {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		<-scriptDone
	}
	defer kill()
	// Busy: the node answers -BUSY (bounded wait).
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := direct.Ping(ctx).Err()
		if err != nil && strings.HasPrefix(err.Error(), "BUSY") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node never answered BUSY: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Nodes 0 and 1 grant; node 2's writer meets BUSY.
	if _, err := b.Lock(ctx, backends.LockRequest{Key: "k2", Token: "A", TTL: 10 * time.Second}); err != nil {
		t.Fatalf("lock with one node busy: %v", err)
	}
	kill()
	if st, _, _ := b.nodes[2].State(); st != stateOK {
		t.Errorf("node 2 is %s after a busy script (its data untouched); want %s", st, stateOK)
	}
}
