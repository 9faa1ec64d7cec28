package commands

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/relay"
)

// TestAuthLimiter: failed authentications per address get a burst of
// authFailBurst, then authFailRate a second; other addresses are not held
// back.
func TestAuthLimiter(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	var a authLimiter
	for i := 0; i < authFailBurst; i++ {
		if !a.allowed("10.0.0.1", t0) {
			t.Fatalf("attempt %d within the burst refused", i)
		}
		a.failed("10.0.0.1", t0)
	}
	// One more failure, as when the pay-back let one attempt through:
	// 21 spent, so the next attempt waits for 1.x of them to be paid back.
	a.failed("10.0.0.1", t0)
	for _, tc := range []struct {
		name string
		from string
		at   time.Duration
		want bool
	}{
		{"burst spent", "10.0.0.1", 0, false},
		{"another address", "10.0.0.2", 0, true},
		{"not yet paid back below the burst", "10.0.0.1", 99 * time.Millisecond, false},
		{"paid back below the burst", "10.0.0.1", 101 * time.Millisecond, true},
	} {
		if got := a.allowed(tc.from, t0.Add(tc.at)); got != tc.want {
			t.Errorf("%s: allowed(%s, +%v) = %v; want %v", tc.name, tc.from, tc.at, got, tc.want)
		}
	}
}

// TestAuthLimiterFullTable: past authFailAddrs addresses that owe
// failures, a new address is neither tracked nor refused, so many
// guessers cannot lock out a client with the right password; once the old
// ones are paid back (and a sweep is due) new addresses are tracked again.
func TestAuthLimiterFullTable(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	var a authLimiter
	for i := 0; i < authFailAddrs; i++ {
		for j := 0; j <= authFailBurst; j++ {
			a.failed("2001:db8:"+strconv.FormatInt(int64(i), 16)+"::", t0)
		}
	}
	for j := 0; j <= authFailBurst; j++ {
		a.failed("198.51.100.1", t0)
	}
	if !a.allowed("198.51.100.7", t0.Add(10*time.Millisecond)) || !a.allowed("198.51.100.1", t0.Add(10*time.Millisecond)) {
		t.Fatal("a new address is refused while the table is full of others")
	}
	// Three seconds later everything is paid back: the next failure sweeps
	// and is tracked.
	later := t0.Add(3 * time.Second)
	for j := 0; j <= authFailBurst; j++ {
		a.failed("198.51.100.1", later)
	}
	if a.allowed("198.51.100.1", later) || len(a.m) != 1 {
		t.Fatalf("after the pay-back: allowed, %d addresses tracked; want refused, 1", len(a.m))
	}
}

func TestClientHost(t *testing.T) {
	for _, tc := range []struct{ addr, want string }{
		{"127.0.0.1:5000", "127.0.0.1"},
		{"[::ffff:10.1.2.3]:5000", "10.1.2.3"},
		{"[2001:db8:1:2:3:4:5:6]:5000", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:ffff::1]:1", "2001:db8:1:2::/64"},
		{"not an address", "not an address"},
	} {
		if got := clientHost(tc.addr); got != tc.want {
			t.Errorf("clientHost(%q) = %q; want %q", tc.addr, got, tc.want)
		}
	}
}

