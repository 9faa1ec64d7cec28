package relay

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestFrameEnd(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     int // length of the first frame; 0 incomplete; -1 malformed
	}{
		{"status", "+OK\r\n+NEXT\r\n", 5},
		{"error", "-ERR no\r\n", 9},
		{"integer", ":42\r\n", 5},
		{"bulk", "$5\r\nhello\r\n", 11},
		{"bulk with CRLF inside", "$4\r\na\r\nb\r\n", 10},
		{"null bulk", "$-1\r\n", 5},
		{"array", "*2\r\n$1\r\na\r\n:1\r\n", 15},
		{"null array", "*-1\r\n", 5},
		{"empty array", "*0\r\n", 4},
		{"nested", "*2\r\n*1\r\n+a\r\n*0\r\n", 16},
		{"RESP3 null", "_\r\n", 3},
		{"RESP3 bool", "#t\r\n", 4},
		{"RESP3 double", ",1.5\r\n", 6},
		{"RESP3 big number", "(123\r\n", 6},
		{"RESP3 map", "%1\r\n+k\r\n:1\r\n", 12},
		{"RESP3 set", "~2\r\n+a\r\n+b\r\n", 12},
		{"RESP3 verbatim", "=8\r\ntxt:abcd\r\n", 14},
		{"RESP3 blob error", "!3\r\nERR\r\n", 9},
		{"RESP3 push", ">3\r\n+message\r\n+ch\r\n+hi\r\n", 24},
		{"attribute with its value", "|1\r\n+ttl\r\n:3\r\n+v\r\n", 18},
		{"partial header", "*2\r", 0},
		{"partial bulk", "$5\r\nhel", 0},
		{"partial array", "*2\r\n+a\r\n", 0},
		{"partial map", "%1\r\n+k\r\n", 0},
		{"unknown type", "?x\r\n", -1},
		{"bad length", "$x\r\n", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := frameEnd([]byte(tc.in))
			got := n
			if err != nil {
				got = -1
			}
			if got != tc.want {
				t.Errorf("frameEnd(%q) = %d, %v; want %d", tc.in, n, err, tc.want)
			}
		})
	}
}

// TestFrameEndLongLine: a header line over maxLine is a broken stream;
// a simple string or error is not bounded by Redis (a script's error_reply
// can be any length) and must come through whole, complete or not yet.
func TestFrameEndLongLine(t *testing.T) {
	if _, err := frameEnd([]byte("*" + strings.Repeat("1", maxLine+10))); err == nil {
		t.Errorf("a header line over %d bytes without CRLF: no error", maxLine)
	}
	for _, t0 := range []string{"+", "-"} {
		long := t0 + strings.Repeat("x", 70000)
		if n, err := frameEnd([]byte(long)); n != 0 || err != nil {
			t.Errorf("%s line of 70,000 bytes, no CRLF yet = %d, %v; want incomplete", t0, n, err)
		}
		if n, err := frameEnd([]byte(long + "\r\n:1\r\n")); n != len(long)+2 || err != nil {
			t.Errorf("%s line of 70,000 bytes = %d, %v; want %d", t0, n, err, len(long)+2)
		}
	}
}

func FuzzFrameEnd(f *testing.F) {
	for _, s := range []string{"+OK\r\n", "*2\r\n$1\r\na\r\n:1\r\n", "%1\r\n+k\r\n:1\r\n", "|1\r\n+a\r\n+b\r\n+c\r\n", ">2\r\n+a\r\n+b\r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := frameEnd(b)
		if err == nil && (n < 0 || n > len(b)) {
			t.Fatalf("frameEnd(%q) = %d", b, n)
		}
		if err == nil && n > 0 {
			elements(b[:n]) // must not panic
		}
	})
}

