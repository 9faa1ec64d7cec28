package transparent

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestLocksHeldFollowsTransparentReleases: a lock taken through lockproxy
// with a plain SET NX PX is in lockproxy_locks_held (/metrics and INFO)
// until its client releases it the way lock libraries do: a DEL, a
// compare-and-delete script (redis-py's Lock, redsync), a DEL in MULTI
// after WATCH (StackExchange.Redis's LockRelease, go-redis's Watch); then
// it is taken off and its holding time observed, and no key or token
// appears in /metrics. Before, a SET NX PX was not counted at all, and a
// LOCK released these ways stayed counted until its lease ran out.
func TestLocksHeldFollowsTransparentReleases(t *testing.T) {
	t.Parallel()
	admin := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	e := start(t, "--admin", admin)
	c := e.client(t)
	ctx := lockclient.CtxFor(t, 60*time.Second)
	metrics := func() string {
		t.Helper()
		cl := &http.Client{Timeout: 5 * time.Second}
		resp, err := cl.Get("http://" + admin + "/metrics")
		if err != nil {
			t.Fatalf("GET /metrics: %v", err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	sample := func(body, name string) string {
		m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindStringSubmatch(body)
		if m == nil {
			return ""
		}
		return m[1]
	}
	infoHeld := func() string {
		t.Helper()
		text, err := c.Info(ctx).Result()
		if err != nil {
			t.Fatalf("INFO: %v", err)
		}
		m := regexp.MustCompile(`lockproxy_locks_held:(\d+)`).FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("INFO has no lockproxy_locks_held:\n%s", text)
		}
		return m[1]
	}
	const cad = `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`
	observed := 0
	for _, tc := range []struct {
		name    string
		release func(key, tok string) error
	}{
		{"DEL", func(key, _ string) error { return c.Del(ctx, key).Err() }},
		{"compare-and-delete script", func(key, tok string) error {
			n, err := c.Eval(ctx, cad, []string{key}, tok).Int()
			if err == nil && n != 1 {
				err = fmt.Errorf("script answered %d", n)
			}
			return err
		}},
		{"WATCH MULTI DEL EXEC", func(key, tok string) error {
			return c.Watch(ctx, func(tx *redis.Tx) error {
				if v, err := tx.Get(ctx, key).Result(); err != nil || v != tok {
					return fmt.Errorf("GET in the watch = %q, %v", v, err)
				}
				_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
					p.Del(ctx, key)
					return nil
				})
				return err
			}, key)
		}},
	} {
		key, tok := "lock:held-"+strings.ReplaceAll(tc.name, " ", "-"), "tok-"+lockclient.RandID()
		if ok, err := c.SetNX(ctx, key, tok, 20*time.Second).Result(); err != nil || !ok {
			t.Fatalf("%s: SET NX PX = %v, %v", tc.name, ok, err)
		}
		body := metrics()
		if got, info := sample(body, "lockproxy_locks_held"), infoHeld(); got != "1" || info != "1" {
			t.Errorf("%s: lockproxy_locks_held after SET NX PX = %q, INFO %s; want 1", tc.name, got, info)
		}
		if strings.Contains(body, tok) || strings.Contains(body, key) {
			t.Errorf("/metrics names the lock key %q or its token", key)
		}
		if err := tc.release(key, tok); err != nil {
			t.Fatalf("release by %s: %v", tc.name, err)
		}
		observed++
		body = metrics()
		if got, info := sample(body, "lockproxy_locks_held"), infoHeld(); got != "0" || info != "0" {
			t.Errorf("%s: lockproxy_locks_held after the release = %q, INFO %s; want 0", tc.name, got, info)
		}
		if got := sample(body, "lockproxy_lock_held_duration_seconds_count"); got != fmt.Sprint(observed) {
			t.Errorf("%s: lockproxy_lock_held_duration_seconds_count after the release = %q; want %d", tc.name, got, observed)
		}
	}
}
