package transparent

import (
	"fmt"
	"strings"
	"testing"

	"github.com/lockproxy/lockproxy/test/harness"
)

// TestWatchTxKeylessCommandsAsRedis: in a transaction after WATCH of a
// lock key, the keyless commands Redis queues and lockproxy answers itself
// (PING, ECHO, UNWATCH, SELECT of the database in use, CLIENT
// SETNAME|GETNAME) are queued and answered in their place in EXEC's
// reply, byte for byte as redis-server 7 answers the same sequence, RESP2
// and RESP3, their errors included (PING's extra argument and a non-integer
// SELECT inside EXEC's reply; a wrong arity at queue time, which aborts
// EXEC). A command lockproxy cannot serve inside the lock nodes'
// transaction (HELLO, a relayed TIME, a SELECT of another database of the
// upstream, other CLIENT subcommands) is refused when queued with an error
// that says why, and EXEC answers EXECABORT as Redis does after a queuing
// error. Before, every keyless command was refused, and EXEC aborted.
func TestWatchTxKeylessCommandsAsRedis(t *testing.T) {
	t.Parallel()
	redisRef := harness.StartRedis(t, harness.RedisOptions{})
	const execAbort = "-EXECABORT Transaction discarded because of previous errors.\r\n"
	type refusal struct {
		at   int    // index in queued of the refused command
		text string // in its error
	}
	cases := []struct {
		name   string
		queued []string // between MULTI and EXEC, "|"-separated arguments; {k} is the lock key
		after  []string // after EXEC
		// refused, by upstream or not: lockproxy refuses this command
		// with this text and EXEC aborts, where Redis queues it; nil:
		// every reply as Redis's.
		refused func(withUp bool) *refusal
		// own: the reply lockproxy gives in EXEC's reply at at, where it
		// has no other database (no upstream); "" for none.
		own func(withUp bool) (at int, reply string)
	}{
		{name: "PING", queued: []string{"PING", "DEL|{k}"}},
		{name: "PING message", queued: []string{"PING|hi there", "DEL|{k}"}},
		{name: "PING with two arguments", queued: []string{"GET|{k}", "PING|a|b", "DEL|{k}"}},
		{name: "ECHO", queued: []string{"ECHO|x", "GET|{k}", "ECHO|", "DEL|{k}"}},
		{name: "ECHO arity", queued: []string{"ECHO", "DEL|{k}"}},
		{name: "UNWATCH", queued: []string{"UNWATCH", "DEL|{k}"}},
		{name: "UNWATCH arity", queued: []string{"UNWATCH|x", "DEL|{k}"}},
		{name: "SELECT 0", queued: []string{"SELECT|0", "DEL|{k}"}},
		{name: "SELECT not a number", queued: []string{"SELECT|x", "DEL|{k}"}},
		{name: "CLIENT SETNAME and GETNAME", queued: []string{"CLIENT|GETNAME", "CLIENT|SETNAME|n1", "CLIENT|GETNAME", "DEL|{k}"},
			after: []string{"CLIENT|GETNAME"}},
		{name: "CLIENT SETNAME refused name", queued: []string{"CLIENT|SETNAME|a b", "EXISTS|{k}", "DEL|{k}"}, after: []string{"CLIENT|GETNAME"}},
		{name: "CLIENT SETNAME arity", queued: []string{"CLIENT|SETNAME", "DEL|{k}"}},
		{name: "only keyless", queued: []string{"PING", "ECHO|e"}, after: []string{"GET|{k}"}},
		{name: "mixed", queued: []string{"PING", "EXISTS|{k}", "ECHO|y", "PEXPIRE|{k}|30000", "UNWATCH", "DEL|{k}", "PING"}},
		{name: "HELLO", queued: []string{"PING", "HELLO", "DEL|{k}"}, after: []string{"GET|{k}"},
			refused: func(bool) *refusal { return &refusal{1, "HELLO cannot be queued in a transaction on lock keys"} }},
		{name: "TIME", queued: []string{"TIME", "DEL|{k}"}, after: []string{"GET|{k}"},
			refused: func(withUp bool) *refusal {
				if withUp {
					return &refusal{0, "'time' is not queued: a transaction after WATCH of lock keys runs on the lock nodes"}
				}
				return &refusal{0, "unknown command 'TIME'"}
			}},
		{name: "CLIENT ID", queued: []string{"CLIENT|ID", "DEL|{k}"}, after: []string{"GET|{k}"},
			refused: func(bool) *refusal { return &refusal{0, "'client|id' cannot be queued in a transaction on lock keys"} }},
		{name: "SELECT another database", queued: []string{"SELECT|1", "PING"}, after: []string{"GET|{k}"},
			refused: func(withUp bool) *refusal {
				if withUp {
					return &refusal{0, "SELECT of another database cannot be queued in a transaction on lock keys"}
				}
				return nil
			},
			own: func(withUp bool) (int, string) {
				if withUp {
					return -1, ""
				}
				// Without an upstream lockproxy has database 0 alone.
				return 0, "-ERR DB index is out of range\r\n"
			}},
	}
	withAndWithoutUpstream(t, func(t *testing.T, e *env, withUp bool) {
		for i, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				for _, proto := range []string{"2", "3"} {
					key := fmt.Sprintf("lock:keyless-%d-%v-%s", i, withUp, proto)
					run := func(addr string) []string {
						r := dialRaw(t, addr)
						var out []string
						if proto == "3" {
							if rep := r.do("HELLO", "3"); rep[0] != '%' {
								t.Fatalf("HELLO 3 = %q", rep)
							}
						}
						for _, c := range []string{"SET|{k}|t|NX|PX|20000", "WATCH|{k}", "MULTI"} {
							out = append(out, r.do(strings.Split(strings.ReplaceAll(c, "{k}", key), "|")...))
						}
						for _, c := range tc.queued {
							out = append(out, r.do(strings.Split(strings.ReplaceAll(c, "{k}", key), "|")...))
						}
						out = append(out, r.do("EXEC"))
						for _, c := range tc.after {
							out = append(out, r.do(strings.Split(strings.ReplaceAll(c, "{k}", key), "|")...))
						}
						return out
					}
					want, got := run(redisRef.Addr), run(e.addr)
					var ref *refusal
					if tc.refused != nil {
						ref = tc.refused(withUp)
					}
					if ref != nil {
						at := 3 + ref.at
						if !strings.HasPrefix(got[at], "-ERR ") || !strings.Contains(got[at], ref.text) {
							t.Errorf("RESP%s: %s queued = %q; want an error saying %q", proto, tc.queued[ref.at], got[at], ref.text)
						}
						if want[at] != "+QUEUED\r\n" {
							t.Errorf("RESP%s: redis-server answered %s with %q; the test expects it queued", proto, tc.queued[ref.at], want[at])
						}
						exec := 3 + len(tc.queued)
						if got[exec] != execAbort {
							t.Errorf("RESP%s: EXEC after the refusal = %q; want %q", proto, got[exec], execAbort)
						}
						// The lock was not released: EXEC ran nothing.
						if g := got[len(got)-1]; g != "$1\r\nt\r\n" {
							t.Errorf("RESP%s: GET after the aborted EXEC = %q; want the lock still held", proto, g)
						}
						continue
					}
					if tc.own != nil {
						if at, reply := tc.own(withUp); at >= 0 {
							exec := 3 + len(tc.queued)
							if !strings.Contains(got[exec], reply) {
								t.Errorf("RESP%s: EXEC = %q; want %q in it", proto, got[exec], reply)
							}
							continue
						}
					}
					for j := range want {
						if got[j] != want[j] {
							what := "EXEC"
							switch {
							case j < 3:
								what = []string{"SET NX PX", "WATCH", "MULTI"}[j]
							case j-3 < len(tc.queued):
								what = tc.queued[j-3]
							case j-4-len(tc.queued) >= 0:
								what = tc.after[j-4-len(tc.queued)]
							}
							t.Errorf("RESP%s: %s = %q; redis-server answers %q", proto, what, got[j], want[j])
						}
					}
				}
			})
		}
	})
}