// TestPermitted: a user's permissions let through the commands it was
// given (by name, @lock, @all) and those a library sends as it connects,
// and lockproxy's own commands only on keys that match its globs.
func TestPermitted(t *testing.T) {
	h := NewHandler(Options{Limits: testLimits, Backend: &fakeBackend{}})
	app := newPerm(Permission{Commands: []string{"+@lock", "+get"}, Keys: []string{"app:*", "shared"}})
	all := newPerm(Permission{Commands: []string{"+@all"}, Keys: []string{"app:*"}})
	anyKey := newPerm(Permission{Commands: []string{"+eval"}})
	allKeys := newPerm(Permission{Commands: []string{"+eval", "+get"}, Keys: []string{"*"}, LimitKeys: true})
	noKeys := newPerm(Permission{Commands: []string{"+get", "+ping"}, LimitKeys: true})
	tx := newPerm(Permission{Commands: []string{"+multi", "+set"}})
	subs := newPerm(Permission{Commands: []string{"+@all", "-client|kill", "-script|flush", "-@scripting", "+script|load"}})
	cats := newPerm(Permission{Commands: []string{"+@read", "+@lock", "-lockinfo"}})
	none := newPerm(Permission{Commands: []string{"+@all", "-@all", "+get"}})
	chans := newPerm(Permission{Commands: []string{"+@all"}, Channels: []string{"news.*"}})
	noChans := newPerm(Permission{Commands: []string{"+@all"}, LimitChannels: true})
	allChans := newPerm(Permission{Commands: []string{"+@all"}, Channels: []string{"*"}, LimitChannels: true})
	allOnly := newPerm(Permission{Commands: []string{"+@all"}})
	safe := newPerm(Permission{Commands: []string{"+@all", "-@dangerous", "-@write"}})
	readOnly := newPerm(Permission{Commands: []string{"+@all", "-@write"}})
	for _, tc := range []struct {
		p       *perm
		args    []string
		want    string // "" when permitted
		relayed bool   // in MULTI or RESP3 pub/sub: every command goes upstream
	}{
		{app, []string{"PING"}, "", false},
		{app, []string{"HELLO", "3"}, "", false},
		{app, []string{"CLIENT", "SETNAME", "x"}, "", false},
		{app, []string{"CLIENT", "KILL", "ID", "1"}, "NOPERM User app has no permissions to run the 'client|kill' command", false},
		{app, []string{"LOCK", "app:1", "PX", "100"}, "", false},
		{app, []string{"LOCK", "shared", "PX", "100"}, "", false},
		{app, []string{"LOCK", "app:a/b", "PX", "100"}, "", false}, // Redis's *, not path.Match's
		{app, []string{"LOCK", "other", "PX", "100"}, "NOPERM No permissions to access a key", false},
		{app, []string{"UNLOCK", "other", "t"}, "NOPERM No permissions to access a key", false},
		{app, []string{"LOCKINFO", "app:1"}, "", false},
		{app, []string{"GET", "app:1"}, "", false}, // transparent mode's, without an upstream
		{app, []string{"GET", "lock:1"}, "NOPERM No permissions to access a key", false},
		{app, []string{"SET", "app:1", "v"}, "NOPERM User app has no permissions to run the 'set' command", false},
		{all, []string{"SET", "app:1", "v"}, "", false},
		{all, []string{"LOCK", "other", "PX", "100"}, "NOPERM No permissions to access a key", false},
		{all, []string{"EVAL", "return 1", "1", "app:1", "lock:1"}, "NOPERM User app has key patterns and may not run scripts ('eval'): a script reaches keys it does not declare", false},
		// A script runs as lockproxy's own user: only a user allowed
		// every command, key and channel may run one.
		{anyKey, []string{"EVAL", "return 1", "1", "other"}, "NOPERM User app is not allowed every command and may not run scripts ('eval'): lockproxy cannot check the commands a script calls", false},
		{allOnly, []string{"EVAL", "return 1", "1", "other"}, "", false},
		{allOnly, []string{"EVALSHA", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db", "0"}, "", false},
		{chans, []string{"EVAL", "return 1", "0"}, "NOPERM User app has channel patterns and may not run scripts ('eval'): a script reaches channels it does not declare", false},
		{safe, []string{"FCALL", "f", "0"}, "NOPERM User app has no permissions to run the 'fcall' command", false}, // -@write: a category it may be in
		{all, []string{"SORT", "app:l", "BY", "nosort", "GET", "other:*"}, "NOPERM BY and GET options of SORT read keys outside this user's patterns", false},
		{all, []string{"SORT_RO", "app:l", "BY", "other:*"}, "NOPERM BY and GET options of SORT read keys outside this user's patterns", false},
		{all, []string{"SORT", "app:l", "BY", "nosort", "GET", "#"}, "", false},
		{all, []string{"SCRIPT", "LOAD", "return 1"}, "", false},
		{tx, []string{"EXEC"}, "", false},
		{tx, []string{"DISCARD"}, "", false},
		{app, []string{"EXEC"}, "NOPERM User app has no permissions to run the 'exec' command", false},
		{all, []string{"DEL", "app:1", "lock:1"}, "NOPERM No permissions to access a key", false},
		{allKeys, []string{"EVAL", "return 1", "1", "other"}, "NOPERM User app is not allowed every command and may not run scripts ('eval'): lockproxy cannot check the commands a script calls", false}, // ~* is no key limit, but +eval is not every command
		{noKeys, []string{"GET", "x"}, "NOPERM No permissions to access a key", false},
		{noKeys, []string{"PING"}, "", false},
		// Subcommand rules, and the last matching rule decides.
		{subs, []string{"CLIENT", "KILL", "ID", "1"}, "NOPERM User app has no permissions to run the 'client|kill' command", false},
		{subs, []string{"client", "list"}, "", false},
		// CLIENT UNBLOCK without an upstream: Redis's categories.
		{safe, []string{"CLIENT", "UNBLOCK", "1"}, "NOPERM User app has no permissions to run the 'client|unblock' command", false},
		{allOnly, []string{"CLIENT", "UNBLOCK", "1"}, "", false},
		{readOnly, []string{"CLIENT", "UNBLOCK", "1"}, "", false},
		// CLIENT HELP and COMMAND HELP without an upstream: Redis's
		// categories (@slow @connection), not an unknown command's.
		{safe, []string{"CLIENT", "HELP"}, "", false},
		{safe, []string{"COMMAND", "HELP"}, "", false},
		{none, []string{"CLIENT", "HELP"}, "NOPERM User app has no permissions to run the 'client|help' command", false},
		{subs, []string{"SCRIPT", "FLUSH"}, "NOPERM User app has no permissions to run the 'script|flush' command", false},
		{subs, []string{"SCRIPT", "LOAD", "return 1"}, "", false},
		{subs, []string{"EVAL", "return 1", "0"}, "NOPERM User app has no permissions to run the 'eval' command", false},
		{subs, []string{"LOCK", "x", "PX", "100"}, "", false},
		// Categories: lockproxy's table's, and Redis's for the commands
		// transparent mode serves.
		{cats, []string{"GET", "app:1"}, "", false},
		{cats, []string{"PTTL", "app:1"}, "", false},
		{cats, []string{"SET", "app:1", "v"}, "NOPERM User app has no permissions to run the 'set' command", false},
		{cats, []string{"UNLOCK", "app:1", "t"}, "", false},
		{cats, []string{"LOCKINFO", "app:1"}, "NOPERM User app has no permissions to run the 'lockinfo' command", false},
		{none, []string{"GET", "x"}, "", false},
		{none, []string{"LOCK", "x", "PX", "100"}, "NOPERM User app has no permissions to run the 'lock' command", false},
		// Channels: globs for channels, equality for PSUBSCRIBE's patterns.
		{chans, []string{"SUBSCRIBE", "news.a", "news.b"}, "", false},
		{chans, []string{"SUBSCRIBE", "news.a", "sport"}, "NOPERM No permissions to access a channel", false},
		{chans, []string{"SSUBSCRIBE", "sport"}, "NOPERM No permissions to access a channel", false},
		{chans, []string{"PSUBSCRIBE", "news.*"}, "", false},
		{chans, []string{"PSUBSCRIBE", "news.a*"}, "NOPERM No permissions to access a channel", false},
		{chans, []string{"PUBLISH", "news.x", "m"}, "", false},
		{chans, []string{"SPUBLISH", "sport", "m"}, "NOPERM No permissions to access a channel", false},
		{chans, []string{"UNSUBSCRIBE", "sport"}, "", false},
		{noChans, []string{"SUBSCRIBE", "news.a"}, "NOPERM No permissions to access a channel", false},
		{noChans, []string{"GET", "x"}, "", false},
		{allChans, []string{"PSUBSCRIBE", "a*"}, "", false},
		{allOnly, []string{"PUBLISH", "any", "m"}, "", false},                                                             // no channel rule: any channel
		{subs, []string{"PUBLISH", "any", "m"}, "NOPERM User app has no permissions to run the 'publish' command", false}, // categories unknown: -@scripting may be it
		// CLIENT's subcommands have Redis 7's categories; one lockproxy
		// does not serve is the upstream's, here unknown: refused by a
		// category removed.
		{safe, []string{"CLIENT", "LIST"}, "NOPERM User app has no permissions to run the 'client|list' command", false},
		{safe, []string{"CLIENT", "ID"}, "", false},
		{safe, []string{"CLIENT", "PAUSE", "1000"}, "NOPERM User app has no permissions to run the 'client|pause' command", false},
		{allOnly, []string{"CLIENT", "PAUSE", "1000"}, "", false},
		{app, []string{"CLIENT", "NO-EVICT", "on"}, "NOPERM User app has no permissions to run the 'client|no-evict' command", false},
		{safe, []string{"HSET", "h", "f", "v"}, "NOPERM User app has no permissions to run the 'hset' command", false},
		{safe, []string{"GET", "k"}, "", false},
		{all, []string{"HSET", "app:h", "f", "v"}, "", false},
		{safe, []string{"CLIENT", strings.Repeat("x", 100)}, "NOPERM User app has no permissions to run the 'client|' command", false},
		// Where every command goes upstream, INFO and CLIENT SETNAME are
		// the upstream's: checked like any other.
		{app, []string{"INFO"}, "NOPERM User app has no permissions to run the 'info' command", true},
		{app, []string{"CLIENT", "SETNAME", "x"}, "NOPERM User app has no permissions to run the 'client|setname' command", true},
		{app, []string{"RESET"}, "", true},
		{app, []string{"QUIT"}, "", true},
	} {
		args := make([][]byte, len(tc.args))
		for i, a := range tc.args {
			args[i] = []byte(a)
		}
		name := strings.ToLower(tc.args[0])
		msg, ok := h.permitted(tc.p, "app", name, table[name], args, tc.relayed)
		if ok != (tc.want == "") || msg != tc.want {
			t.Errorf("%q: %q, %v; want %q", tc.args, msg, ok, tc.want)
		}
	}
}

// TestPermittedLockKeysUpstreamDown: commands on lock keys (transparent
// mode) are checked on their own keys even when the upstream is down and
// its key table unknown, where a relayed command has every argument
// checked.
func TestPermittedLockKeysUpstreamDown(t *testing.T) {
	down := relay.New(relay.Config{Addr: "127.0.0.1:1", PoolSize: 1, DialTimeout: 50 * time.Millisecond})
	defer down.Close()
	h := NewHandler(Options{Limits: testLimits, Backend: &fakeBackend{}, Relay: down, LockPatterns: []string{"lock:*"}})
	p := newPerm(Permission{Commands: []string{"+set"}, Keys: []string{"lock:app:*"}})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"SET", "lock:app:1", "tok", "NX", "PX", "5000"}, ""},
		{[]string{"SET", "lock:other", "tok", "NX", "PX", "5000"}, "NOPERM No permissions to access a key"},
	} {
		args := make([][]byte, len(tc.args))
		for i, a := range tc.args {
			args[i] = []byte(a)
		}
		if msg, _ := h.permitted(p, "app", "set", table["set"], args, false); msg != tc.want {
			t.Errorf("%q: %q; want %q", tc.args, msg, tc.want)
		}
	}
}
