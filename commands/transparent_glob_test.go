package commands

import (
	"bytes"
	"crypto/sha1"
	"encoding/hex"
	"math/rand/v2"
	"strings"
	"testing"
)

// Tests of the pieces commit 705bc13 added to transparent.go: the glob
// intersection behind the KEYS/SCAN MATCH check (globPositions,
// globsIntersect), the Lua string-literal lexer and the lock-key check of
// script bodies (luaStrings, namesLockKey, lockKeyOutsideKeys), and the
// LRU script cache.

// tgRedisMatch is a direct port of Redis's stringmatchlen (src/util.c,
// nocase = 0), the reference for what a KEYS or SCAN MATCH glob matches.
// Like the C code, reading one byte past the pattern's end yields NUL (the
// pattern is an sds).
func tgRedisMatch(pattern, s []byte) bool {
	skip := false
	return tgRedisMatchImpl(pattern, 0, s, 0, &skip, 0)
}

func tgRedisMatchImpl(pat []byte, pi int, str []byte, si int, skipLonger *bool, nesting int) bool {
	if nesting > 1000 {
		return false
	}
	pc := func(i int) byte {
		if i < len(pat) {
			return pat[i]
		}
		return 0
	}
	for pi < len(pat) && si < len(str) {
		switch pat[pi] {
		case '*':
			for pi < len(pat) && pc(pi+1) == '*' {
				pi++
			}
			if len(pat)-pi == 1 {
				return true
			}
			for si < len(str) {
				if tgRedisMatchImpl(pat, pi+1, str, si, skipLonger, nesting+1) {
					return true
				}
				if *skipLonger {
					return false
				}
				si++
			}
			*skipLonger = true
			return false
		case '?':
			si++
		case '[':
			pi++
			not := pc(pi) == '^'
			if not {
				pi++
			}
			match := false
			for {
				if pc(pi) == '\\' && len(pat)-pi >= 2 {
					pi++
					if pat[pi] == str[si] {
						match = true
					}
				} else if pc(pi) == ']' {
					break
				} else if len(pat)-pi == 0 {
					pi--
					break
				} else if len(pat)-pi >= 3 && pat[pi+1] == '-' {
					lo, hi := pat[pi], pat[pi+2]
					if lo > hi {
						lo, hi = hi, lo
					}
					pi += 2
					if c := str[si]; c >= lo && c <= hi {
						match = true
					}
				} else if pat[pi] == str[si] {
					match = true
				}
				pi++
			}
			if not {
				match = !match
			}
			if !match {
				return false
			}
			si++
		case '\\':
			if len(pat)-pi >= 2 {
				pi++
			}
			fallthrough
		default:
			if pat[pi] != str[si] {
				return false
			}
			si++
		}
		pi++
		if si == len(str) {
			for pc(pi) == '*' {
				pi++
			}
			break
		}
	}
	return pi == len(pat) && si == len(str)
}

