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
	for _, tc := range []struct {
		p    *perm
		args []string
		want string // "" when permitted
	}{
		{app, []string{"PING"}, ""},
		{app, []string{"HELLO", "3"}, ""},
		{app, []string{"CLIENT", "SETNAME", "x"}, ""},
		{app, []string{"CLIENT", "KILL", "ID", "1"}, "NOPERM User app has no permissions to run the 'client|kill' command"},
		{app, []string{"LOCK", "app:1", "PX", "100"}, ""},
		{app, []string{"LOCK", "shared", "PX", "100"}, ""},
		{app, []string{"LOCK", "app:a/b", "PX", "100"}, ""}, // Redis's *, not path.Match's
		{app, []string{"LOCK", "other", "PX", "100"}, "NOPERM No permissions to access a key"},
		{app, []string{"UNLOCK", "other", "t"}, "NOPERM No permissions to access a key"},
		{app, []string{"LOCKINFO", "app:1"}, ""},
		{app, []string{"GET", "app:1"}, ""}, // transparent mode's, without an upstream
		{app, []string{"GET", "lock:1"}, "NOPERM No permissions to access a key"},
		{app, []string{"SET", "app:1", "v"}, "NOPERM User app has no permissions to run the 'set' command"},
		{all, []string{"SET", "app:1", "v"}, ""},
		{all, []string{"LOCK", "other", "PX", "100"}, "NOPERM No permissions to access a key"},
		{all, []string{"EVAL", "return 1", "1", "app:1", "lock:1"}, "NOPERM User app has key patterns and may not run scripts ('eval'): a script reaches keys it does not declare"},
		{anyKey, []string{"EVAL", "return 1", "1", "other"}, ""},
		{all, []string{"SORT", "app:l", "BY", "nosort", "GET", "other:*"}, "NOPERM BY and GET options of SORT read keys outside this user's patterns"},
		{all, []string{"SORT_RO", "app:l", "BY", "other:*"}, "NOPERM BY and GET options of SORT read keys outside this user's patterns"},
		{all, []string{"SORT", "app:l", "BY", "nosort", "GET", "#"}, ""},
		{all, []string{"SCRIPT", "LOAD", "return 1"}, ""},
		{tx, []string{"EXEC"}, ""},
		{tx, []string{"DISCARD"}, ""},
		{app, []string{"EXEC"}, "NOPERM User app has no permissions to run the 'exec' command"},
		{all, []string{"DEL", "app:1", "lock:1"}, "NOPERM No permissions to access a key"},
		{allKeys, []string{"EVAL", "return 1", "1", "other"}, ""}, // ~* is no limit
		{noKeys, []string{"GET", "x"}, "NOPERM No permissions to access a key"},
		{noKeys, []string{"PING"}, ""},
		// Subcommand rules, and the last matching rule decides.
		{subs, []string{"CLIENT", "KILL", "ID", "1"}, "NOPERM User app has no permissions to run the 'client|kill' command"},
		{subs, []string{"client", "list"}, ""},
		{subs, []string{"SCRIPT", "FLUSH"}, "NOPERM User app has no permissions to run the 'script|flush' command"},
		{subs, []string{"SCRIPT", "LOAD", "return 1"}, ""},
		{subs, []string{"EVAL", "return 1", "0"}, "NOPERM User app has no permissions to run the 'eval' command"},
		{subs, []string{"LOCK", "x", "PX", "100"}, ""},
		// Categories: lockproxy's table's, and Redis's for the commands
		// transparent mode serves.
		{cats, []string{"GET", "app:1"}, ""},
		{cats, []string{"PTTL", "app:1"}, ""},
		{cats, []string{"SET", "app:1", "v"}, "NOPERM User app has no permissions to run the 'set' command"},
		{cats, []string{"UNLOCK", "app:1", "t"}, ""},
		{cats, []string{"LOCKINFO", "app:1"}, "NOPERM User app has no permissions to run the 'lockinfo' command"},
		{none, []string{"GET", "x"}, ""},
		{none, []string{"LOCK", "x", "PX", "100"}, "NOPERM User app has no permissions to run the 'lock' command"},
		// Channels: globs for channels, equality for PSUBSCRIBE's patterns.
		{chans, []string{"SUBSCRIBE", "news.a", "news.b"}, ""},
		{chans, []string{"SUBSCRIBE", "news.a", "sport"}, "NOPERM No permissions to access a channel"},
		{chans, []string{"SSUBSCRIBE", "sport"}, "NOPERM No permissions to access a channel"},
		{chans, []string{"PSUBSCRIBE", "news.*"}, ""},
		{chans, []string{"PSUBSCRIBE", "news.a*"}, "NOPERM No permissions to access a channel"},
		{chans, []string{"PUBLISH", "news.x", "m"}, ""},
		{chans, []string{"SPUBLISH", "sport", "m"}, "NOPERM No permissions to access a channel"},
		{chans, []string{"UNSUBSCRIBE", "sport"}, ""},
		{noChans, []string{"SUBSCRIBE", "news.a"}, "NOPERM No permissions to access a channel"},
		{noChans, []string{"GET", "x"}, ""},
		{allChans, []string{"PSUBSCRIBE", "a*"}, ""},
		{subs, []string{"PUBLISH", "any", "m"}, ""}, // no channel rule: any channel
	} {
		args := make([][]byte, len(tc.args))
		for i, a := range tc.args {
			args[i] = []byte(a)
		}
		name := strings.ToLower(tc.args[0])
		msg, ok := h.permitted(tc.p, "app", name, table[name], args)
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
		if msg, _ := h.permitted(p, "app", "set", table["set"], args); msg != tc.want {
			t.Errorf("%q: %q; want %q", tc.args, msg, tc.want)
		}
	}
}
