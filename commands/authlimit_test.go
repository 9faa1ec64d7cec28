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
	app := newPerm(Permission{Commands: []string{"@lock", "get"}, Keys: []string{"app:*", "shared"}})
	all := newPerm(Permission{Commands: []string{"@all"}, Keys: []string{"app:*"}})
	anyKey := newPerm(Permission{Commands: []string{"eval"}})
	tx := newPerm(Permission{Commands: []string{"multi", "set"}})
	for _, tc := range []struct {
		p    *perm
		args []string
		want string // "" when permitted
	}{
		{app, []string{"PING"}, ""},
		{app, []string{"HELLO", "3"}, ""},
		{app, []string{"CLIENT", "SETNAME", "x"}, ""},
		{app, []string{"CLIENT", "KILL", "ID", "1"}, "NOPERM User app has no permissions to run the 'client' command"},
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
	p := newPerm(Permission{Commands: []string{"set"}, Keys: []string{"lock:app:*"}})
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
