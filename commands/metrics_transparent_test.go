package commands

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockproxy/lockproxy/resp"
	"github.com/lockproxy/lockproxy/test/harness"
)

// Lock libraries' release and extension scripts, as transparent mode runs
// them (redis-py's Lock, redsync, node-redlock).
const (
	compareAndDelete = `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`
	compareAndExpire = `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("pexpire", KEYS[1], ARGV[2]) else return 0 end`
)

// serveTransparent serves a Handler in transparent mode (lock pattern
// "lock:*") on 3 real redis-server nodes, its metrics in a registry of
// its own, and returns the registry and a connection to it.
func serveTransparent(t *testing.T) (*prometheus.Registry, func(args ...string) string) {
	t.Helper()
	reg, do, _ := serveTransparentNodes(t)
	return reg, do
}

// serveTransparentNodes is serveTransparent returning the nodes too (the
// lock of client key k is "lp:lock:"+k on them).
func serveTransparentNodes(t *testing.T) (*prometheus.Registry, func(args ...string) string, []*harness.Redis) {
	t.Helper()
	be, nodes := newRealRedLockNodes(t, 3)
	reg := prometheus.NewRegistry()
	lim := testLimits
	lim.MaxKeyBytes, lim.MaxTokenBytes = 64, 64
	h := NewHandler(Options{Limits: lim, Backend: be, Registry: reg, LockPatterns: []string{"lock:*"}, NodeKeyPrefix: "lp:"})
	conn := dialTest(t, serveOn(t, &resp.Server{Handler: h}))
	return reg, func(args ...string) string {
		t.Helper()
		return string(do(t, conn, args...))
	}, nodes
}

// TestTransparentAcquisitionEndsLocksItTookOver: a transparent acquisition
// takes a key that no one holds, so a lock of it still counted (its
// holder lost it without this instance seeing: deleted on the nodes,
// expired before the sweep) is over, and leaves lockproxy_locks_held with
// its holding time observed: the gauge counts one lock of the key, not
// two.
func TestTransparentAcquisitionEndsLocksItTookOver(t *testing.T) {
	reg, do, nodes := serveTransparentNodes(t)
	for _, acquire := range [][]string{
		{"SET", "lock:over", "t2", "NX", "PX", "20000"},
		{"EVAL", "return redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', 20000)", "1", "lock:over", "t2"},
	} {
		if r := do("LOCK", "lock:over", "TOKEN", "t1", "PX", "20000"); r[0] == '-' || r == "$-1\r\n" {
			t.Fatalf("LOCK = %q", r)
		}
		for _, n := range nodes {
			if err := n.Client(t).Del(context.Background(), "lp:lock:lock:over").Err(); err != nil {
				t.Fatal(err)
			}
		}
		if r := do(acquire...); r != "+OK\r\n" && r != "$2\r\nOK\r\n" {
			t.Fatalf("%s = %q", acquire[0], r)
		}
		if got := metricValue(t, reg, "lockproxy_locks_held"); got != 1 {
			t.Errorf("lockproxy_locks_held after %s took the key over = %v; want 1", acquire[0], got)
		}
		if r := do("DEL", "lock:over"); r != ":1\r\n" {
			t.Fatalf("DEL = %q", r)
		}
		if got := metricValue(t, reg, "lockproxy_locks_held"); got != 0 {
			t.Errorf("lockproxy_locks_held after the DEL = %v; want 0", got)
		}
	}
}

