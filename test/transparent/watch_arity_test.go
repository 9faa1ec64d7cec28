package transparent

import (
	"strings"
	"testing"
)

// TestWatchUnwatchArityWithoutUpstream: without an upstream, WATCH
// without keys and UNWATCH with arguments get Redis's arity errors
// (redis-server 7.0.15's bytes), with nothing watched as with lock keys
// watched, and the watch stays. Before, with nothing watched, both were
// "unknown command", which lockproxy answers only for commands it does
// not have.
func TestWatchUnwatchArityWithoutUpstream(t *testing.T) {
	t.Parallel()
	e := start(t)
	r := dialRaw(t, e.addr)
	arity := func(n string) string { return "-ERR wrong number of arguments for '" + n + "' command\r\n" }
	for _, st := range []struct{ args, want string }{
		{"WATCH", arity("watch")},
		{"UNWATCH x", arity("unwatch")},
		{"UNWATCH", "+OK\r\n"},
		{"WATCH lock:ar", "+OK\r\n"},
		{"WATCH", arity("watch")},
		{"UNWATCH x", arity("unwatch")},
		{"MULTI", "+OK\r\n"},
		{"GET lock:ar", "+QUEUED\r\n"}, // still watched
		{"EXEC", "*1\r\n$-1\r\n"},
	} {
		if got := r.do(strings.Fields(st.args)...); got != st.want {
			t.Fatalf("%s = %q; want %q", st.args, got, st.want)
		}
	}
}
