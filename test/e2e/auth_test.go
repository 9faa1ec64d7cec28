package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestAuthPassword: with auth.password set, a connection must AUTH (or
// HELLO … AUTH) before anything else, as with Redis's requirepass; go-redis
// given the password works under RESP2 (AUTH) and RESP3 (HELLO 3 AUTH);
// RESET signs the connection out.
func TestAuthPassword(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	in := startInstanceEnv(t, cl.addrs(), []string{"LOCKPROXY_AUTH_PASSWORD=s3cret"})

	rc := lc.DialRaw(t, in.addr)
	for _, step := range []struct {
		args []string
		want string // prefix of the reply, Kind included
	}{
		{[]string{"PING"}, "-NOAUTH"},
		{[]string{"LOCK", "k", "PX", "1000"}, "-NOAUTH"},
		{[]string{"HELLO", "3"}, "-NOAUTH"},
		{[]string{"AUTH", "wrong"}, "-WRONGPASS"},
		{[]string{"AUTH", "someone", "s3cret"}, "-WRONGPASS"},
		{[]string{"AUTH", "s3cret"}, "+OK"},
		{[]string{"PING"}, "+PONG"},
		{[]string{"RESET"}, "+RESET"},
		{[]string{"PING"}, "-NOAUTH"},
		{[]string{"AUTH", "default", "s3cret"}, "+OK"},
		{[]string{"PING"}, "+PONG"},
	} {
		r := rc.Do(step.args...)
		got := string(r.Kind) + r.Str
		if !strings.HasPrefix(got, step.want) {
			t.Fatalf("%v = %v; want %s…", step.args, r, step.want)
		}
	}

	for _, proto := range []int{2, 3} {
		c := redis.NewClient(&redis.Options{
			Addr: in.addr, Protocol: proto, Password: "s3cret", MaxRetries: -1, DisableIdentity: true,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		})
		g, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 10*time.Second), c, "auth-"+lockclient.RandID(), "PX", 5000)
		if err != nil || !ok || g.Fence == 0 {
			t.Errorf("RESP%d with the password: LOCK = %+v, %v, %v; want a grant", proto, g, ok, err)
		}
		_ = c.Close()
		bad := redis.NewClient(&redis.Options{
			Addr: in.addr, Protocol: proto, Password: "nope", MaxRetries: -1, DisableIdentity: true,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		})
		if err := bad.Ping(lockclient.CtxFor(t, 10*time.Second)).Err(); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
			t.Errorf("RESP%d with a wrong password: PING = %v; want WRONGPASS", proto, err)
		}
		_ = bad.Close()
	}
}

