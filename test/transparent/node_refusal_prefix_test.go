package transparent

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestBusyNodesGiveNoClientActedOnPrefix: with a majority of the nodes
// busy running another client's long script, they answer every command
// with -BUSY. PROTOCOL.md: lockproxy's replies never carry a prefix that
// clients act on (BUSY, LOADING, TRYAGAIN, READONLY, MOVED, …): go-redis
// and redis-py retry or reconnect on them, as they would for their own
// server being busy, which lockproxy is not. LOCK answers such nodes with
// -NOQUORUM, as nodes that did not answer; so did the transparent writes
// (their MULTI failed), but the reads (GET, EXISTS, PTTL, EVAL_RO) passed
// the majority's -BUSY on verbatim. LOADING (a node loading its data) and
// READONLY (a node turned replica, before lockproxy notices) take the
// same path (backends/redis TestNodeReplyNotNowIsNoAnswer).
func TestBusyNodesGiveNoClientActedOnPrefix(t *testing.T) {
	t.Parallel()
	e := start(t)
	// No retries: what lockproxy answers is what is checked.
	c := redis.NewClient(&redis.Options{Addr: e.addr, MaxRetries: -1, ReadTimeout: 20 * time.Second})
	defer c.Close()
	ctx := lockclient.CtxFor(t, 60*time.Second)
	for _, k := range []string{"lock:busy", "lock:busy2"} {
		if err := c.Do(ctx, "SET", k, "tok", "NX", "PX", 30000).Err(); err != nil {
			t.Fatalf("SET %s NX PX: %v", k, err)
		}
	}

	// Nodes 0 and 1 run a script that never ends on their own until
	// SCRIPT KILL; past busy-reply-threshold they answer -BUSY.
	done := make(chan error, 2)
	for _, i := range []int{0, 1} {
		if err := e.direct[i].ConfigSet(ctx, "busy-reply-threshold", "50").Err(); err != nil {
			t.Fatal(err)
		}
		busy := redis.NewClient(&redis.Options{Addr: e.nodes[i].Addr, MaxRetries: -1, ReadTimeout: -1})
		defer busy.Close()
		go func() { done <- busy.Eval(context.Background(), "while true do end", nil).Err() }()
	}
	defer func() {
		for _, i := range []int{0, 1} {
			kctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = e.direct[i].ScriptKill(kctx).Err()
			cancel()
		}
		for range 2 {
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Error("a node's busy script did not end after SCRIPT KILL")
			}
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := e.direct[1].Ping(ctx).Err()
		if err != nil && strings.HasPrefix(err.Error(), "BUSY") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node 1 not busy: PING = %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	for _, tc := range []struct {
		name string
		cmd  []any
	}{
		{"LOCK", []any{"LOCK", "lock:other", "PX", 30000}},
		{"GET", []any{"GET", "lock:busy"}},
		{"EXISTS", []any{"EXISTS", "lock:busy"}},
		{"EXISTS of two keys", []any{"EXISTS", "lock:busy", "lock:busy2"}},
		{"PTTL", []any{"PTTL", "lock:busy"}},
		{"SET NX PX", []any{"SET", "lock:new", "tok", "NX", "PX", 30000}},
		{"SET XX PX", []any{"SET", "lock:busy", "tok", "XX", "PX", 30000}},
		{"PEXPIRE", []any{"PEXPIRE", "lock:busy", 30000}},
		{"DEL", []any{"DEL", "lock:busy"}},
		{"DEL of two keys", []any{"DEL", "lock:busy", "lock:busy2"}},
		{"compare-and-delete script", []any{"EVAL", `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) end return 0`, 1, "lock:busy", "tok"}},
		{"script that may acquire", []any{"EVAL", `return redis.call("set", KEYS[1], ARGV[1], "NX", "PX", 30000)`, 1, "lock:new2", "tok"}},
		{"EVAL_RO", []any{"EVAL_RO", `return redis.call("get", KEYS[1])`, 1, "lock:busy"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := c.Do(ctx, tc.cmd...).Result()
			t.Logf("%v = %v, %v", tc.cmd[0], v, err)
			if err == nil || redis.HasErrorPrefix(err, "NOQUORUM") || err == redis.Nil {
				if err == nil || err == redis.Nil {
					t.Errorf("%v with 2 of 3 nodes busy = %v, %v; want an error (-NOQUORUM)", tc.cmd, v, err)
				}
				return
			}
			for _, p := range []string{"BUSY", "LOADING", "TRYAGAIN", "READONLY", "MOVED", "ASK", "MASTERDOWN", "CLUSTERDOWN", "EXECABORT"} {
				if redis.HasErrorPrefix(err, p) {
					t.Errorf("%v with 2 of 3 nodes busy = %v; want no %s prefix (PROTOCOL.md), -NOQUORUM as LOCK", tc.cmd, err, p)
				}
			}
		})
	}
}