// TestTransparentReleasesTakeLocksOffHeld: a lock granted through this
// instance, by LOCK or by a transparent SET NX PX, is counted once in
// lockproxy_locks_held, and each way a client releases it through this
// instance takes it off and observes its holding time: a transparent DEL
// or UNLINK (of one key or several), a compare-and-delete script (EVAL or
// EVALSHA), a DEL queued in MULTI after WATCH, a PEXPIRE of no time, an
// UNLOCK. A compare-and-delete of another token releases nothing, and the
// lock stays counted. Before, a SET NX PX was not counted, and a LOCK
// released any of these transparent ways stayed counted until its lease
// ran out.
func TestTransparentReleasesTakeLocksOffHeld(t *testing.T) {
	reg, do := serveTransparent(t)
	acquire := map[string]func(key, tok string) string{
		"SET NX PX": func(key, tok string) string { return do("SET", key, tok, "NX", "PX", "20000") },
		"LOCK":      func(key, tok string) string { return do("LOCK", key, "TOKEN", tok, "PX", "20000") },
	}
	sha := strings.TrimSpace(strings.SplitN(do("SCRIPT", "LOAD", compareAndDelete), "\r\n", 3)[1])
	for _, tc := range []struct {
		name    string
		release func(key, tok string) []string // the commands, each answered before the next
		want    string                         // the last command's reply
		freed   bool
	}{
		{"DEL", func(k, _ string) []string { return []string{"DEL " + k} }, ":1\r\n", true},
		{"UNLINK", func(k, _ string) []string { return []string{"UNLINK " + k} }, ":1\r\n", true},
		{"DEL of two keys", func(k, _ string) []string { return []string{"DEL " + k + " lock:other"} }, ":1\r\n", true},
		{"compare-and-delete EVAL", func(k, tok string) []string {
			return []string{"EVAL\x00" + compareAndDelete + "\x001\x00" + k + "\x00" + tok}
		}, ":1\r\n", true},
		{"compare-and-delete EVALSHA", func(k, tok string) []string { return []string{"EVALSHA " + sha + " 1 " + k + " " + tok} }, ":1\r\n", true},
		{"WATCH MULTI DEL EXEC", func(k, _ string) []string {
			return []string{"WATCH " + k, "GET " + k, "MULTI", "DEL " + k, "EXEC"}
		}, "*1\r\n:1\r\n", true},
		{"PEXPIRE 0", func(k, _ string) []string { return []string{"PEXPIRE " + k + " 0"} }, ":1\r\n", true},
		{"UNLOCK", func(k, tok string) []string { return []string{"UNLOCK " + k + " " + tok} }, ":1\r\n", true},
		{"compare-and-delete of another token", func(k, _ string) []string {
			return []string{"EVAL\x00" + compareAndDelete + "\x001\x00" + k + "\x00someone-else"}
		}, ":0\r\n", false},
	} {
		for _, how := range []string{"SET NX PX", "LOCK"} {
			t.Run(how+"/"+tc.name, func(t *testing.T) {
				key, tok := "lock:"+strings.ReplaceAll(how+"-"+tc.name, " ", "-"), "tok-"+randomHex(4)
				held0 := metricValue(t, reg, "lockproxy_locks_held")
				obs0 := metricValue(t, reg, "lockproxy_lock_held_duration_seconds")
				if r := acquire[how](key, tok); r[0] == '-' || r[0] == '_' || r == "$-1\r\n" {
					t.Fatalf("%s = %q", how, r)
				}
				if got := metricValue(t, reg, "lockproxy_locks_held"); got != held0+1 {
					t.Fatalf("lockproxy_locks_held after %s = %v; want %v (the lock counted once)", how, got, held0+1)
				}
				var r string
				for _, c := range tc.release(key, tok) {
					sep := " "
					if strings.Contains(c, "\x00") {
						sep = "\x00"
					}
					r = do(strings.Split(c, sep)...)
				}
				if r != tc.want {
					t.Fatalf("release by %s = %q; want %q", tc.name, r, tc.want)
				}
				held, obs := metricValue(t, reg, "lockproxy_locks_held"), metricValue(t, reg, "lockproxy_lock_held_duration_seconds")
				switch {
				case tc.freed && (held != held0 || obs != obs0+1):
					t.Errorf("after the release by %s: lockproxy_locks_held = %v, holding times observed = %v; want %v and %v",
						tc.name, held, obs, held0, obs0+1)
				case !tc.freed && (held != held0+1 || obs != obs0):
					t.Errorf("after %s, which released nothing: lockproxy_locks_held = %v, holding times observed = %v; want %v and %v",
						tc.name, held, obs, held0+1, obs0)
				}
				if !tc.freed {
					if r := do("UNLOCK", key, tok); r != ":1\r\n" {
						t.Fatalf("UNLOCK = %q", r)
					}
				}
			})
		}
	}
}

