package transparent

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestPlainSetOfNewValueIsAnAcquisition: SET without NX (SET k v PX ms,
// SET k v XX PX ms [GET]) that leaves a lock key holding a value it did
// not hold is an acquisition, as the same SET inside a script is: it gets
// a fence above every earlier grant's, and a write that did not reach a
// majority is rolled back. Before, it ran as a plain majority command: the
// new holder shared the previous holder's fence (LOCKINFO showed the slot
// counter, the old grant's number), and a write on a minority stayed
// there. A SET of the value the key already holds (ShedLock's extend,
// SET k v XX PX) is a renewal: no new fence.
func TestPlainSetOfNewValueIsAnAcquisition(t *testing.T) {
	t.Parallel()
	e := start(t)
	c := redis.NewClient(&redis.Options{Addr: e.addr, Protocol: 2}) // LOCKINFO as a flat array
	t.Cleanup(func() { _ = c.Close() })
	ctx := lockclient.CtxFor(t, 60*time.Second)
	fence := func(key, tok string) int64 {
		t.Helper()
		v, err := c.Do(ctx, "LOCKINFO", key, "TOKEN", tok).Slice()
		if err != nil {
			t.Fatalf("LOCKINFO %s TOKEN %s: %v", key, tok, err)
		}
		for i := 0; i+1 < len(v); i += 2 {
			if v[i] == "fence" {
				f, _ := v[i+1].(int64)
				return f
			}
		}
		t.Fatalf("LOCKINFO %s TOKEN %s = %v: no fence", key, tok, v)
		return 0
	}
	do := func(args ...any) any {
		t.Helper()
		v, err := c.Do(ctx, args...).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatalf("%v: %v", args, err)
		}
		return v
	}

	const key = "lock:plainset"
	if v := do("SET", key, "a", "PX", 10000, "NX"); v != "OK" {
		t.Fatalf("SET NX PX = %v", v)
	}
	last := fence(key, "a")
	for _, step := range []struct {
		name  string
		args  []any
		want  any
		token string // the holder after the step
		fresh bool   // a new holder: a higher fence
	}{
		{"overwrite XX", []any{"SET", key, "b", "XX", "PX", 10000}, "OK", "b", true},
		{"renewal XX same value", []any{"SET", key, "b", "XX", "PX", 20000}, "OK", "b", false},
		{"overwrite XX GET", []any{"SET", key, "c", "PX", 10000, "XX", "GET"}, "b", "c", true},
		{"overwrite without NX or XX", []any{"SET", key, "d", "PX", 10000}, "OK", "d", true},
		{"after DEL, without NX", []any{"SET", key, "e", "EX", 10}, "OK", "e", true},
	} {
		if step.name == "after DEL, without NX" {
			if n := do("DEL", key); n != int64(1) {
				t.Fatalf("DEL = %v", n)
			}
		}
		if v := do(step.args...); v != step.want {
			t.Errorf("%s: %v = %v; want %v", step.name, step.args, v, step.want)
		}
		f := fence(key, step.token)
		switch {
		case step.fresh && f <= last:
			t.Errorf("%s: the new holder %q has fence %d; want above the previous holder's %d", step.name, step.token, f, last)
		case !step.fresh && f != last:
			t.Errorf("%s: a renewal changed the fence from %d to %d", step.name, last, f)
		}
		last = f
	}
	if p := do("PTTL", key).(int64); p < 5000 || p > 10000 {
		t.Errorf("PTTL after SET … EX 10 = %d", p)
	}

	// A minority's leftover: SET XX writes there only, which is no grant.
	const left = "lock:plainset:left"
	if err := e.direct[0].Set(ctx, keyPrefix+"lock:"+left, "x", 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	if v := do("SET", left, "z", "XX", "PX", 10000); v != nil {
		t.Errorf("SET XX PX on a key on 1 of 3 nodes = %v; want nil (not set on a majority)", v)
	}
	if n := e.holding(t, left, "z"); n != 0 {
		t.Errorf("after SET XX PX answered nil its value is on %d of 3 nodes; want none (rolled back)", n)
	}
}
