package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestAuthPermissionsScripts: a script runs as lockproxy's own user (on
// the upstream, and in transparent mode on the lock nodes), and lockproxy
// cannot check what it calls as Redis's ACL checks each redis.call. So a
// user denied writes (or a channel) must not write (or publish) through
// EVAL or EVALSHA: scripts are refused to every user not allowed every
// command, key and channel. The upstream itself, given the same ACL
// rules, is the reference for the refusals; a user allowed everything
// (with an entry or without one) runs scripts as before.
func TestAuthPermissionsScripts(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	up := harness.StartRedis(t, harness.RedisOptions{})
	in := startInstanceEnv(t, cl.addrs(), []string{
		"LOCKPROXY_UPSTREAM_ADDRESS=" + up.Addr,
		"LOCKPROXY_LOCK_PATTERNS=lock:*",
		"LOCKPROXY_AUTH_USERS=ro:ro-pw,pub:pub-pw,full:full-pw,admin:admin-pw",
		"LOCKPROXY_AUTH_PERMISSIONS=ro allkeys +@all -@write,pub allkeys &news.* +@all,full allkeys allchannels +@all",
	})
	// What Redis does with the same rules (the reference).
	ctx := lockclient.CtxFor(t, 30*time.Second)
	uc := up.Client(t)
	for _, u := range [][]any{
		{"ACL", "SETUSER", "ro", "on", ">ro-pw", "allkeys", "+@all", "-@write"},
		{"ACL", "SETUSER", "pub", "on", ">pub-pw", "allkeys", "resetchannels", "&news.*", "+@all"},
	} {
		if err := uc.Do(ctx, u...).Err(); err != nil {
			t.Fatalf("%v: %v", u, err)
		}
	}
	admin := lc.DialRaw(t, in.addr)
	if r := admin.Do("AUTH", "admin", "admin-pw"); r.Str != "OK" {
		t.Fatalf("AUTH admin = %v", r)
	}

	setScript := "return redis.call('set', 'ro:x', '1')"
	// Loaded through lockproxy: on the upstream, and remembered for the
	// EVALSHA lockproxy serves itself.
	setSHA := admin.Do("SCRIPT", "LOAD", setScript)
	if setSHA.Kind != '$' {
		t.Fatalf("SCRIPT LOAD = %v", setSHA)
	}
	acquire := "return redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', '10000')"
	publish := "return redis.call('publish', 'sport', 'm')"
	for _, tc := range []struct {
		user, pass string
		args       []string
	}{
		{"ro", "ro-pw", []string{"SET", "ro:x", "1"}},
		{"ro", "ro-pw", []string{"EVAL", setScript, "0"}},
		{"ro", "ro-pw", []string{"EVALSHA", setSHA.Str, "0"}},
		{"ro", "ro-pw", []string{"SET", "lock:ro", "tok", "NX", "PX", "10000"}},
		{"ro", "ro-pw", []string{"EVAL", acquire, "1", "lock:ro", "tok"}},
		{"pub", "pub-pw", []string{"PUBLISH", "sport", "m"}},
		{"pub", "pub-pw", []string{"EVAL", publish, "0"}},
	} {
		t.Run(tc.user+" "+tc.args[0]+" "+tc.args[len(tc.args)-1], func(t *testing.T) {
			ref := lc.DialRaw(t, up.Addr)
			if r := ref.Do("AUTH", tc.user, tc.pass); r.Str != "OK" {
				t.Fatalf("upstream AUTH = %v", r)
			}
			if tc.args[len(tc.args)-1] != "tok" { // the upstream knows no lock keys
				if r := ref.Do(tc.args...); r.Kind != '-' {
					t.Fatalf("reference: redis-server answers %q with %v; want a refusal", tc.args, r)
				}
			}
			c := lc.DialRaw(t, in.addr)
			if r := c.Do("AUTH", tc.user, tc.pass); r.Str != "OK" {
				t.Fatalf("AUTH = %v", r)
			}
			if r := c.Do(tc.args...); r.Kind != '-' || !strings.HasPrefix(r.Str, "NOPERM") {
				t.Errorf("lockproxy answers %s's %q with %v; want a NOPERM refusal, as redis-server gives", tc.user, tc.args, r)
			}
		})
	}
	// What got through.
	if r := admin.Do("GET", "ro:x"); !r.Null {
		t.Errorf("after ro's attempts, ro:x on the upstream = %v; want nil", r)
	}
	if r := admin.Do("GET", "lock:ro"); !r.Null {
		t.Errorf("after ro's attempts, the lock lock:ro on the nodes = %v; want free", r)
	}
	// Each refusal counts under the limit that made it: ro's command
	// rules (two SETs, three scripts), pub's channels (PUBLISH, a script).
	for reason, want := range map[string]string{"command": "5", "channel": "2", "key": "0"} {
		if v := metricValue(t, in, `lockproxy_auth_denied_total{reason="`+reason+`"}`); v != want {
			t.Errorf("lockproxy_auth_denied_total{reason=%q} = %q; want %s", reason, v, want)
		}
	}
	// Allowed everything: with an auth.permissions entry that grants it
	// all, or with none, scripts run as before, relayed and on lock keys.
	full := lc.DialRaw(t, in.addr)
	if r := full.Do("AUTH", "full", "full-pw"); r.Str != "OK" {
		t.Fatalf("AUTH full = %v", r)
	}
	for _, step := range []struct {
		c    *lockclient.RawConn
		args []string
		want string
	}{
		{full, []string{"EVAL", "return redis.call('set', 'full:x', '1')", "0"}, "OK"},
		{full, []string{"EVAL", acquire, "1", "lock:full", "full-tok"}, "OK"},
		{full, []string{"EVALSHA", setSHA.Str, "0"}, "OK"},
		{admin, []string{"EVAL", acquire, "1", "lock:admin", "admin-tok"}, "OK"},
		{admin, []string{"EVAL", "return redis.call('get', 'full:x')", "0"}, "1"},
	} {
		if r := step.c.Do(step.args...); r.Kind == '-' || r.Str != step.want {
			t.Errorf("%q = %v; want %q", step.args, r, step.want)
		}
	}
}