func TestFilterKeys(t *testing.T) {
	r := New(Config{KeyPrefix: "lockproxy:"})
	for _, tc := range []struct {
		name string
		in   string
		scan bool
		want string
	}{
		{"keys", "*3\r\n$1\r\na\r\n$11\r\nlockproxy:x\r\n$1\r\nb\r\n", false, "*2\r\n$1\r\na\r\n$1\r\nb\r\n"},
		{"keys nothing to drop", "*1\r\n$1\r\na\r\n", false, "*1\r\n$1\r\na\r\n"},
		{"scan", "*2\r\n$1\r\n0\r\n*2\r\n$11\r\nlockproxy:x\r\n$1\r\nb\r\n", true, "*2\r\n$1\r\n0\r\n*1\r\n$1\r\nb\r\n"},
		{"error", "-ERR x\r\n", false, "-ERR x\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(r.FilterKeys([]byte(tc.in), tc.scan)); got != tc.want {
				t.Errorf("FilterKeys(%q) = %q; want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	r := New(Config{KeyPrefix: "lp:", Deny: []string{"flushall", "client|kill"}})
	ks := keySpecs{
		"set": {first: 1, last: 1, step: 1}, "mset": {first: 1, last: -1, step: 2},
		"object": {}, "object|encoding": {first: 2, last: 2, step: 1}, "publish": {},
		"sort": {first: 1, last: 1, step: 1, movable: true}, "somemodule": {first: 1, last: 1, step: 1, movable: true},
	}
	r.setSpecs(ks)
	if _, ok := r.specs.Load().simple["set"]; !ok {
		t.Fatal("SET is not on the one-lookup path")
	}
	// The same answers without the one-lookup path.
	slow := New(Config{KeyPrefix: "lp:", Deny: []string{"flushall", "client|kill"}})
	slow.specs.Store(&specTable{all: ks})
	for _, tc := range []struct {
		args string
		want string // "" allowed, "deny", "key", "script"
	}{
		{"SET a lp:value", ""},
		{"SET lp:a v", "key"},
		{"MSET a 1 lp:b 2", "key"},
		{"MSET a lp:1 b lp:2", ""},
		{"OBJECT ENCODING lp:a", "key"},
		{"OBJECT ENCODING a", ""},
		{"PUBLISH lp:chan m", ""},
		{"EVAL return 2 a lp:b", "key"},
		{"EVAL return 1 a lp:b", "key"}, // in ARGV: a script reaches it as well
		{"EVAL redis.call('del','lp:x') 0", "script"},
		{"SCRIPT LOAD redis.call('del','lp:x')", "script"},
		{"SORT a STORE lp:d", "key"},
		{"XREADGROUP GROUP g c STREAMS s lp:s 0 0", "key"},
		{"XREADGROUP GROUP g c STREAMS s t 0 lp:0", ""},
		{"XREADGROUP GROUP streams c STREAMS s lp:s 0 0", "key"}, // a group named "streams"
		{"XREADGROUP GROUP g streams COUNT 1 STREAMS s lp:s 0 0", "key"},
		{"SOMEMODULE x lp:y", "key"},
		{"UNKNOWNCMD lp:x", "key"},
		{"FLUSHALL", "deny"},
		{"CLIENT KILL ID 1", "deny"},
		{"client kill id 1", "deny"},
		{"CLIENT LIST", ""},
		{"EVAL redis.call('FLUSHALL') 0", "deny-script"},
		{"EVAL redis.call(\"flushall\",\"async\") 0", "deny-script"},
		{"EVAL redis.call('client','kill','id','1') 0", "deny-script"},
		{"EVAL redis.call('client','list') 0", ""},
		{"EVAL redis.call('get','flushall:count') 0", ""},
		{"SCRIPT LOAD redis.call('flushall')", "deny-script"},
	} {
		args := strings.Fields(tc.args)
		if strings.HasPrefix(tc.args, "EVAL redis") || strings.HasPrefix(tc.args, "SCRIPT LOAD") {
			i := strings.Index(tc.args, "redis.call")
			j := strings.LastIndex(tc.args, ")") + 1
			args = append(strings.Fields(tc.args[:i]), tc.args[i:j])
			args = append(args, strings.Fields(tc.args[j:])...)
		}
		var b [][]byte
		for _, a := range args {
			b = append(b, []byte(a))
		}
		err := r.Check([]byte(lower(args[0])), b)
		got := ""
		switch e := err.(type) {
		case *DeniedError:
			got = "deny"
			if e.Script {
				got = "deny-script"
			}
		case *ReservedError:
			got = "key"
			if e.Script {
				got = "script"
			}
		}
		if got != tc.want {
			t.Errorf("Check(%s) = %v; want %q", tc.args, err, tc.want)
		}
		if serr := slow.Check([]byte(lower(args[0])), b); fmt.Sprint(serr) != fmt.Sprint(err) {
			t.Errorf("Check(%s) = %v, but %v without the one-lookup path", tc.args, err, serr)
		}
	}
}

// TestCommandCategories: the categories in the upstream's COMMAND reply
// (RESP2 and RESP3), a container's subcommand by its own entry.
func TestCommandCategories(t *testing.T) {
	arr := func(els ...string) string { return "*" + strconv.Itoa(len(els)) + "\r\n" + strings.Join(els, "") }
	set := func(els ...string) string { return "~" + strconv.Itoa(len(els)) + "\r\n" + strings.Join(els, "") }
	bulk := func(s string) string { return "$" + strconv.Itoa(len(s)) + "\r\n" + s + "\r\n" }
	status := func(s string) string { return "+" + s + "\r\n" }
	num := func(n int) string { return ":" + strconv.Itoa(n) + "\r\n" }
	entry := func(set func(...string) string, name string, first int, cats []string, subs ...string) string {
		c := make([]string, len(cats))
		for i, cat := range cats {
			c[i] = status(cat)
		}
		return arr(bulk(name), num(-2), set(status("readonly")), num(first), num(first), num(first),
			set(c...), arr(), arr(), arr(subs...))
	}
	for _, proto := range []struct {
		name string
		set  func(...string) string
	}{{"resp2", arr}, {"resp3", set}} {
		reply := arr(
			entry(proto.set, "get", 1, []string{"@read", "@string", "@fast"}),
			entry(proto.set, "config", 0, []string{"@slow"},
				entry(proto.set, "config|get", 0, []string{"@admin", "@slow", "@dangerous"}),
				entry(proto.set, "config|set", 0, []string{"@admin", "@slow", "@dangerous"})),
		)
		r := New(Config{})
		specs := parseSpecs([]byte(reply))
		if specs == nil {
			t.Fatalf("%s: the reply did not parse", proto.name)
		}
		r.setSpecs(specs)
		for _, tc := range []struct {
			args     string
			full     string
			cats     []string
			notKnown bool
		}{
			{"GET k", "get", []string{"@read", "@string", "@fast"}, false},
			{"get config", "get", []string{"@read", "@string", "@fast"}, false},
			{"CONFIG GET maxmemory", "config|get", []string{"@admin", "@slow", "@dangerous"}, false},
			{"config nosuch", "config", []string{"@slow"}, false},
			{"NOSUCH x", "nosuch", nil, true},
		} {
			var args [][]byte
			for _, a := range strings.Fields(tc.args) {
				args = append(args, []byte(a))
			}
			full, cats, known := r.Command([]byte(strings.ToLower(string(args[0]))), args)
			if full != tc.full || !slices.Equal(cats, tc.cats) || known == tc.notKnown {
				t.Errorf("%s: %s = %q %q %v; want %q %q %v", proto.name, tc.args, full, cats, known, tc.full, tc.cats, !tc.notKnown)
			}
		}
	}
}