func TestTGRedisMatchPort(t *testing.T) {
	// The port against stringmatchlen's known answers, quirks included.
	for _, c := range []struct {
		pattern, s string
		want       bool
	}{
		{"lock:*", "lock:a", true},
		{"lock:*", "lock:", true},
		{"lock:*", "xlock:a", false},
		{"*:lock:*", "a:lock:b", true},
		{"l?ck", "lock", true},
		{"[ab]", "b", true},
		{"[^ab]", "b", false},
		{"[a-c]", "b", true},
		{"[c-a]", "b", true},
		{`a\*b`, "a*b", true},
		{`a\*b`, "axb", false},
		{`[\]]`, "]", true},
		{`a\`, `a\`, true},
		{"[]a]", "a", false}, // '[]' is an empty class in Redis
		{"[^]", "x", true},   // and '[^]' any byte
		{"[ab", "b", true},   // an open class runs to the end
		{"*", "", false},     // stringmatchlen("*", "") is 0
		{"", "", true},
		{"a*", "a", true},
		{"a*b*c", "aXXbYYc", true},
		{"a*b*c", "aXXbYY", false},
	} {
		if got := tgRedisMatch([]byte(c.pattern), []byte(c.s)); got != c.want {
			t.Errorf("tgRedisMatch(%q, %q) = %v; want %v", c.pattern, c.s, got, c.want)
		}
	}
}

// tgGlobCase: want is globsIntersect's answer; conservative marks the
// cases where it is true although no key matches both under
// stringmatchlen (the classes globPositions documents as read as '*', and
// the empty key, which stringmatchlen matches only with an empty glob).
type tgGlobCase struct {
	a, b         string
	want         bool
	conservative bool // want is true, though no key matches both in Redis
}

var tgGlobCases = []tgGlobCase{
	{"lock:*", "lock?doc*", true, false},
	{"lock:*", "lock:doc:read:*", true, false},
	{"*:lock:*", "a:lock:b", true, false},
	{"*:lock:*", "a:lok:b", false, false},
	{"lock:*", "*:read:*", true, false},
	{"lock:*", "*", true, false},
	{"lock:*", "plain:*", false, false},
	{"lock:doc:read:*", "lock:doc:write:*", false, false},
	{"lock:*", "[l]ock:doc:read:*", true, false},
	{"lock:*", "[^l]ock:*", false, false},
	{"lock:*", "[^a-k]ock:*", true, false},
	{"lock:*", "[a-k]*", false, false},
	{"lock:*", "[k-m]*", true, false},
	{"lock:*", "[m-k]*", true, false}, // a reversed range, as Redis reads it
	{"lock:*", `\lock:*`, true, false},
	{"lock:*", `lock\:*`, true, false},
	{"lock:*", `lock\?*`, false, false},
	{"lock:[ab]", "lock:[^ab]", false, false},
	{"lock:[ab]", "lock:[^a]", true, false},
	{"[a-c]", "[d-f]", false, false},
	{"[a-c]", "[c-f]", true, false},
	{`a\*b`, "a*b", true, false},
	{`a\*b`, "axb", false, false},
	{`a\?`, "a?", true, false},
	{`a\?`, "ab", false, false},
	{`lock:\`, `lock:\\`, true, false}, // a trailing '\' is a literal '\'
	{`lock:\`, "lock:x", false, false},
	{"abc", "abc", true, false},
	{"abc", "abd", false, false},
	{"ab", "abc", false, false},
	{"a?", "?b", true, false},
	{"a*", "*b", true, false},
	{"a*a", "b*", false, false},
	{"a*b*c", "*c*b*a*", true, false}, // "acbac"
	{"?", "", false, false},
	{"*?*", "", false, false},
	{"??", "a", false, false},
	{"", "", true, false},
	{"", "lock:*", false, false},
	{"", "*", true, true}, // stringmatchlen("*", "") is 0
	// Classes read as '*' from there on (documented in globPositions).
	{"lock:[a-]", "lock:b", true, true},   // Redis: the range ']'-'a'
	{"lock:[ab", "plain", false, false},   // the literal start still counts
	{"lock:[ab", "lock:zz", true, true},   // Redis: an open class, "lock:" + one of "ab"
	{"lock:[]a]", "lock:a", true, true},   // Redis: '[]' matches no byte
	{`lock:[\a-b]`, "lock:c", true, true}, // Redis: 'a', or '-' through 'b'
	{"lock:[^]", "lock:x", true, false},   // Redis: '[^]' any byte
	{"x[]", "lock:*", false, false},
}

func TestGlobsIntersect(t *testing.T) {
	for _, c := range tgGlobCases {
		ga, gb := globPositions([]byte(c.a)), globPositions([]byte(c.b))
		if got := globsIntersect(ga, gb); got != c.want {
			t.Errorf("globsIntersect(%q, %q) = %v; want %v", c.a, c.b, got, c.want)
		}
		if got := globsIntersect(gb, ga); got != c.want {
			t.Errorf("globsIntersect(%q, %q) = %v; want %v", c.b, c.a, got, c.want)
		}
		// Check the table against the reference: a common key is found
		// (short keys over the globs' bytes, and keys built from the
		// globs) iff want and not conservative.
		found := tgFindCommon([]byte(c.a), []byte(c.b), 20000, 2000)
		if exact := c.want && !c.conservative; found != nil && !exact {
			t.Errorf("table: %q and %q both match %q in Redis; the case says none does", c.a, c.b, found)
		} else if found == nil && exact {
			t.Errorf("table: no short key matches both %q and %q in Redis; the case says one does", c.a, c.b)
		}
	}
	// Past maxGlobProduct the answer is "they may".
	long := strings.Repeat("a", 1100)
	if !globsIntersect(globPositions([]byte(long)), globPositions([]byte(long[:1000]+"b"))) {
		t.Errorf("globsIntersect of two 1,000-byte globs = false; want true (bounded work, conservative)")
	}
}

// tgAlphabet is the bytes of a and b plus one byte in neither, which
// stands for every other byte.
func tgAlphabet(a, b []byte) []byte {
	var seen [256]bool
	var out []byte
	for _, c := range append(append([]byte{}, a...), b...) {
		if !seen[c] {
			seen[c] = true
			out = append(out, c)
		}
	}
	for _, c := range []byte("xyz\x00\xff") {
		if !seen[c] {
			return append(out, c)
		}
	}
	return out
}

// tgCommonKey returns a key of at most maxLen bytes over tgAlphabet(a, b)
// that both globs match under stringmatchlen, or nil; it tries at most
// about budget keys (shorter first), shortening maxLen to fit.
func tgCommonKey(a, b []byte, maxLen, budget int) []byte {
	alpha := tgAlphabet(a, b)
	for total, n, l := 1, 1, 0; l < maxLen; l++ {
		n *= len(alpha)
		if total+n > budget {
			maxLen = l
			break
		}
		total += n
	}
	buf := make([]byte, 0, maxLen)
	var found []byte
	var walk func() bool
	walk = func() bool {
		if tgRedisMatch(a, buf) && tgRedisMatch(b, buf) {
			found = append([]byte{}, buf...)
			return true
		}
		if len(buf) == maxLen {
			return false
		}
		for _, c := range alpha {
			buf = append(buf, c)
			if walk() {
				return true
			}
			buf = buf[:len(buf)-1]
		}
		return false
	}
	walk()
	return found
}

// tgFindCommon returns a key both globs match under stringmatchlen, or
// nil when none was found among the short keys over their bytes (budget
// of them) and samples keys built from the globs (tgInstance).
func tgFindCommon(a, b []byte, budget, samples int) []byte {
	if k := tgCommonKey(a, b, 64, budget); k != nil {
		return k
	}
	h := uint64(14695981039346656037)
	for _, c := range append(append(append([]byte{}, a...), 0), b...) {
		h = (h ^ uint64(c)) * 1099511628211
	}
	r := rand.New(rand.NewPCG(h, uint64(len(a))<<32|uint64(len(b))))
	alpha := tgAlphabet(a, b)
	for i := 0; i < samples; i++ {
		base, other := a, b
		if i%2 == 1 {
			base, other = b, a
		}
		k := tgInstance(r, base, other, alpha, 1)
		if tgRedisMatch(a, k) && tgRedisMatch(b, k) {
			return k
		}
	}
	return nil
}

// tgInstance builds a key glob g may match, at random: a candidate only,
// checked with tgRedisMatch, so it need not follow Redis's reading
// exactly. A '*' takes nothing, a byte or two, or (depth permitting) a
// key built from other, so that "lock:*" and "*:read:*" meet.
func tgInstance(r *rand.Rand, g, other, alpha []byte, depth int) []byte {
	var out []byte
	for i := 0; i < len(g); i++ {
		switch c := g[i]; c {
		case '*':
			switch n := r.IntN(10); {
			case n < 4:
			case n < 7 || depth == 0:
				for k := 1 + r.IntN(2); k > 0; k-- {
					out = append(out, alpha[r.IntN(len(alpha))])
				}
			default:
				out = append(out, tgInstance(r, other, g, alpha, depth-1)...)
			}
		case '?':
			out = append(out, alpha[r.IntN(len(alpha))])
		case '\\':
			if i+1 < len(g) {
				i++
			}
			out = append(out, g[i])
		case '[':
			var members []byte
			j := i + 1
			for ; j < len(g) && (g[j] != ']' || j == i+1); j++ {
				members = append(members, g[j])
			}
			if r.IntN(3) == 0 || len(members) == 0 {
				out = append(out, alpha[r.IntN(len(alpha))])
			} else {
				out = append(out, members[r.IntN(len(members))])
			}
			if r.IntN(4) > 0 {
				i = j // else read on from inside the class
			}
		default:
			out = append(out, c)
		}
	}
	return out
}

// tgKeys enumerates every key over alpha of at most maxLen bytes.
func tgKeys(alpha string, maxLen int) [][]byte {
	out := [][]byte{{}}
	prev := [][]byte{{}}
	for l := 1; l <= maxLen; l++ {
		var next [][]byte
		for _, p := range prev {
			for i := 0; i < len(alpha); i++ {
				next = append(next, append(append(make([]byte, 0, l), p...), alpha[i]))
			}
		}
		out = append(out, next...)
		prev = next
	}
	return out
}

// tgMatchSet is the set (bit i: keys[i]) of keys pattern matches in Redis.
func tgMatchSet(pattern string, keys [][]byte) []uint64 {
	set := make([]uint64, (len(keys)+63)/64)
	for i, k := range keys {
		if tgRedisMatch([]byte(pattern), k) {
			set[i/64] |= 1 << (i % 64)
		}
	}
	return set
}

func tgFirstCommon(x, y []uint64) int {
	for w := range x {
		if m := x[w] & y[w]; m != 0 {
			for b := 0; b < 64; b++ {
				if m&(1<<b) != 0 {
					return w*64 + b
				}
			}
		}
	}
	return -1
}

func tgRandomGlobs(r *rand.Rand, tokens []string, n, maxTokens int) []string {
	seen := map[string]bool{}
	var out []string
	for tries := 0; len(out) < n && tries < 100*n; tries++ {
		var sb strings.Builder
		for k := 1 + r.IntN(maxTokens); k > 0; k-- {
			sb.WriteString(tokens[r.IntN(len(tokens))])
		}
		if g := sb.String(); !seen[g] {
			seen[g] = true
			out = append(out, g)
		}
	}
	return out
}

// TestGlobsIntersectAgainstBruteForce compares globsIntersect with the
// keys stringmatchlen finds in both globs.
//
// Well-formed globs of at most 3 positions over 'a', 'b', ':' (literals,
// escapes, '?', '*', classes): a shortest common key takes at most one
// byte per non-'*' position of the two globs (a step where both are at a
// '*' can be left out), so at most 6 bytes, and 'x' stands for every byte
// no class or literal names: the brute force over {a,b,:,x}^≤6 is exact,
// and globsIntersect must agree both ways.
//
// Globs with the classes globPositions reads as '*' from there on (open
// classes, '[]…', '[^]…', ranges ending in ']' or '\', an escaped byte
// before '-', a trailing '\'): globsIntersect must never say false when a
// common key exists; saying true when none was found is counted.
func TestGlobsIntersectAgainstBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(705, 0xbc13))
	wellFormed := []string{"a", "b", ":", "a", "b", ":", "*", "?", "[ab]", "[^a]", "[a-b]", "[^ab]", "[:b]", "[b-a]", `\a`, `\:`, `[\a]`}

	keys := tgKeys("ab:x", 6)
	globs := tgRandomGlobs(r, wellFormed, 300, 3)
	sets := make([][]uint64, len(globs))
	for i, g := range globs {
		sets[i] = tgMatchSet(g, keys)
	}
	var pairs, common, over, under int
	for i := range globs {
		gi := globPositions([]byte(globs[i]))
		for j := i; j < len(globs); j++ {
			pairs++
			got := globsIntersect(gi, globPositions([]byte(globs[j])))
			k := tgFirstCommon(sets[i], sets[j])
			if k >= 0 {
				common++
			}
			switch {
			case k >= 0 && !got:
				under++
				if under <= 10 {
					t.Errorf("globsIntersect(%q, %q) = false; both match %q in Redis (a KEYS or SCAN pattern that misses held locks)", globs[i], globs[j], keys[k])
				}
			case k < 0 && got:
				over++
				if over <= 10 {
					t.Errorf("globsIntersect(%q, %q) = true; no key matches both in Redis (well-formed globs: the intersection should be exact)", globs[i], globs[j])
				}
			}
		}
	}
	t.Logf("well-formed: %d globs, %d pairs, %d with a common key; %d false negatives, %d over-approximations", len(globs), pairs, common, under, over)

	// With the classes read conservatively. Brute force over a wider
	// alphabet (the bytes those classes name) and up to 5 bytes: not
	// exact, so an over-approximation here is counted, not an error.
	malformed := []string{"[]a]", "[a-]", `[\a-b]`, "[ab", `\`, "[^]", "[]", `[b-\]`, `[\]]`, `[a\]`, "[^]a]", "[-a]", "[a-b-]"}
	tokens := append(append([]string{}, wellFormed...), malformed...)
	keys = tgKeys(`ab:[]\-^x`, 5)
	globs = tgRandomGlobs(r, tokens, 200, 3)
	sets = make([][]uint64, len(globs))
	for i, g := range globs {
		sets[i] = tgMatchSet(g, keys)
	}
	// A glob globPositions read as '*' from some class on ignores what
	// follows it; so does one ending in a lone '\' (the '\' escapes what
	// follows).
	isMalformed := func(g string) bool {
		return len(globPositions([]byte(g+"a"))) == len(globPositions([]byte(g)))
	}
	pairs, common, over, under = 0, 0, 0, 0
	var overMal, pairsMal, overWF int
	for i := range globs {
		gi := globPositions([]byte(globs[i]))
		for j := i; j < len(globs); j++ {
			pairs++
			got := globsIntersect(gi, globPositions([]byte(globs[j])))
			mal := isMalformed(globs[i]) || isMalformed(globs[j])
			if mal {
				pairsMal++
			}
			k := tgFirstCommon(sets[i], sets[j])
			if k >= 0 {
				common++
			}
			switch {
			case k >= 0 && !got:
				under++
				if under <= 10 {
					t.Errorf("globsIntersect(%q, %q) = false; both match %q in Redis", globs[i], globs[j], keys[k])
				}
			case k < 0 && got:
				over++
				if mal {
					overMal++
				} else {
					overWF++
					if overWF <= 5 {
						t.Logf("e.g. globsIntersect(%q, %q) = true; no key of ≤5 bytes over %q matches both", globs[i], globs[j], `ab:[]\-^x`)
					}
				}
			}
		}
	}
	t.Logf("with malformed classes: %d globs, %d pairs (%d with a conservatively read class), %d with a common key of ≤5 bytes; %d false negatives; true without a common key found: %d (%d of them with a conservatively read class, %.1f%% of such pairs)",
		len(globs), pairs, pairsMal, common, under, over, overMal, 100*float64(overMal)/float64(max(pairsMal, 1)))
	if overWF > 0 {
		t.Logf("%d over-approximations between globs read without a conservative class (over the ≤5-byte keys searched)", overWF)
	}
}

// tgLiteralPositions is key s as glob positions, each byte read as itself
// (as namesLockKey builds them).
func tgLiteralPositions(s []byte) []globPos {
	var out []globPos
	for _, c := range s {
		var p globPos
		p.add(c, c)
		out = append(out, p)
	}
	return out
}

// FuzzGlobsIntersect: never a panic, symmetric, and never false when a
// key matches both in Redis: b itself taken as a key, and every short key
// over the bytes of both when they are short.
func FuzzGlobsIntersect(f *testing.F) {
	for _, c := range tgGlobCases {
		f.Add(c.a, c.b)
	}
	f.Add(`\`, `\\`)
	f.Add(`[\`, `[`)
	f.Add(`[^`, `[a-`)
	f.Add("[a-\\", "*")
	f.Fuzz(func(t *testing.T, a, b string) {
		ga, gb := globPositions([]byte(a)), globPositions([]byte(b))
		got := globsIntersect(ga, gb)
		if rev := globsIntersect(gb, ga); rev != got {
			t.Fatalf("globsIntersect(%q, %q) = %v, but %v the other way", a, b, got, rev)
		}
		if tgRedisMatch([]byte(a), []byte(b)) && !globsIntersect(ga, tgLiteralPositions([]byte(b))) {
			t.Fatalf("glob %q matches key %q in Redis, but globsIntersect with the key's bytes = false", a, b)
		}
		if len(a) > 16 || len(b) > 16 || got {
			return
		}
		if k := tgFindCommon([]byte(a), []byte(b), 3000, 400); k != nil {
			t.Fatalf("globsIntersect(%q, %q) = false; both match %q in Redis", a, b, k)
		}
	})
}

func TestLuaStrings(t *testing.T) {
	for _, c := range []struct {
		name, src string
		want      []string
	}{
		{"single quotes", `return 'a'`, []string{"a"}},
		{"double quotes", `return "b"`, []string{"b"}},
		{"long string", `x = [[c]]`, []string{"c"}},
		{"long string, level 2", `x = [==[d]]e]=]f]==]`, []string{"d]]e]=]f"}},
		{"long string, level 1", `x = [=[ ]] ]==] ]=] y = 'z'`, []string{" ]] ]==] ", "z"}},
		{"all forms", `'a' "b" [[c]] [=[d]=]`, []string{"a", "b", "c", "d"}},
		{"escaped quote", `'it\'s' 'x'`, []string{`it's`, "x"}},
		{"escaped double quote", `"say \"hi\"" "x"`, []string{`say "hi"`, "x"}},
		{"escaped backslash", `'back\\' 'next'`, []string{`back\`, "next"}},
		// Lua 5.1 has no \z, \x or \u{}: the letter stands for itself.
		{"\\z, \\x, \\u{}, decimal", `'\z  x\x41\u{48}\65\0'`, []string{"z  xx41u{48}A\x00"}},
		{"one-letter escapes", `'\a\b\f\n\r\t\v'`, []string{"\a\b\f\n\r\t\v"}},
		{"decimal escapes name a lock key", `'lock\58k1' '\108ock:k2' 'lock\:k3'`, []string{"lock:k1", "lock:k2", "lock:k3"}},
		{"escaped newline", "'a\\\nb' 'c'", []string{"a\nb", "c"}},
		{"escaped \\r\\n is one line break", "'a\\\r\nb' 'c'", []string{"a\nb", "c"}},
		{"line comment ended by \\r", "-- x\r'y'", []string{"y"}},
		{"long string drops its first line break", "[[\nk]] [==[\r\nl]==]", []string{"k", "l"}},
		{"long string reads \\r\\n as \\n", "[[a\r\nb\rc]]", []string{"a\nb\nc"}},
		{"other quote inside", `"it's" 'say "x"'`, []string{"it's", `say "x"`}},
		{"-- inside a string", `'a--b' "c -- d" [[e--f]]`, []string{"a--b", "c -- d", "e--f"}},
		{"--[[ inside a string", `"--[[" .. 'x' .. "]]"`, []string{"--[[", "x", "]]"}},
		{"line comment", "-- 'not a string'\nreturn 'yes'", []string{"yes"}},
		{"line comment at the end", "return 'yes' -- 'no'", []string{"yes"}},
		{"long comment", "--[[ 'no' \n 'no' ]] return 'yes'", []string{"yes"}},
		{"long comment, level 2", "--[==[ 'no' ]] ]=] ]==] return 'yes'", []string{"yes"}},
		{"--[ is a line comment", "--[ 'no'\nreturn 'yes'", []string{"yes"}},
		{"--[= is a line comment", "--[= 'no' [[\nreturn 'yes'", []string{"yes"}},
		{"not a long bracket", `t[1] = t[ [[k]] ] .. t[=1]`, []string{"k"}},
		{"long string inside brackets", `t[[[x]]]`, []string{"[x"}},
		{"empty strings", `'' "" [[]]`, []string{"", "", ""}},
		{"open quote runs to the end of its line", "x = 'open\nreturn 'b'", []string{"open", "b"}},
		{"open quote at the end", `return 'open`, []string{"open"}},
		{"open quote after a backslash", `return 'a\`, []string{`a`}},
		{"open long string", `return [==[open ]] ]=]`, []string{"open ]] ]=]"}},
		{"open long comment", "--[[ open 'no'\n'no'", nil},
		{"no strings", "return redis.call(KEYS[1])", nil},
		{"empty", "", nil},
	} {
		var got []string
		stopped := luaStrings([]byte(c.src), func(lit []byte) bool {
			got = append(got, string(lit))
			return false
		})
		if stopped {
			t.Errorf("%s: luaStrings(%q) = true with f always false", c.name, c.src)
		}
		if strings.Join(got, "\x00|") != strings.Join(c.want, "\x00|") || len(got) != len(c.want) {
			t.Errorf("%s: luaStrings(%q) gave %q; want %q", c.name, c.src, got, c.want)
		}
	}
	// f returning true stops the walk.
	var seen []string
	if !luaStrings([]byte(`'a' 'b' 'c'`), func(lit []byte) bool {
		seen = append(seen, string(lit))
		return string(lit) == "b"
	}) || len(seen) != 2 {
		t.Errorf("luaStrings stopping at 'b' = saw %q; want [a b] and true", seen)
	}
}

// FuzzLuaStrings: never a panic; every literal is a slice of the input
// (the same memory), after an opening quote or long bracket, in order and
// without overlap; f returning true stops the walk; lockKeyOutsideKeys
// runs on anything.
func FuzzLuaStrings(f *testing.F) {
	for _, s := range []string{
		`return 'a'`, `"b"`, `[[c]]`, `[==[d]]e]==]`, `'it\'s'`, `'\z \x41\u{48}\65'`,
		"-- 'x'\n'y'", "--[[ 'x' ]] 'y'", "--[==[ x ]==]", `'a--b'`, "'open\n'b'", `'a\`, `[=[`, `--[`, `[`, `'`, `"\"`,
		"return redis.call('set', \"lock:\" .. ARGV[1], 'v')", "[[\nlock:k1]]", "-- x\rreturn 'lock:k1'",
	} {
		f.Add([]byte(s))
	}
	h := &Handler{patterns: []string{"lock:*", "*:lock:*"}}
	f.Fuzz(func(t *testing.T, src []byte) {
		// A literal's value is decoded (escapes, line breaks), so it is
		// no slice of the input; it is never longer than the input, and
		// one without a backslash or line break in the input is its text.
		var lits [][]byte
		luaStrings(src, func(l []byte) bool {
			if len(l) > len(src) {
				t.Fatalf("luaStrings(%q): literal %q longer than the input", src, l)
			}
			lits = append(lits, bytes.Clone(l))
			return false
		})
		if !bytes.ContainsAny(src, "\\\r\n") {
			for _, l := range lits {
				if !bytes.Contains(src, l) {
					t.Fatalf("luaStrings(%q): literal %q is not in the input, which has no escape or line break", src, l)
				}
			}
		}
		if len(lits) > 0 {
			stopAt := len(src) % len(lits)
			calls := 0
			if !luaStrings(src, func([]byte) bool { calls++; return calls == stopAt+1 }) || calls != stopAt+1 {
				t.Fatalf("luaStrings(%q) stopping at literal %d: %d calls", src, stopAt+1, calls)
			}
		}
		_ = h.lockKeyOutsideKeys([][]byte{src}, src)
	})
}

