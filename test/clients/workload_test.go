package clients

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// goRedis is the workload through go-redis v9 in protocol proto.
func goRedis(proto int) runner {
	return func(t *testing.T, addr, mode string) results {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		newClient := func() *redis.Client {
			c := redis.NewClient(&redis.Options{Addr: addr, Protocol: proto, MaxRetries: -1,
				DialTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, PoolSize: 4})
			t.Cleanup(func() { c.Close() })
			return c
		}
		r := newClient()
		if mode == "lock" {
			return goRedisLock(ctx, t, r)
		}
		out := results{}
		must := func(k string, v any, err error) {
			if err != nil && !errors.Is(err, redis.Nil) {
				t.Fatalf("go-redis %s: %v", k, err)
			}
			out[k] = v
		}
		s, err := r.Set(ctx, "s1", "hello", 0).Result()
		must("set", s, err)
		g, err := r.Get(ctx, "s1").Result()
		must("get", g, err)
		n, err := r.Incr(ctx, "n").Result()
		must("incr", n, err)
		n, err = r.IncrBy(ctx, "n", 5).Result()
		must("incrby", n, err)
		mg, err := r.MGet(ctx, "s1", "n", "missing").Result()
		must("mget", mg, err)
		n, err = r.HSet(ctx, "h", "f1", "v1", "f2", "v2").Result()
		must("hset", n, err)
		hm, err := r.HGetAll(ctx, "h").Result()
		must("hgetall", hm, err)
		n, err = r.HIncrBy(ctx, "h", "c", 3).Result()
		must("hincrby", n, err)
		n, err = r.RPush(ctx, "l", "a", "b", "c").Result()
		must("rpush", n, err)
		lr, err := r.LRange(ctx, "l", 0, -1).Result()
		must("lrange", lr, err)
		bp, err := r.BLPop(ctx, time.Second, "l").Result()
		must("blpop_ready", bp, err)
		bp, err = r.BLPop(ctx, time.Second, "empty").Result()
		must("blpop_timeout", bp, err)
		other := newClient()
		go func() {
			time.Sleep(200 * time.Millisecond)
			other.RPush(ctx, "q", "woken")
		}()
		bp, err = r.BLPop(ctx, 5*time.Second, "q").Result()
		must("blpop_woken", bp, err)

		// WATCH: one transaction commits, one is broken by another client.
		var ok []any
		err = r.Watch(ctx, func(tx *redis.Tx) error {
			cmds, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Set(ctx, "w", "1", 0)
				p.Incr(ctx, "w")
				return nil
			})
			ok = cmdVals(cmds)
			return err
		}, "w")
		must("watch_ok", ok, err)
		err = r.Watch(ctx, func(tx *redis.Tx) error {
			if err := other.Set(ctx, "w", "changed", 0).Err(); err != nil {
				return err
			}
			_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Set(ctx, "w", "mine", 0)
				return nil
			})
			return err
		}, "w")
		conflict := "committed"
		if errors.Is(err, redis.TxFailedErr) {
			conflict = "aborted"
		}
		must("watch_conflict", conflict, nil)
		g, err = r.Get(ctx, "w").Result()
		must("w", g, err)

		// Pipelining, with a transaction in the middle.
		p := r.Pipeline()
		var last *redis.IntCmd
		for range 20 {
			last = p.Incr(ctx, "pipelined")
		}
		_, err = p.Exec(ctx)
		must("pipeline", last.Val(), err)
		cmds, err := r.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Incr(ctx, "tx")
			p.Get(ctx, "s1")
			return nil
		})
		must("txpipeline", cmdVals(cmds), err)

		// Pub/sub with two subscribers.
		var subs []*redis.PubSub
		for range 2 {
			ps := newClient().Subscribe(ctx, "ch")
			if _, err := ps.Receive(ctx); err != nil {
				t.Fatalf("subscribe: %v", err)
			}
			subs = append(subs, ps)
		}
		var pub []any
		for _, m := range []string{"m1", "m2", "m3"} {
			n, err := r.Publish(ctx, "ch", m).Result()
			if err != nil {
				t.Fatalf("publish: %v", err)
			}
			pub = append(pub, n)
		}
		out["published"] = pub
		var got [][]string
		for _, ps := range subs {
			var msgs []string
			for range 3 {
				rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
				m, err := ps.ReceiveMessage(rctx)
				rcancel()
				if err != nil {
					t.Fatalf("receive: %v", err)
				}
				msgs = append(msgs, m.Payload)
			}
			_ = ps.Unsubscribe(ctx, "ch")
			ps.Close()
			got = append(got, msgs)
		}
		out["subscribers"] = got

		script := redis.NewScript("return redis.call('incrby', KEYS[1], ARGV[1])")
		v, err := r.Eval(ctx, "return redis.call('incrby', KEYS[1], ARGV[1])", []string{"ctr"}, 7).Result()
		must("eval", v, err)
		v, err = script.Run(ctx, r, []string{"ctr"}, 7).Result()
		must("evalsha", v, err)
		g, err = r.Get(ctx, "s1").Result()
		must("after_pubsub", g, err)
		return normalize(t, out)
	}
}