// TestAuthUsers: named users from auth.users (a YAML file here) next to
// the default user's password. Each signs in with AUTH user password or
// HELLO 3 AUTH user password, CLIENT INFO names the user, a wrong or
// unknown pair is refused alike, and go-redis with a username works under
// RESP2 and RESP3.
func TestAuthUsers(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	cfg := filepath.Join(t.TempDir(), "lockproxy.yaml")
	if err := os.WriteFile(cfg, []byte("auth:\n  password: root-pw\n  users:\n    - \"alice:a:pw\"\n    - \"bob:b-pw\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	in := startInstance(t, cl.addrs(), "--config", cfg)

	rc := lc.DialRaw(t, in.addr)
	for _, step := range []struct {
		args []string
		want string // prefix of the reply, Kind included
	}{
		{[]string{"PING"}, "-NOAUTH"},
		{[]string{"AUTH", "alice", "wrong"}, "-WRONGPASS"},
		{[]string{"AUTH", "mallory", "a:pw"}, "-WRONGPASS"},
		{[]string{"AUTH", "bob", "a:pw"}, "-WRONGPASS"},
		{[]string{"AUTH", "alice", "a:pw"}, "+OK"},
		{[]string{"PING"}, "+PONG"},
		{[]string{"CLIENT", "INFO"}, "$"},
		{[]string{"AUTH", "bob", "nope"}, "-WRONGPASS"},
		{[]string{"PING"}, "+PONG"}, // a failed AUTH leaves alice signed in, as in Redis
		{[]string{"HELLO", "3", "AUTH", "bob", "b-pw"}, "%"},
		{[]string{"AUTH", "root-pw"}, "+OK"},
		{[]string{"PING"}, "+PONG"},
	} {
		r := rc.Do(step.args...)
		got := string(r.Kind) + r.Str
		if !strings.HasPrefix(got, step.want) {
			t.Fatalf("%v = %v; want %s…", step.args, r, step.want)
		}
		if step.args[0] == "CLIENT" && !strings.Contains(r.Str, " user=alice ") {
			t.Errorf("CLIENT INFO after AUTH alice = %q; want user=alice", r.Str)
		}
	}

	for _, proto := range []int{2, 3} {
		c := redis.NewClient(&redis.Options{
			Addr: in.addr, Protocol: proto, Username: "bob", Password: "b-pw", MaxRetries: -1, DisableIdentity: true,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		})
		g, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 10*time.Second), c, "users-"+lockclient.RandID(), "PX", 5000)
		if err != nil || !ok || g.Fence == 0 {
			t.Errorf("RESP%d as bob: LOCK = %+v, %v, %v; want a grant", proto, g, ok, err)
		}
		if info, err := c.Do(lockclient.CtxFor(t, 10*time.Second), "CLIENT", "INFO").Text(); err != nil || !strings.Contains(info, " user=bob ") {
			t.Errorf("RESP%d as bob: CLIENT INFO = %q, %v; want user=bob", proto, info, err)
		}
		_ = c.Close()
	}
	// The configuration as logged names no user and no password.
	out := in.proc.Output()
	for _, secret := range []string{"alice", "a:pw", "b-pw", "root-pw"} {
		if strings.Contains(out, secret) {
			t.Errorf("lockproxy's output contains %q", secret)
		}
	}
}