const tgArgvSet = "return redis.call('set', ARGV[1], ARGV[2], 'NX', 'PX', ARGV[3])"
const tgCAD = `if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end`

func TestLockKeyOutsideKeys(t *testing.T) {
	argv := func(a ...string) [][]byte {
		var out [][]byte
		for _, s := range a {
			out = append(out, []byte(s))
		}
		return out
	}
	for _, c := range []struct {
		name     string
		patterns []string
		argv     [][]byte
		body     string
		refused  string // what the refusal names ("" allowed)
	}{
		// From test/transparent/keyless_paths_test.go.
		{"lock key in ARGV", []string{"lock:*"}, argv("lock:k1", "B", "10000"), tgArgvSet, "argument 'lock:k1'"},
		{"literal in the body", []string{"lock:*"}, argv("B", "10000"), "return redis.call('set', 'lock:k2', ARGV[1], 'NX', 'PX', ARGV[2])", "string 'lock:k2'"},
		{"literal in the body, KEYS a lock key", []string{"lock:*"}, nil, "redis.call('pexpire', KEYS[1], 1000) return redis.call('set', 'lock:k5', 'B', 'NX', 'PX', 10000)", "string 'lock:k5'"},
		{"SCRIPT LOAD, double quotes", []string{"lock:*"}, nil, `return redis.call('set', "lock:k9", 'B', 'NX', 'PX', 10000)`, "string 'lock:k9'"},
		{"compare-and-delete through KEYS", []string{"lock:*"}, argv("A"), tgCAD, ""},
		{"a comment naming a lock key", []string{"lock:*"}, nil, "-- counts uses of lock:k1\nreturn redis.call('incr', KEYS[1])", ""},
		{"keyless script on a plain key", []string{"lock:*"}, argv("plain:k", "B", "10000"), tgArgvSet, ""},
		// More.
		{"'lock:' .. ARGV[1]", []string{"lock:*"}, argv("k"), `return redis.call('set', "lock:" .. ARGV[1], 'v', 'NX', 'PX', 1000)`, `string 'lock:'`},
		{"string.format", []string{"lock:*"}, nil, `return redis.call('set', string.format('lock:%s', ARGV[1]), 'v')`, "string 'lock:%s'"},
		{"long-bracket literal", []string{"lock:*"}, nil, `return redis.call('set', [[lock:x]], 'v')`, "string 'lock:x'"},
		{"level-2 long-bracket literal", []string{"lock:*"}, nil, `return redis.call('set', [==[lock:x]==], 'v')`, "string 'lock:x'"},
		{"after a long comment", []string{"lock:*"}, nil, "--[[ 'x' ]] return redis.call('set', 'lock:y', 'v')", "string 'lock:y'"},
		{"after a line comment", []string{"lock:*"}, nil, "-- 'x'\nreturn redis.call('set', 'lock:y', 'v')", "string 'lock:y'"},
		{"after an escaped quote", []string{"lock:*"}, nil, `local s = 'it\'s' return redis.call('set', 'lock:y', 'v')`, "string 'lock:y'"},
		{"a long comment naming a lock key", []string{"lock:*"}, nil, "--[[ uses lock:k1 ]] return 1", ""},
		{"a level-1 long comment naming a lock key", []string{"lock:*"}, nil, "--[=[ 'lock:k1' ]] ]=] return 1", ""},
		{"lock key text outside strings", []string{"lock:*"}, nil, "local lock = 1 local t = {lock=2} return lock", ""},
		{"a literal that only contains lock:", []string{"lock:*"}, nil, "return 'unlock:x'", ""},
		{"'lock' without the colon", []string{"lock:*"}, nil, "return redis.call('get', 'lock' .. ':' .. ARGV[1])", ""}, // built at run time: documented as not caught
		{"class pattern, outside the class", []string{"lock:[ab]*"}, nil, "return 'lock:c1'", ""},
		{"class pattern, inside the class", []string{"lock:[ab]*"}, nil, "return 'lock:a1'", "string 'lock:a1'"},
		{"class pattern, prefix", []string{"lock:[ab]*"}, nil, "return 'lock:' .. ARGV[1]", "string 'lock:'"},
		{"*:lock:* literal", []string{"*:lock:*"}, nil, "return 'svc:lock:1'", "string 'svc:lock:1'"},
		{"*:lock:* no match", []string{"*:lock:*"}, nil, "return 'svc:lok:1'", ""},
		{"*:lock:* in ARGV", []string{"*:lock:*"}, argv("a:lock:b"), "return 1", "argument 'a:lock:b'"},
		{"no lock patterns", nil, argv("lock:k1"), "return 'lock:k1'", ""},
	} {
		h := &Handler{patterns: c.patterns}
		got := h.lockKeyOutsideKeys(c.argv, []byte(c.body))
		switch {
		case c.refused == "" && got != "":
			t.Errorf("%s: lockKeyOutsideKeys(%q, %q) = %q; want it allowed", c.name, c.argv, c.body, got)
		case c.refused != "" && (!strings.Contains(got, c.refused) || !strings.Contains(got, "in KEYS")):
			t.Errorf("%s: lockKeyOutsideKeys(%q, %q) = %q; want a refusal naming %s and saying lock keys go in KEYS", c.name, c.argv, c.body, got, c.refused)
		}
	}

	for _, c := range []struct {
		lp, s string
		want  bool
	}{
		{"lock:*", "lock:k1", true},
		{"lock:*", "lock:", true},
		{"lock:*", "lock", false},
		{"lock:*", "unlock:x", false},
		{"lock:*", "", false},
		{"lock:doc:*", "lock:", false}, // a prefix shorter than the pattern's literal start
		{"lock:doc:*", "lock:doc:", true},
		{"lock:doc:*", "lock:dox", false},
		{"lock:?x", "lock:a", true},
		{"lock:?x", "lock:ab", false},
		{"lock:[0-9]*", "lock:7", true},
		{"lock:[0-9]*", "lock:q", false},
		{"*:lock:*", "svc:lock:1", true},
		{"*:lock:*", ":lock:", true},
		{"*:lock:*", "svc:lock", false},
	} {
		if got := namesLockKey(c.lp, []byte(c.s)); got != c.want {
			t.Errorf("namesLockKey(%q, %q) = %v; want %v", c.lp, c.s, got, c.want)
		}
	}

	// Escapes are decoded as Lua reads them, so a literal that names a
	// lock key only once its escapes are read is caught too.
	h := &Handler{patterns: []string{"lock:*"}}
	for _, body := range []string{`return redis.call('set', 'lock\58k1', 'v')`, `return redis.call('set', '\108ock:k1', 'v')`, `return redis.call('set', 'lock\:k1', 'v')`} {
		if why := h.lockKeyOutsideKeys(nil, []byte(body)); why == "" {
			t.Errorf("lockKeyOutsideKeys(nil, %q) = \"\" (allowed); its escapes name lock:k1", body)
		}
	}
}

