package commands

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/lockproxy/lockproxy/resp"
)

// TestLockCommandsAreBlocking: LOCK and RLOCK … WAIT block the connection
// until the lock is free, so COMMAND INFO gives them Redis's "blocking"
// flag and @blocking category, as Redis does for XREAD, which blocks only
// with its BLOCK option. The commands that never wait (UNLOCK, RENEW,
// LOCKINFO) stay without them. A client or proxy that reads the flag to
// keep blocking commands off a shared connection, and an operator who
// reads `help @blocking`, then see the lock commands that wait.
func TestLockCommandsAreBlocking(t *testing.T) {
	h := NewHandler(Options{Limits: testLimits})
	defer h.Close()
	want := map[string]bool{"lock": true, "rlock": true, "unlock": false, "renew": false, "lockinfo": false}
	for _, proto := range []int{2, 3} {
		t.Run(fmt.Sprintf("RESP%d", proto), func(t *testing.T) {
			s := &resp.Session{W: resp.NewWriter()}
			s.W.SetProto(proto)
			h.ServeRESP(s, words("COMMAND INFO lock rlock unlock renew lockinfo"))
			v := parseOne(t, s.W.Bytes(), proto)
			if v.typ != '*' || len(v.elems) != len(want) {
				t.Fatalf("COMMAND INFO = %c with %d elements; want %d", v.typ, len(v.elems), len(want))
			}
			for _, info := range v.elems {
				if len(info.elems) < 7 {
					t.Fatalf("COMMAND INFO entry %+v; want 10 elements", info)
				}
				name := info.elems[0].str
				strs := func(set value) []string {
					var out []string
					for _, e := range set.elems {
						out = append(out, e.str)
					}
					return out
				}
				flags, cats := strs(info.elems[2]), strs(info.elems[6])
				if got := slices.Contains(flags, "blocking"); got != want[name] {
					t.Errorf("%s: flags %q; blocking %v, want %v", name, flags, got, want[name])
				}
				if got := slices.Contains(cats, "@blocking"); got != want[name] {
					t.Errorf("%s: categories %q; @blocking %v, want %v", name, cats, got, want[name])
				}
			}
		})
	}
}

// TestBlockingCategoryRules: as Redis refuses XREAD to a user with
// "-@blocking" even without BLOCK, such a user runs no LOCK or RLOCK, with
// or without WAIT (the category is the command's, not the call's), while
// UNLOCK, RENEW and LOCKINFO, which never wait, stay allowed; a rule
// naming the command after it ("+lock") gives LOCK back.
func TestBlockingCategoryRules(t *testing.T) {
	h := NewHandler(Options{Limits: testLimits, Backend: &fakeBackend{}})
	defer h.Close()
	noBlocking := newPerm(Permission{Commands: []string{"+@all", "-@blocking"}})
	locksNoBlocking := newPerm(Permission{Commands: []string{"+@lock", "-@blocking"}})
	lockBack := newPerm(Permission{Commands: []string{"+@all", "-@blocking", "+lock"}})
	onlyBlocking := newPerm(Permission{Commands: []string{"+@blocking"}})
	// In Redis every command is @fast or @slow.
	noSlow := newPerm(Permission{Commands: []string{"+@all", "-@slow"}})
	for _, tc := range []struct {
		name string
		p    *perm
		args string
		want string // "" when permitted
	}{
		{"-@blocking refuses LOCK … WAIT", noBlocking, "LOCK k PX 100 WAIT 100", "NOPERM User app has no permissions to run the 'lock' command"},
		{"-@blocking refuses LOCK without WAIT", noBlocking, "LOCK k PX 100", "NOPERM User app has no permissions to run the 'lock' command"},
		{"-@blocking refuses RLOCK … WAIT", noBlocking, "RLOCK k PX 100 WAIT 100", "NOPERM User app has no permissions to run the 'rlock' command"},
		{"-@blocking allows UNLOCK", noBlocking, "UNLOCK k t", ""},
		{"-@blocking allows RENEW", noBlocking, "RENEW k t PX 100", ""},
		{"-@blocking allows LOCKINFO", noBlocking, "LOCKINFO k", ""},
		{"+@lock -@blocking refuses LOCK", locksNoBlocking, "LOCK k PX 100", "NOPERM User app has no permissions to run the 'lock' command"},
		{"+@lock -@blocking allows UNLOCK", locksNoBlocking, "UNLOCK k t", ""},
		{"+lock after -@blocking allows LOCK … WAIT", lockBack, "LOCK k PX 100 WAIT 100", ""},
		{"+lock after -@blocking leaves RLOCK refused", lockBack, "RLOCK k PX 100", "NOPERM User app has no permissions to run the 'rlock' command"},
		{"+@blocking allows LOCK", onlyBlocking, "LOCK k PX 100 WAIT 100", ""},
		{"+@blocking does not allow UNLOCK", onlyBlocking, "UNLOCK k t", "NOPERM User app has no permissions to run the 'unlock' command"},
		{"-@slow refuses LOCK", noSlow, "LOCK k PX 100", "NOPERM User app has no permissions to run the 'lock' command"},
		{"-@slow refuses RLOCK", noSlow, "RLOCK k PX 100", "NOPERM User app has no permissions to run the 'rlock' command"},
		{"-@slow refuses LOCKINFO", noSlow, "LOCKINFO k", "NOPERM User app has no permissions to run the 'lockinfo' command"},
		{"-@slow allows UNLOCK (@fast)", noSlow, "UNLOCK k t", ""},
		{"-@slow allows RENEW (@fast)", noSlow, "RENEW k t PX 100", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := words(tc.args)
			name := strings.ToLower(string(args[0]))
			msg, ok := h.permitted(tc.p, "app", name, table[name], args, false)
			if ok != (tc.want == "") || msg != tc.want {
				t.Errorf("%s: %q, %v; want %q", tc.args, msg, ok, tc.want)
			}
		})
	}
}
