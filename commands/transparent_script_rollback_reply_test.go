package commands

import (
	"strings"
	"testing"

	"github.com/lockproxy/lockproxy/backends"
)

// TestScriptRolledBackRepliesSayWhy: a script whose writes were rolled
// back gets an error that says why (errScriptUnbounded: it left a lock key
// without an expiry; scriptFailedError: its write was held on too few
// nodes). tReply passed both to replyError, which knows only NOQUORUM and
// context errors: the client read "ERR internal error in 'eval'; see the
// server log", and the server logged a routine refusal at error level.
func TestScriptRolledBackRepliesSayWhy(t *testing.T) {
	const setNoPX = `return redis.call('set', KEYS[1], ARGV[1])`
	w := func(value string, pttl int64) backends.NodeReply {
		return backends.NodeReply{Writes: []backends.KeyWrite{{Wrote: true, Exists: true, Value: value, PTTL: pttl}}}
	}
	for _, c := range []struct {
		name    string
		replies []backends.NodeReply
		want    string
	}{
		{"left without an expiry", []backends.NodeReply{w("tok", -1), w("tok", -1), w("tok", -1)},
			"-ERR transparent mode: the script left a lock key without an expiry"},
		{"held on too few nodes", []backends.NodeReply{w("tok", 5000), w("tok2", 5000), w("tok3", 5000)},
			"-ERR transparent mode: the script's write is held on 1 of 3 nodes"},
	} {
		if got := serveEvalOnConn(t, c.replies, setNoPX, "1", "lock:a", "tok"); !strings.HasPrefix(got, c.want) {
			t.Errorf("%s: EVAL = %q; want %q…", c.name, got, c.want)
		}
	}
}