// TestLockKeyOutsideKeysLuaLineEnds: Redis's Lua (5.1, llex.c) ends a line
// comment at '\r' as well as '\n' (currIsNewline), reads '\' followed by
// "\r\n" inside a quoted string as one escaped line break (inclinenumber
// skips the pair), and drops a line break right after a long bracket's
// opening ("[[\nlock:k1]]" is "lock:k1"). luaStrings did none of these,
// so in each body below the string literal Lua passes to redis.call as
// the key was one luaStrings did not return (or returned with a leading
// '\n'), and the script was allowed.
func TestLockKeyOutsideKeysLuaLineEnds(t *testing.T) {
	h := &Handler{patterns: []string{"lock:*"}}
	for _, c := range []struct{ name, body string }{
		{"line comment ended by \\r", "-- take the lock\rreturn redis.call('set', 'lock:k1', 'v', 'NX', 'PX', 10000)"},
		{"escaped \\r\\n in a string", "local s = 'a\\\r\n' return redis.call('set', 'lock:k1', 'v', 'NX', 'PX', 10000)"},
		{"long string starting with a line break", "return redis.call('set', [[\nlock:k1]], 'v', 'NX', 'PX', 10000)"},
		{"long string starting with \\r\\n", "return redis.call('set', [==[\r\nlock:k1]==], 'v', 'NX', 'PX', 10000)"},
	} {
		if why := h.lockKeyOutsideKeys(nil, []byte(c.body)); why == "" {
			var lits []string
			luaStrings([]byte(c.body), func(l []byte) bool { lits = append(lits, string(l)); return false })
			t.Errorf("%s: lockKeyOutsideKeys(nil, %q) = \"\" (allowed); Lua reads the key 'lock:k1' there; luaStrings gave %q", c.name, c.body, lits)
		}
	}
}

