package lockclient

import (
	"bufio"
	"strings"
	"testing"
)

func TestParseGrant(t *testing.T) {
	want := Grant{Token: "t1", ValidityMS: 9900, Fence: 7}
	for _, tc := range []struct {
		name string
		v    any
		ok   bool
	}{
		{"RESP2 flat array", []any{"token", "t1", "validity_ms", int64(9900), "fence", int64(7)}, true},
		{"RESP3 map", map[any]any{"token": "t1", "validity_ms": int64(9900), "fence": int64(7)}, true},
		{"odd array", []any{"token", "t1", "validity_ms"}, false},
		{"missing fence", []any{"token", "t1", "validity_ms", int64(9900)}, false},
		{"extra field", []any{"token", "t1", "validity_ms", int64(9900), "fence", int64(7), "x", int64(1)}, false},
		{"empty token", []any{"token", "", "validity_ms", int64(9900), "fence", int64(7)}, false},
		{"fence as text", []any{"token", "t1", "validity_ms", int64(9900), "fence", "7"}, false},
		{"non-string key", map[any]any{1: "t1", "validity_ms": int64(9900), "fence": int64(7)}, false},
		{"not an aggregate", "OK", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := ParseGrant(tc.v)
			if tc.ok && (err != nil || g != want) {
				t.Errorf("ParseGrant(%v) = %+v, %v; want %+v", tc.v, g, err, want)
			}
			if !tc.ok && err == nil {
				t.Errorf("ParseGrant(%v) = %+v; want an error", tc.v, g)
			}
		})
	}
}

func TestReadReply(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // Reply.String(), or "error"
	}{
		{"+OK\r\n", `+"OK"`},
		{"-ERR bad\r\n", `-"ERR bad"`},
		{":42\r\n", ":42"},
		{"$3\r\nfoo\r\n", `$"foo"`},
		{"$-1\r\n", "(nil)"},
		{"_\r\n", "(nil)"},
		{"*2\r\n$1\r\na\r\n:1\r\n", `*[$"a" :1]`},
		{"%1\r\n+token\r\n$2\r\nab\r\n", `%[+"token" $"ab"]`},
		{">2\r\n+lock\r\n+k\r\n", `>[+"lock" +"k"]`},
		{":x\r\n", "error"},
		{"$3\r\nfoobar\r\n", "error"},
		{"+OK\n", "error"},
		{"?\r\n", "error"},
		{strings.Repeat("*1\r\n", 40) + ":1\r\n", "error"},
	} {
		r, err := ReadReply(bufio.NewReader(strings.NewReader(tc.in)))
		got := r.String()
		if err != nil {
			got = "error"
		}
		if got != tc.want {
			t.Errorf("ReadReply(%q) = %s (%v); want %s", tc.in, got, err, tc.want)
		}
	}
}

func TestReplyPairs(t *testing.T) {
	r, err := ReadReply(bufio.NewReader(strings.NewReader("*4\r\n+token\r\n$2\r\nab\r\n+fence\r\n:3\r\n")))
	if err != nil {
		t.Fatal(err)
	}
	m := r.Pairs()
	if m["token"].Str != "ab" || m["fence"].Int != 3 || len(m) != 2 {
		t.Errorf("Pairs() = %v; want token ab, fence 3", m)
	}
}