// TestAuthPermissionsLockTokenHidden: tokens are capabilities (whoever
// knows one can UNLOCK, or join the hold with LOCK … TOKEN under the same
// fence), so LOCKINFO shows another holder's token only as its hash, and
// a user denied LOCKINFO sees not even that. A plain GET of the lock key,
// served by transparent mode, must not hand the token over either: with
// it, a user that may only take its own locks releases another holder's.
// lockproxy cannot tell a LOCK's token from a client's own SET NX value,
// so a user not allowed everything reads no lock key's value (GET, SET …
// GET); a user allowed everything, who could read it with a script,
// still gets it (the SET NX + GET compare of lock libraries).
func TestAuthPermissionsLockTokenHidden(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	in := startInstanceEnv(t, cl.addrs(), []string{
		"LOCKPROXY_LOCK_PATTERNS=lock:*",
		"LOCKPROXY_AUTH_USERS=holder:holder-pw,reader:reader-pw,safe:safe-pw,full:full-pw",
		"LOCKPROXY_AUTH_PERMISSIONS=reader allkeys +@read +@lock -lockinfo,safe allkeys +@all -@dangerous,full allkeys allchannels +@all",
	})
	auth := func(user string) *lockclient.RawConn {
		c := lc.DialRaw(t, in.addr)
		if r := c.Do("AUTH", user, user+"-pw"); r.Str != "OK" {
			t.Fatalf("AUTH %s = %v", user, r)
		}
		return c
	}
	holder := auth("holder")
	token := rawGrant(t, holder, "lock:x", "PX", "20000")
	reader := auth("reader")
	if r := reader.Do("LOCKINFO", "lock:x"); !strings.HasPrefix(r.Str, "NOPERM") {
		t.Fatalf("reader: LOCKINFO = %v; want NOPERM", r)
	}
	safe := auth("safe")
	for _, tc := range []struct {
		who  string
		c    *lockclient.RawConn
		args []string
	}{
		{"reader", reader, []string{"GET", "lock:x"}},
		{"safe", safe, []string{"get", "lock:x"}},
		// SET … GET would answer the old value, and putting it back
		// (SET … XX KEEPTTL) would leave the lock as it was.
		{"safe", safe, []string{"SET", "lock:x", "mine", "XX", "KEEPTTL", "GET"}},
		{"safe", safe, []string{"SET", "lock:x", "mine", "XX", "XX", "PX", "20000", "get"}},
	} {
		got := tc.c.Do(tc.args...)
		if got.Kind != '-' || !strings.HasPrefix(got.Str, "NOPERM") || strings.Contains(got.Str, token) {
			t.Errorf("%s: %q = %v; want a NOPERM refusal", tc.who, tc.args, got)
		}
		if r := tc.c.Do("UNLOCK", "lock:x", got.Str); r.Int != 0 {
			t.Errorf("%s: UNLOCK lock:x <what %q showed> = %v; want 0: it released the holder's lock", tc.who, tc.args, r)
		}
	}
	// What shows no token is still served.
	if r := reader.Do("PTTL", "lock:x"); r.Kind != ':' || r.Int <= 0 {
		t.Errorf("reader: PTTL lock:x = %v; want the lease left", r)
	}
	if r := safe.Do("EXISTS", "lock:x"); r.Int != 1 {
		t.Errorf("safe: EXISTS lock:x = %v; want 1", r)
	}
	if r := holder.Do("RENEW", "lock:x", token, "PX", "20000"); r.Int <= 0 {
		t.Errorf("holder: RENEW = %v; want its lock still held", r)
	}
	if v := metricValue(t, in, `lockproxy_auth_denied_total{reason="key"}`); v != "4" {
		t.Errorf(`lockproxy_auth_denied_total{reason="key"} = %q; want 4, one per read refused`, v)
	}
	// Allowed everything (no entry, or one granting all): a client reads
	// back the value it set, as lock libraries do to compare.
	full := auth("full")
	for _, tc := range []struct {
		who      string
		c        *lockclient.RawConn
		key, val string
	}{
		{"holder", holder, "lock:x", token},
		{"full", full, "lock:y", "full-tok"},
	} {
		if tc.val == "full-tok" {
			if r := tc.c.Do("SET", tc.key, tc.val, "NX", "PX", "20000"); r.Str != "OK" {
				t.Fatalf("%s: SET %s NX PX = %v", tc.who, tc.key, r)
			}
		}
		if r := tc.c.Do("GET", tc.key); r.Str != tc.val {
			t.Errorf("%s: GET %s = %v; want %q, its own value", tc.who, tc.key, r, tc.val)
		}
	}
}