func TestScriptCacheLRU(t *testing.T) {
	check := func(c *scriptCache) {
		t.Helper()
		if c.lru.Len() != len(c.bodies) {
			t.Fatalf("lru has %d entries, the map %d", c.lru.Len(), len(c.bodies))
		}
		size := 0
		for e := c.lru.Front(); e != nil; e = e.Next() {
			se := e.Value.(*scriptEntry)
			if c.bodies[se.sha] != e {
				t.Fatalf("map entry of %s is not its list element", se.sha)
			}
			size += len(se.body)
		}
		if size != c.size {
			t.Fatalf("size = %d; the bodies add up to %d", c.size, size)
		}
		if n := c.lru.Len(); n > maxScripts || (n > 1 && c.size > maxScriptBytes) {
			t.Fatalf("%d scripts, %d bytes; bounds %d and %d (only a lone body may exceed the bytes)", n, c.size, maxScripts, maxScriptBytes)
		}
	}
	shaOf := func(body string) string { s := sha1.Sum([]byte(body)); return hex.EncodeToString(s[:]) }
	body := func(i int) string {
		return "return " + strings.Repeat("1", i%7) + "--" + string(rune('a'+i%26)) + hex.EncodeToString([]byte{byte(i >> 8), byte(i)})
	}

	// By count.
	var c scriptCache
	for i := 0; i < maxScripts; i++ {
		if sha := c.add(body(i)); sha != shaOf(body(i)) {
			t.Fatalf("add = %s; want the SHA1 %s", sha, shaOf(body(i)))
		}
	}
	check(&c)
	if c.lru.Len() != maxScripts {
		t.Fatalf("%d scripts after %d adds; want all kept", c.lru.Len(), maxScripts)
	}
	// Use script 0 (by get, upper-case SHA) and 1 (by add again): 2 is now
	// the least recently used, then 3.
	if b, ok := c.get(strings.ToUpper(shaOf(body(0)))); !ok || b != body(0) {
		t.Fatalf("get of script 0 = %q, %v", b, ok)
	}
	c.add(body(1))
	check(&c)
	c.add("return 'new'")
	check(&c)
	if _, ok := c.get(shaOf("return 'new'")); !ok {
		t.Errorf("the body just added is not remembered")
	}
	if _, ok := c.get(shaOf(body(2))); ok {
		t.Errorf("script 2, least recently used, is still remembered after one add past %d", maxScripts)
	}
	for _, i := range []int{0, 1, 3, maxScripts - 1} {
		if _, ok := c.get(shaOf(body(i))); !ok {
			t.Errorf("script %d was forgotten; only script 2 should have been", i)
		}
	}
	// 3 was used just now, so the next two adds evict 4 and 5.
	c.add("return 'new2'")
	c.add("return 'new3'")
	check(&c)
	for i, want := range map[int]bool{3: true, 4: false, 5: false, 6: true} {
		if _, ok := c.get(shaOf(body(i))); ok != want {
			t.Errorf("script %d remembered = %v; want %v", i, ok, want)
		}
	}
	if _, ok := c.get("not-a-sha"); ok {
		t.Errorf("get of an unknown SHA = true")
	}
	// forget drops one body (an EVAL of it did not compile), and only it.
	c.forget(shaOf(body(3)))
	c.forget("not-a-sha")
	check(&c)
	for i, want := range map[int]bool{3: false, 6: true} {
		if _, ok := c.get(shaOf(body(i))); ok != want {
			t.Errorf("after forget of script 3, script %d remembered = %v; want %v", i, ok, want)
		}
	}

	// By bytes.
	c.flush()
	check(&c)
	if c.lru.Len() != 0 || c.size != 0 {
		t.Fatalf("after flush: %d scripts, %d bytes", c.lru.Len(), c.size)
	}
	const mb = 1 << 20
	big := func(i int) string { return string([]byte{byte(i)}) + strings.Repeat("x", mb-1) }
	for i := 0; i < maxScriptBytes/mb; i++ {
		c.add(big(i))
	}
	check(&c)
	if c.size != maxScriptBytes || c.lru.Len() != maxScriptBytes/mb {
		t.Fatalf("%d scripts of %d bytes; want all %d kept", c.lru.Len(), c.size, maxScriptBytes/mb)
	}
	c.get(shaOf(big(0)))
	c.add(big(maxScriptBytes / mb)) // one MiB over: the least recently used (1) goes
	check(&c)
	if _, ok := c.get(shaOf(big(1))); ok {
		t.Errorf("the least recently used MiB body is still remembered past %d bytes", maxScriptBytes)
	}
	for _, i := range []int{0, 2, maxScriptBytes / mb} {
		if _, ok := c.get(shaOf(big(i))); !ok {
			t.Errorf("MiB body %d was forgotten", i)
		}
	}
	c.add("return 1") // a small body fits after evicting one more MiB
	check(&c)

	// A body larger than the byte bound is remembered, alone.
	huge := strings.Repeat("y", maxScriptBytes+1)
	c.add(huge)
	check(&c)
	if b, ok := c.get(shaOf(huge)); !ok || len(b) != len(huge) {
		t.Fatalf("a body over %d bytes just added is not remembered", maxScriptBytes)
	}
	if c.lru.Len() != 1 {
		t.Errorf("%d scripts remembered with a body over the byte bound; want it alone", c.lru.Len())
	}
	// The next body pushes it out, and is remembered.
	c.add("return 2")
	check(&c)
	if _, ok := c.get(shaOf("return 2")); !ok {
		t.Errorf("the body added after the huge one is not remembered")
	}
	if _, ok := c.get(shaOf(huge)); ok {
		t.Errorf("the huge body is still remembered next to another")
	}
	// Re-adding a remembered body does not count it twice.
	before := c.size
	c.add("return 2")
	check(&c)
	if c.size != before || c.lru.Len() != 1 {
		t.Errorf("re-adding a body: %d scripts, %d bytes; want 1, %d", c.lru.Len(), c.size, before)
	}
}

