package relay

import "testing"

// TestLuaUnescapedReadsEveryLua51Escape: Redis's Lua 5.1 reads a backslash
// before a character that starts no other escape as that character, so
// the prefix check must read it so too: 'lockproxy\:x' names the key
// "lockproxy:x" as surely as 'lockproxy\58x' does.
func TestLuaUnescapedReadsEveryLua51Escape(t *testing.T) {
	r := New(Config{Addr: "127.0.0.1:1", KeyPrefix: "lockproxy:"})
	defer r.Close()
	for _, tc := range []struct {
		body, want string
	}{
		{`'lockproxy\58x'`, `'lockproxy:x'`},
		{`'lockproxy\058x'`, `'lockproxy:x'`},
		{`'lockproxy\0581'`, `'lockproxy:1'`},
		{`'lockproxy\:x'`, `'lockproxy:x'`},
		{`'lockprox\y:x'`, `'lockproxy:x'`},
		{`'lockproxy\\58'`, `'lockproxy\58'`},
		{`'a\nb\tc'`, "'a\nb\tc'"},
		{"'a\\\r\nb'", "'a\nb'"},
		{`'\x3a\z\u{3a}'`, `'x3azu{3a}'`},
		{`'it\'s'`, `'it's'`},
	} {
		if got := string(luaUnescaped([]byte(tc.body))); got != tc.want {
			t.Errorf("luaUnescaped(%q) = %q; want %q", tc.body, got, tc.want)
		}
	}
	for _, body := range []string{`return redis.call('DEL', 'lockproxy\:k')`, `return redis.call('DEL', "lock\proxy:k")`} {
		if err := r.Check([]byte("eval"), [][]byte{[]byte("EVAL"), []byte(body), []byte("0")}); err == nil {
			t.Errorf("EVAL %s: relayed; want the reserved-prefix refusal", body)
		}
	}
}