func errText(err error) any {
	if err == nil {
		return nil
	}
	return err.Error()
}

func cmdVals(cmds []redis.Cmder) []any {
	var out []any
	for _, c := range cmds {
		if v, ok := c.(interface{ Val() any }); ok {
			out = append(out, v.Val())
			continue
		}
		out = append(out, c.String())
	}
	return out
}

// normalize passes results through JSON, as the other clients' are.
func normalize(t *testing.T, r results) results {
	t.Helper()
	b, err := jsonMarshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return parse(t, "go-redis", b)
}

func goRedisLock(ctx context.Context, t *testing.T, r *redis.Client) results {
	out := results{}
	v, err := r.Do(ctx, "LOCK", "go:lock", "PX", 5000).Result()
	if err != nil {
		t.Fatalf("LOCK: %v", err)
	}
	m := map[string]any{}
	switch g := v.(type) {
	case map[any]any:
		for k, x := range g {
			m[k.(string)] = x
		}
	case []any:
		for i := 0; i+1 < len(g); i += 2 {
			m[g[i].(string)] = g[i+1]
		}
	}
	validity, _ := m["validity_ms"].(int64)
	out["locked"] = validity > 0
	again, err := r.Do(ctx, "LOCK", "go:lock", "PX", 5000).Result()
	if !errors.Is(err, redis.Nil) {
		t.Errorf("second LOCK = %v, %v; want nil", again, err)
	}
	out["held_again"] = nil
	n, err := r.Do(ctx, "UNLOCK", "go:lock", m["token"]).Result()
	if err != nil {
		t.Fatalf("UNLOCK: %v", err)
	}
	out["unlock"] = n
	out["reserved"] = errText(r.Set(ctx, "lockproxy:x", "1", 0).Err())
	out["denied"] = errText(r.FlushAll(ctx).Err())
	cmds, _ := r.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Do(ctx, "LOCK", "go:lock2", "PX", 1000)
		return nil
	})
	if len(cmds) == 1 {
		out["lock_in_multi"] = errText(cmds[0].Err())
	}
	return normalize(t, out)
}

// redisCLIScript is the workload for redis-cli, one command a line (no
// pub/sub: redis-cli stays in subscribe mode for good).
const redisCLIScript = `SET s1 hello
GET s1
INCR n
INCRBY n 5
MGET s1 n missing
HSET h f1 v1 f2 v2
HGETALL h
HINCRBY h c 3
RPUSH l a b c
LRANGE l 0 -1
BLPOP l 1
BLPOP empty 0.2
WATCH w
MULTI
SET w 1
INCR w
EXEC
EVAL "return redis.call('incrby', KEYS[1], ARGV[1])" 1 ctr 7
EVALSHA 3d8d2e9d6d5c4c3a8b29b0e3b0f6f0f3d2b1c5e4 1 ctr 7
SCRIPT LOAD "return redis.call('incrby', KEYS[1], ARGV[1])"
PING
ECHO hi
DBSIZE
TYPE h
OBJECT ENCODING l
`

// redisCLI runs the script through redis-cli -2 or -3.
func redisCLI(proto int) runner {
	return func(t *testing.T, addr, mode string) results {
		t.Helper()
		host, port, _ := strings.Cut(addr, ":")
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		run := func(stdin string, args ...string) string {
			full := append([]string{"-h", host, "-p", port, "-" + string(rune('0'+proto))}, args...)
			cmd := exec.CommandContext(ctx, "redis-cli", full...)
			cmd.Stdin = strings.NewReader(stdin)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("redis-cli %v: %v\n%s", full, err, out)
			}
			return string(out)
		}
		if mode == "lock" {
			lines := strings.Split(strings.TrimSpace(run("", "LOCK", "cli:lock", "PX", "5000")), "\n")
			token := ""
			for i, l := range lines {
				switch f := strings.Fields(l); {
				case l == "token" && i+1 < len(lines): // RESP2: a flat array
					token = lines[i+1]
				case len(f) == 2 && f[0] == "token": // RESP3: a map, a pair a line
					token = f[1]
				}
			}
			res := results{"locked": token != "", "held_again": nil}
			if again := strings.TrimSpace(run("", "LOCK", "cli:lock", "PX", "5000")); again != "" {
				res["held_again"] = again
			}
			if strings.TrimSpace(run("", "UNLOCK", "cli:lock", token)) == "1" {
				res["unlock"] = float64(1)
			}
			res["reserved"] = run("", "SET", "lockproxy:x", "1")
			res["denied"] = run("", "FLUSHALL")
			res["lock_in_multi"] = run("MULTI\nLOCK cli:lock2 PX 1000\nEXEC\n")
			return res
		}
		return results{"output": run(redisCLIScript)}
	}
}