// TestScriptArgsOnNodesByPatternsWithText: on the lock nodes (onNodes) a
// script's argument is a lock key only by a pattern with a literal byte;
// relayed, by any pattern.
func TestScriptArgsOnNodesByPatternsWithText(t *testing.T) {
	for _, c := range []struct {
		name     string
		patterns []string
		arg      string
		onNodes  bool
		refused  bool
	}{
		{"catch-all, token, on the nodes", []string{"*"}, "tok-1", true, false},
		{"catch-all, token, relayed", []string{"*"}, "tok-1", false, true},
		{"wildcards and classes only", []string{"?[a-z]*"}, "tok-1", true, false},
		{"catch-all and lock:*, lock key", []string{"*", "lock:*"}, "lock:k", true, true},
		{"catch-all and lock:*, token", []string{"*", "lock:*"}, "tok-1", true, false},
		{"lock:*, lock key", []string{"lock:*"}, "lock:k", true, true},
		{"*:lock:*, lock key", []string{"*:lock:*"}, "a:lock:b", true, true},
		{"escaped star is text", []string{`\*`}, "*", true, true},
	} {
		h := &Handler{patterns: c.patterns}
		got := h.lockKeyOutside([][]byte{[]byte(c.arg)}, []byte(tgCAD), c.onNodes)
		if (got != "") != c.refused {
			t.Errorf("%s: lockKeyOutside(%q, onNodes %v) = %q; want refused %v", c.name, c.arg, c.onNodes, got, c.refused)
		}
	}
}