// TestWatchTxKeylessCommandsNotRunWhenWatchFails: when the watched lock
// changed hands before EXEC, EXEC answers nil as redis-server does (RESP2
// and RESP3) and runs none of the commands, the keyless ones included: a
// queued CLIENT SETNAME leaves the name as it was.
func TestWatchTxKeylessCommandsNotRunWhenWatchFails(t *testing.T) {
	t.Parallel()
	redisRef := harness.StartRedis(t, harness.RedisOptions{})
	e := start(t)
	for _, proto := range []string{"2", "3"} {
		key := "lock:keyless-changed-" + proto
		run := func(addr string, change func()) []string {
			r := dialRaw(t, addr)
			if proto == "3" {
				r.do("HELLO", "3")
			}
			var out []string
			for _, c := range [][]string{{"SET", key, "t", "NX", "PX", "20000"}, {"WATCH", key}, {"MULTI"}, {"PING"},
				{"CLIENT", "SETNAME", "changed"}, {"DEL", key}} {
				out = append(out, r.do(c...))
			}
			change()
			out = append(out, r.do("EXEC"), r.do("CLIENT", "GETNAME"), r.do("GET", key))
			return out
		}
		want := run(redisRef.Addr, func() {
			d := dialRaw(t, redisRef.Addr)
			d.do("SET", key, "other", "PX", "20000")
		})
		got := run(e.addr, func() { retake(t, e, e.client(t), key, "other") })
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("RESP%s: reply %d = %q; redis-server answers %q", proto, i, got[i], want[i])
			}
		}
	}
}