// TestAuthPermissionsCommandsLikeRedis: command rules (categories,
// subcommands) refuse what redis-server, given the same rules, refuses,
// for the commands lockproxy serves itself and those it relays, outside
// the connection commands the README lists as always allowed. Scripts are
// the one deliberate difference: lockproxy cannot check what a script
// calls, so it refuses EVAL to every user not allowed everything, where
// Redis runs "return 1" for any user with @scripting.
func TestAuthPermissionsCommandsLikeRedis(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	up := harness.StartRedis(t, harness.RedisOptions{})
	rules := []string{
		"+@all -@dangerous", "+@read", "+@all -@slow", "+@all -@connection", "+@all -@keyspace",
		"-@all +@fast", "+@all -@admin", "+@all -@scripting", "+@all -client", "+@all -script|load", "+@all",
	}
	var users, perms []string
	ctx := lockclient.CtxFor(t, 30*time.Second)
	uc := up.Client(t)
	for i, r := range rules {
		u := "u" + string(rune('a'+i))
		users = append(users, u+":pw")
		perms = append(perms, u+" "+r)
		acl := []any{"ACL", "SETUSER", u, "on", ">pw", "allkeys", "allchannels"}
		for _, f := range strings.Fields(r) {
			acl = append(acl, f)
		}
		if err := uc.Do(ctx, acl...).Err(); err != nil {
			t.Fatalf("%v: %v", acl, err)
		}
	}
	in := startInstanceEnv(t, cl.addrs(), []string{
		"LOCKPROXY_UPSTREAM_ADDRESS=" + up.Addr,
		"LOCKPROXY_UPSTREAM_DENY_COMMANDS=flushall",
		"LOCKPROXY_AUTH_USERS=" + strings.Join(users, ","),
		"LOCKPROXY_AUTH_PERMISSIONS=" + strings.Join(perms, ","),
	})
	cmds := [][]string{
		{"SELECT", "0"}, {"CLIENT", "NO-EVICT", "off"}, {"CLIENT", "LIST"},
		{"CLIENT", "KILL", "ID", "999999"}, {"CLIENT", "UNPAUSE"}, {"SCRIPT", "EXISTS", "abc"},
		{"SCRIPT", "LOAD", "return 1"}, {"WAIT", "0", "0"}, {"SET", "k", "v"}, {"GET", "k"}, {"DEL", "k"},
		{"PUBLISH", "c", "m"}, {"OBJECT", "ENCODING", "k"}, {"KEYS", "nomatch"}, {"TIME"}, {"DBSIZE"},
		{"MEMORY", "USAGE", "k"}, {"FUNCTION", "LIST"}, {"LATENCY", "LATEST"}, {"WATCH", "k"}, {"UNWATCH"},
		{"MULTI"}, {"DISCARD"}, {"EVAL", "return 1", "0"},
	}
	for i, r := range rules {
		u := "u" + string(rune('a'+i))
		ref := lc.DialRaw(t, up.Addr)
		c := lc.DialRaw(t, in.addr)
		for _, conn := range []*lockclient.RawConn{ref, c} {
			if rr := conn.Do("AUTH", u, "pw"); rr.Str != "OK" {
				t.Fatalf("AUTH %s = %v", u, rr)
			}
		}
		for _, args := range cmds {
			want := ref.Do(args...)
			got := c.Do(args...)
			wantRefused := want.Kind == '-' && strings.HasPrefix(want.Str, "NOPERM")
			if args[0] == "EVAL" {
				wantRefused = r != "+@all" // the difference above
			}
			gotRefused := got.Kind == '-' && strings.HasPrefix(got.Str, "NOPERM")
			if wantRefused != gotRefused {
				t.Errorf("%q %q: lockproxy = %v, redis-server = %v", r, args, got, want)
			}
		}
	}
}