// TestAuthPreAuthLimits: with a password set, a connection that has not
// authenticated may send at most 10 arguments and 16 KB per argument, as
// Redis allows; more is a protocol error and the connection is closed
// (REFERENCE.md's security rules). AUTH lifts the caps for what follows,
// also in the same pipeline, and RESET puts them back. Failed passwords
// from one address are throttled beyond a burst of 20, without the
// password being compared. Both on goroutines (no upstream) and on the
// event loop (with one).
func TestAuthPreAuthLimits(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	up := harness.StartRedis(t, harness.RedisOptions{})
	for _, mode := range servingModes(up) {
		t.Run(mode.name, func(t *testing.T) {
			in := startInstanceEnv(t, cl.addrs(), append(mode.env, "LOCKPROXY_AUTH_PASSWORD=s3cret"))
			closedAfter := func(rc *lockclient.RawConn, write, want string) {
				t.Helper()
				rc.Write(write)
				r, err := rc.Read()
				if err != nil || string(r.Kind)+r.Str != want {
					t.Fatalf("%.40q before AUTH = %v, %v; want %s", write, r, err, want)
				}
				if r, err := rc.ReadWithin(5 * time.Second); err == nil {
					t.Fatalf("after the protocol error the connection answered %v; want it closed", r)
				}
			}
			closedAfter(lc.DialRaw(t, in.addr), "*11\r\n", "-ERR Protocol error: unauthenticated multibulk length")
			closedAfter(lc.DialRaw(t, in.addr), "*1\r\n$16385\r\n", "-ERR Protocol error: unauthenticated bulk length")

			rc := lc.DialRaw(t, in.addr)
			big := strings.Repeat("x", 16<<10)
			for _, args := range [][]string{{"ECHO", big}, {"PING", "1", "2", "3", "4", "5", "6", "7", "8", "9"}} {
				if r := rc.Do(args...); !strings.HasPrefix(string(r.Kind)+r.Str, "-NOAUTH") {
					t.Fatalf("%.20q… (at the caps) before AUTH = %v; want -NOAUTH", args, r)
				}
			}
			// One write on a new connection: AUTH, then what only an
			// authenticated client may send.
			rc = lc.DialRaw(t, in.addr)
			bigger := strings.Repeat("y", 20000)
			rc.Write(lockclient.Encode("AUTH", "s3cret") + lockclient.Encode("ECHO", bigger) +
				lockclient.Encode("ECHO", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10") + lockclient.Encode("PING"))
			for i, want := range []string{"+OK", "$" + bigger, "-ERR wrong number of arguments", "+PONG"} {
				r, err := rc.Read()
				if got := string(r.Kind) + r.Str; err != nil || !strings.HasPrefix(got, want) {
					t.Fatalf("reply %d to the pipeline after AUTH = %.60q, %v; want %.60q…", i, got, err, want)
				}
			}
			if mode.name == "event loop" {
				// The pipeline was served where it came in, on the loop.
				info := rc.Do("INFO", "lockproxy").Str
				if !strings.Contains(info, "lockproxy_event_loop_clients:1\r\n") {
					t.Fatalf("INFO lockproxy after the pipeline:\n%s\nwant this connection on the event loop", info)
				}
			}
			if r := rc.Do("RESET"); r.Str != "RESET" {
				t.Fatalf("RESET = %v", r)
			}
			closedAfter(rc, "*11\r\n", "-ERR Protocol error: unauthenticated multibulk length")

			// 30 wrong passwords and the right one in one write: the first
			// 20 are checked, then nearly every attempt is refused unchecked
			// (each 100 ms pays one back), the right one too.
			rc = lc.DialRaw(t, in.addr)
			var guesses strings.Builder
			for i := 0; i < 30; i++ {
				guesses.WriteString(lockclient.Encode("AUTH", "guess"+strconv.Itoa(i)))
			}
			guesses.WriteString(lockclient.Encode("AUTH", "s3cret"))
			rc.Write(guesses.String())
			throttled := 0
			for i := 0; i <= 30; i++ {
				r, err := rc.Read()
				if err != nil {
					t.Fatalf("reply %d to the guesses: %v", i, err)
				}
				wrong := strings.HasPrefix(r.Str, "WRONGPASS")
				held := strings.HasPrefix(r.Str, "ERR too many failed authentication attempts")
				switch {
				case i < 20 && !wrong:
					t.Fatalf("guess %d = %v; want WRONGPASS within the burst", i, r)
				case i == 30 && !held:
					t.Fatalf("the right password right after 30 failures = %v; want it throttled", r)
				case !wrong && !held:
					t.Fatalf("guess %d = %v; want WRONGPASS or throttled", i, r)
				}
				if held {
					throttled++
				}
			}
			if throttled < 6 {
				t.Fatalf("%d of 31 attempts after a burst of 20 failures throttled; want most of the last 11", throttled)
			}
			wrong, _ := strconv.Atoi(metricValue(t, in, `lockproxy_auth_failures_total{result="wrong_password"}`))
			held, _ := strconv.Atoi(metricValue(t, in, `lockproxy_auth_failures_total{result="throttled"}`))
			if wrong < 20 || held != throttled {
				t.Fatalf("lockproxy_auth_failures_total: wrong_password %d, throttled %d; want at least 20 and %d", wrong, held, throttled)
			}
			time.Sleep(300 * time.Millisecond) // 10 failures a second are paid back
			if r := rc.Do("AUTH", "s3cret"); r.Str != "OK" {
				t.Fatalf("AUTH with the password 300 ms later = %v; want OK", r)
			}
		})
	}
}

// TestAuthTimeout: with a password set, a connection that has not
// authenticated within limits.auth_timeout is closed (one that says
// nothing, and one that keeps sending commands without AUTH), while an
// authenticated one stays open however idle; RESET signs a connection out
// and starts its clock again. On goroutines and on the event loop.
func TestAuthTimeout(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	up := harness.StartRedis(t, harness.RedisOptions{})
	for _, mode := range servingModes(up) {
		t.Run(mode.name, func(t *testing.T) {
			in := startInstanceEnv(t, cl.addrs(), append(mode.env, "LOCKPROXY_AUTH_PASSWORD=s3cret", "LOCKPROXY_LIMITS_AUTH_TIMEOUT=300ms"))
			closed := func(rc *lockclient.RawConn, what string) {
				t.Helper()
				for i := 0; i < 50; i++ {
					rc.Send("PING")
					r, err := rc.ReadWithin(5 * time.Second)
					if err != nil {
						return // closed
					}
					if !strings.HasPrefix(r.Str, "NOAUTH") {
						t.Fatalf("%s: PING = %v; want NOAUTH until it is closed", what, r)
					}
					time.Sleep(100 * time.Millisecond)
				}
				t.Fatalf("%s: still open 5 s in; want it closed after 300ms", what)
			}
			silent := lc.DialRaw(t, in.addr)
			authed := lc.DialRaw(t, in.addr)
			if r := authed.Do("AUTH", "s3cret"); r.Str != "OK" {
				t.Fatalf("AUTH = %v", r)
			}
			closed(lc.DialRaw(t, in.addr), "a connection sending commands without AUTH")
			if r, err := silent.ReadWithin(5 * time.Second); err == nil {
				t.Fatalf("a silent connection got %v; want it closed", r)
			}
			time.Sleep(500 * time.Millisecond)
			if r := authed.Do("PING"); r.Str != "PONG" {
				t.Fatalf("an authenticated connection, idle past the timeout: PING = %v", r)
			}
			if r := authed.Do("RESET"); r.Str != "RESET" {
				t.Fatalf("RESET = %v", r)
			}
			closed(authed, "a connection signed out by RESET")
			if n, _ := strconv.Atoi(metricValue(t, in, "lockproxy_auth_timeouts_total")); n < 3 {
				t.Fatalf("lockproxy_auth_timeouts_total = %d; want the 3 connections closed", n)
			}
		})
	}
}

// TestAuthPermissions: a user with auth.permissions runs only its
// commands, on keys matching its globs, whether lockproxy serves the
// command (LOCK) or relays it (GET, EVAL's keys); a refusal inside MULTI
// aborts the EXEC, as in Redis; a user without permissions may do
// everything.
func TestAuthPermissions(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	up := harness.StartRedis(t, harness.RedisOptions{})
	in := startInstanceEnv(t, cl.addrs(), []string{
		"LOCKPROXY_UPSTREAM_ADDRESS=" + up.Addr,
		"LOCKPROXY_AUTH_USERS=app:app-pw,ops:ops-pw,reader:reader-pw,safe:safe-pw",
		"LOCKPROXY_AUTH_PERMISSIONS=app ~app:* ~shared +@lock +get +set +eval +multi +exec," +
			"reader allkeys &news.* +@read +@lock +@pubsub -@dangerous -object|encoding -lockinfo," +
			"safe +@all -@dangerous",
	})
	app := lc.DialRaw(t, in.addr)
	if r := app.Do("AUTH", "app", "app-pw"); r.Str != "OK" {
		t.Fatalf("AUTH app = %v", r)
	}
	checkSteps(t, "app", app, []permStep{
		{[]string{"PING"}, "+PONG"},
		{[]string{"CLIENT", "SETNAME", "app-1"}, "+OK"},
		{[]string{"SET", "app:x", "1"}, "+OK"},
		{[]string{"GET", "app:x"}, "$1"},
		{[]string{"GET", "shared"}, "$"},
		{[]string{"SET", "other:x", "1"}, "-NOPERM No permissions to access a key"},
		{[]string{"DEL", "app:x"}, "-NOPERM User app has no permissions to run the 'del' command"},
		{[]string{"LOCK", "app:lock", "PX", "5000"}, "*"},
		{[]string{"LOCK", "other:lock", "PX", "5000"}, "-NOPERM No permissions to access a key"},
		{[]string{"EVAL", "return 1", "1", "app:x"}, "-NOPERM User app has key patterns and may not run scripts"},
		{[]string{"MULTI"}, "+OK"},
		{[]string{"SET", "app:y", "1"}, "+QUEUED"},
		{[]string{"SET", "other:y", "1"}, "-NOPERM"},
		{[]string{"EXEC"}, "-EXECABORT"},
		{[]string{"GET", "app:y"}, "$-1"},
	})
	// Categories (from the upstream's COMMAND table for relayed commands),
	// subcommand rules, the last matching rule deciding, and channels.
	reader := lc.DialRaw(t, in.addr)
	if r := reader.Do("AUTH", "reader", "reader-pw"); r.Str != "OK" {
		t.Fatalf("AUTH reader = %v", r)
	}
	checkSteps(t, "reader", reader, []permStep{
		{[]string{"GET", "any"}, "$-1"},
		{[]string{"SET", "any", "1"}, "-NOPERM User reader has no permissions to run the 'set' command"},
		{[]string{"KEYS", "*"}, "-NOPERM User reader has no permissions to run the 'keys' command"}, // @read but @dangerous
		{[]string{"OBJECT", "ENCODING", "app:x"}, "-NOPERM User reader has no permissions to run the 'object|encoding' command"},
		{[]string{"OBJECT", "REFCOUNT", "app:x"}, ":"},
		{[]string{"EVAL", "return 1", "0"}, "-NOPERM User reader has no permissions to run the 'eval' command"},
		{[]string{"LOCK", "reader:lock", "PX", "5000"}, "*"},
		{[]string{"LOCKINFO", "reader:lock"}, "-NOPERM User reader has no permissions to run the 'lockinfo' command"},
		{[]string{"PUBLISH", "news.x", "m"}, ":0"},
		{[]string{"PUBLISH", "sport", "m"}, "-NOPERM No permissions to access a channel"},
		{[]string{"SUBSCRIBE", "sport"}, "-NOPERM No permissions to access a channel"},
		{[]string{"CLIENT", "NO-EVICT", "on"}, "-NOPERM User reader has no permissions to run the 'client|no-evict' command"},
		{[]string{"PSUBSCRIBE", "news.*"}, ">"},
	})
	// +@all -@dangerous: the subcommands lockproxy serves and those it
	// relays have Redis's categories (CLIENT LIST and PAUSE are
	// dangerous); in MULTI, INFO is the upstream's and dangerous too.
	safe := lc.DialRaw(t, in.addr)
	if r := safe.Do("AUTH", "safe", "safe-pw"); r.Str != "OK" {
		t.Fatalf("AUTH safe = %v", r)
	}
	checkSteps(t, "safe", safe, []permStep{
		{[]string{"SET", "safe:x", "1"}, "+OK"},
		{[]string{"CLIENT", "SETNAME", "s"}, "+OK"},
		{[]string{"CLIENT", "LIST"}, "-NOPERM User safe has no permissions to run the 'client|list' command"},
		{[]string{"CLIENT", "PAUSE", "10000"}, "-NOPERM User safe has no permissions to run the 'client|pause' command"},
		{[]string{"CLIENT", "UNPAUSE"}, "-NOPERM User safe has no permissions to run the 'client|unpause' command"},
		{[]string{"OBJECT", "ENCODING", "safe:x"}, "$"},
		{[]string{"INFO"}, "$"},
		{[]string{"MULTI"}, "+OK"},
		{[]string{"INFO"}, "-NOPERM User safe has no permissions to run the 'info' command"},
		{[]string{"EXEC"}, "-EXECABORT"},
	})
	ops := lc.DialRaw(t, in.addr)
	if r := ops.Do("AUTH", "ops", "ops-pw"); r.Str != "OK" {
		t.Fatalf("AUTH ops = %v", r)
	}
	if r := ops.Do("SET", "other:x", "1"); r.Str != "OK" {
		t.Fatalf("ops (no permissions entry): SET other:x = %v; want OK", r)
	}
	if r := ops.Do("DEL", "other:x"); r.Kind != ':' {
		t.Fatalf("ops: DEL other:x = %v; want an integer", r)
	}
}

// servingMode is one way lockproxy serves a connection, and the
// environment that makes it so.
type servingMode struct {
	name string
	env  []string
}

// servingModes are the two: on a goroutine of its own (no upstream), and
// on the event loop (with up as the upstream).
func servingModes(up *harness.Redis) []servingMode {
	return []servingMode{{"goroutines", nil}, {"event loop", []string{"LOCKPROXY_UPSTREAM_ADDRESS=" + up.Addr}}}
}

// TestAuthPermissionsUpstreamTable: the upstream's command table is read
// again when lockproxy reconnects to it, so a command it gained (a newer
// version, a module) is judged by its categories: here GETDEL, renamed
// away at first (unknown, so -@dangerous refuses it), then back.
func TestAuthPermissionsUpstreamTable(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	up := harness.StartRedis(t, harness.RedisOptions{Args: []string{"--rename-command", "GETDEL", ""}})
	in := startInstanceEnv(t, cl.addrs(), []string{
		"LOCKPROXY_UPSTREAM_ADDRESS=" + up.Addr,
		"LOCKPROXY_AUTH_USERS=safe:safe-pw",
		"LOCKPROXY_AUTH_PERMISSIONS=safe +@all -@dangerous",
	})
	c := lc.DialRaw(t, in.addr)
	if r := c.Do("AUTH", "safe", "safe-pw"); r.Str != "OK" {
		t.Fatalf("AUTH = %v", r)
	}
	if r := c.Do("GETDEL", "k"); !strings.HasPrefix(r.Str, "NOPERM User safe has no permissions to run the 'getdel' command") {
		t.Fatalf("GETDEL, unknown to the upstream = %v; want NOPERM", r)
	}
	up.RestartWithArgs()
	// Relayed traffic finds the old connection gone and reconnects (the
	// first command may get the error); then the table is the new one.
	deadline := time.Now().Add(20 * time.Second)
	for {
		c.Do("GET", "k")
		r := c.Do("GETDEL", "k")
		if r.Null {
			break // allowed, and the key is not there
		}
		if time.Now().After(deadline) {
			t.Fatalf("GETDEL after the upstream came back with it = %v; want nil", r)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// permStep is one command and the reply it must get, as replySummary
// puts it: a prefix of it.
type permStep struct {
	args []string
	want string
}

// checkSteps runs steps on c, as user who, in order.
func checkSteps(t *testing.T, who string, c *lockclient.RawConn, steps []permStep) {
	t.Helper()
	for _, step := range steps {
		r := c.Do(step.args...)
		if got := replySummary(r); !strings.HasPrefix(got, step.want) {
			t.Fatalf("%s: %q = %v; want %s…", who, step.args, r, step.want)
		}
	}
}

// replySummary is a reply as a string to match: its kind and text, "$-1"
// for nil, "$<length>" for a bulk string, ":<n>" for an integer, and ">"
// for a PSUBSCRIBE confirmation.
func replySummary(r lockclient.Reply) string {
	switch {
	case r.Null:
		return "$-1"
	case r.Kind == '$':
		return "$" + strconv.Itoa(len(r.Str))
	case r.Kind == ':':
		return ":" + strconv.FormatInt(r.Int, 10)
	case r.Kind == '*' && len(r.Elems) > 0 && r.Elems[0].Str == "psubscribe":
		return ">"
	}
	return string(r.Kind) + r.Str
}
