package commands

import (
	"strings"
	"testing"

	"github.com/lockproxy/lockproxy/resp"
)

// TestUnsupportedOnLockKeyNamesWhatIsServed: the refusal of a command on a
// lock key lists the forms transparent mode serves, as the README's table
// has them. Before, the list gave SET only as "SET key value NX PX|EX ttl,
// SET … XX", leaving out the plain SET key value PX|EX ttl (a new holder,
// or the holder's renewal), its GET, XX KEEPTTL, and WATCH/MULTI/EXEC,
// which are all served.
func TestUnsupportedOnLockKeyNamesWhatIsServed(t *testing.T) {
	h := NewHandler(Options{Limits: testLimits, Backend: &fakeBackend{}, LockPatterns: []string{"lock:*"}})
	defer h.Close()
	for _, cmd := range [][]string{{"SETNX", "lock:a", "v"}, {"GETDEL", "lock:a"}, {"PERSIST", "lock:a"}} {
		s := &resp.Session{W: resp.NewWriter()}
		args := make([][]byte, len(cmd))
		for i, x := range cmd {
			args[i] = []byte(x)
		}
		h.ServeRESP(s, args)
		got := string(s.W.Bytes())
		if !strings.HasPrefix(got, "-ERR transparent mode: '"+strings.ToLower(cmd[0])+"' is not supported on lock keys") {
			t.Fatalf("%v = %q; want the transparent-mode refusal", cmd, got)
		}
		for _, want := range []string{
			"SET key value NX PX|EX ttl",
			"SET key value [XX] PX|EX ttl [GET]",
			"SET key value XX KEEPTTL [GET]",
			"WATCH, MULTI, EXEC",
		} {
			if !strings.Contains(got, want) {
				t.Errorf("%v = %q; want it to list %q", cmd, got, want)
			}
		}
	}
}