// TestTransparentRenewalsKeepLocksHeld: a transparent renewal of a lock
// granted through this instance (PEXPIRE, EXPIRE, a compare-and-expire
// script, SET … XX PX of the same value, a PEXPIRE queued in MULTI after
// WATCH) renews the lease counted, so the lock stays in
// lockproxy_locks_held past its first lease, until its release. Before,
// it was taken off when the first lease ran out (LOCK), or never counted
// (SET NX PX).
func TestTransparentRenewalsKeepLocksHeld(t *testing.T) {
	reg, do := serveTransparent(t)
	const first = 1200 // ms: the first lease
	renewals := []struct {
		name  string
		renew func(key, tok string) []string
		want  string
	}{
		{"PEXPIRE", func(k, _ string) []string { return []string{"PEXPIRE " + k + " 20000"} }, ":1\r\n"},
		{"EXPIRE", func(k, _ string) []string { return []string{"EXPIRE " + k + " 20"} }, ":1\r\n"},
		{"compare-and-expire", func(k, tok string) []string {
			return []string{"EVAL\x00" + compareAndExpire + "\x001\x00" + k + "\x00" + tok + "\x0020000"}
		}, ":1\r\n"},
		{"SET XX PX", func(k, tok string) []string { return []string{"SET " + k + " " + tok + " XX PX 20000"} }, "+OK\r\n"},
		{"WATCH MULTI PEXPIRE EXEC", func(k, _ string) []string {
			return []string{"WATCH " + k, "GET " + k, "MULTI", "PEXPIRE " + k + " 20000", "EXEC"}
		}, "*1\r\n:1\r\n"},
	}
	type lock struct{ key, tok string }
	var locks []lock
	start := time.Now()
	for _, rn := range renewals {
		for _, how := range []string{"SET", "LOCK"} {
			l := lock{"lock:renew-" + strings.ReplaceAll(rn.name, " ", "-") + "-" + how, "tok-" + randomHex(4)}
			var r string
			if how == "SET" {
				r = do("SET", l.key, l.tok, "NX", "PX", "1200")
			} else {
				r = do("LOCK", l.key, "TOKEN", l.tok, "PX", "1200")
			}
			if r[0] == '-' || r == "$-1\r\n" || r == "_\r\n" {
				t.Fatalf("%s %s = %q", how, l.key, r)
			}
			for _, c := range rn.renew(l.key, l.tok) {
				sep := " "
				if strings.Contains(c, "\x00") {
					sep = "\x00"
				}
				r = do(strings.Split(c, sep)...)
			}
			if r != rn.want {
				t.Fatalf("renewal of %s by %s = %q; want %q", l.key, rn.name, r, rn.want)
			}
			locks = append(locks, l)
		}
	}
	if time.Since(start) > first*time.Millisecond {
		t.Skipf("the renewals took %v, longer than the first lease: the test cannot tell", time.Since(start))
	}
	// Past the first lease and a sweep (each second).
	time.Sleep(time.Until(start.Add(first*time.Millisecond + 2*time.Second)))
	if got := metricValue(t, reg, "lockproxy_locks_held"); got != float64(len(locks)) {
		t.Errorf("lockproxy_locks_held past the first lease = %v; want %d (every lock renewed)", got, len(locks))
	}
	if got := metricValue(t, reg, "lockproxy_lock_held_duration_seconds"); got != 0 {
		t.Errorf("holding times observed past the first lease = %v; want 0", got)
	}
	for _, l := range locks {
		if r := do("DEL", l.key); r != ":1\r\n" {
			t.Errorf("DEL %s = %q", l.key, r)
		}
	}
	if got := metricValue(t, reg, "lockproxy_locks_held"); got != 0 {
		t.Errorf("lockproxy_locks_held after the DELs = %v; want 0", got)
	}
	if got := metricValue(t, reg, "lockproxy_lock_held_duration_seconds"); got != float64(len(locks)) {
		t.Errorf("holding times observed after the DELs = %v; want %d", got, len(locks))
	}
}
