package resp_test

import (
	"bytes"
	"math"
	"strconv"
	"testing"

	"github.com/lockproxy/lockproxy/resp"
)

func TestEqualFold(t *testing.T) {
	for _, tc := range []struct {
		arg  string
		w    string
		want bool
	}{
		{"LOCK", "LOCK", true},
		{"lock", "LOCK", true},
		{"LoCk", "LOCK", true},
		{"px", "PX", true},
		{"KeepAlive", "KEEPALIVE", true},
		{"LIB-NAME", "LIB-NAME", true},
		{"lib-name", "LIB-NAME", true},
		{"", "", true},
		{"", "PX", false},
		{"P", "PX", false},
		{"PXX", "PX", false},
		{"EX", "PX", false},
		{"p\x00", "PX", false},
		{"px ", "PX", false},
		{" px", "PX", false},
		// Only ASCII letters fold: '@' and '`' are 0x20 apart like 'A' and
		// 'a' but are not letters; neither are Latin-1 é and É.
		{"`", "@", false},
		{"{", "[", false},
		{"\xe9", "\xc9", false},
		// w must be upper case; a lower-case w never matches a letter.
		{"px", "px", false},
	} {
		if got := resp.EqualFold([]byte(tc.arg), tc.w); got != tc.want {
			t.Errorf("EqualFold(%q, %q) = %v; want %v", tc.arg, tc.w, got, tc.want)
		}
	}
}

// TestEqualFoldEveryByte compares EqualFold with ASCII upper-casing for
// every pair of single bytes where w is a valid (upper-case) word.
func TestEqualFoldEveryByte(t *testing.T) {
	upper := func(c byte) byte {
		if 'a' <= c && c <= 'z' {
			return c - 'a' + 'A'
		}
		return c
	}
	for a := 0; a < 256; a++ {
		for w := 0; w < 256; w++ {
			if 'a' <= w && w <= 'z' {
				continue
			}
			want := upper(byte(a)) == byte(w)
			if got := resp.EqualFold([]byte{byte(a)}, string([]byte{byte(w)})); got != want {
				t.Errorf("EqualFold(%q, %q) = %v; want %v", byte(a), byte(w), got, want)
			}
		}
	}
}

func TestParseInt(t *testing.T) {
	for _, tc := range []struct {
		in     string
		want   int64
		wantOK bool
	}{
		{"0", 0, true},
		{"1", 1, true},
		{"-1", -1, true},
		{"5000", 5000, true},
		{"-5000", -5000, true},
		{"1234567890", 1234567890, true},
		{"9223372036854775807", math.MaxInt64, true},
		{"-9223372036854775808", math.MinInt64, true},
		{"9223372036854775806", math.MaxInt64 - 1, true},
		{"-9223372036854775807", math.MinInt64 + 1, true},

		// Overflow at ±2^63.
		{"9223372036854775808", 0, false},
		{"-9223372036854775809", 0, false},
		{"18446744073709551615", 0, false},
		{"18446744073709551616", 0, false},
		{"99999999999999999999", 0, false},
		{"-99999999999999999999", 0, false},
		{"100000000000000000000", 0, false},
		{"123456789012345678901", 0, false},

		// Redis's string2ll rules.
		{"", 0, false},
		{"-", 0, false},
		{"+", 0, false},
		{"+1", 0, false},
		{"+0", 0, false},
		{"01", 0, false},
		{"00", 0, false},
		{"-01", 0, false},
		{"-00", 0, false},
		{"007", 0, false},
		// string2ll takes "0" only as the whole string: after a minus sign
		// the first digit must be 1-9, so Redis answers "-0" with "ERR value
		// is not an integer or out of range" (util.c, string2ll).
		{"-0", 0, false},
		{"--1", 0, false},
		{"-+1", 0, false},
		{"1-", 0, false},
		{" 1", 0, false},
		{"1 ", 0, false},
		{"1\r\n", 0, false},
		{"1\x00", 0, false},
		{"1a", 0, false},
		{"a1", 0, false},
		{"0x10", 0, false},
		{"1e3", 0, false},
		{"1.0", 0, false},
		{"1_000", 0, false},
		{"١", 0, false}, // Arabic-Indic digit one
		{"１", 0, false}, // full-width digit one
	} {
		t.Run(strconv.Quote(tc.in), func(t *testing.T) {
			got, ok := resp.ParseInt([]byte(tc.in))
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("ParseInt(%q) = %d, %v; want %d, %v", tc.in, got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

// TestParseIntRoundTrip: every int64 in canonical form parses back.
func TestParseIntRoundTrip(t *testing.T) {
	vals := []int64{0, 1, -1, 9, 10, -10, 99, 100, math.MaxInt32, math.MinInt32, math.MaxInt64, math.MinInt64}
	for p := int64(1); p > 0 && p <= math.MaxInt64/10; p *= 10 {
		vals = append(vals, p, p-1, p+1, -p, -(p - 1), -(p + 1), p*10-1)
	}
	for _, v := range vals {
		s := strconv.FormatInt(v, 10)
		if got, ok := resp.ParseInt([]byte(s)); !ok || got != v {
			t.Errorf("ParseInt(%q) = %d, %v; want %d, true", s, got, ok, v)
		}
	}
}

func TestArgHelpersDoNotAllocate(t *testing.T) {
	arg := []byte("KeepAlive")
	num := []byte("-9223372036854775808")
	name := []byte("CLIENT")
	var buf [32]byte
	allocs := testing.AllocsPerRun(100, func() {
		_ = resp.EqualFold(arg, "KEEPALIVE")
		_, _ = resp.ParseInt(num)
		_ = resp.Lower(buf[:], name)
	})
	if allocs != 0 {
		t.Errorf("EqualFold, ParseInt and Lower allocate %v times per run; want 0", allocs)
	}
}

func TestLower(t *testing.T) {
	for _, tc := range []struct {
		name   string
		bufLen int
		in     string
		want   string
	}{
		{"upper", 32, "LOCK", "lock"},
		{"mixed", 32, "Client", "client"},
		{"already lower", 32, "ping", "ping"},
		{"empty", 32, "", ""},
		{"punctuation and digits", 32, "CLIENT|SETNAME-2", "client|setname-2"},
		{"non-ASCII kept", 32, "\xc9X\xe9", "\xc9x\xe9"},
		{"exactly fits", 4, "LOCK", "lock"},
		// Longer than the buffer: returned as is, so it misses the table.
		{"too long", 4, "UNLOCK", "UNLOCK"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := []byte(tc.in)
			orig := bytes.Clone(in)
			buf := make([]byte, tc.bufLen)
			got := resp.Lower(buf, in)
			if string(got) != tc.want {
				t.Errorf("Lower(buf[%d], %q) = %q; want %q", tc.bufLen, tc.in, got, tc.want)
			}
			if !bytes.Equal(in, orig) {
				t.Errorf("Lower changed its input to %q", in)
			}
		})
	}
}

// FuzzParseInt compares ParseInt with strconv.ParseInt: ParseInt accepts
// exactly the canonical decimal forms of int64 values (what
// strconv.FormatInt writes: no plus sign, no leading zeros, no "-0"),
// with the same value.
func FuzzParseInt(f *testing.F) {
	for _, s := range []string{
		"0", "1", "-1", "5000", "30000", "100", "600000", "-0", "01", "+1", "-", "",
		"9223372036854775807", "9223372036854775808",
		"-9223372036854775808", "-9223372036854775809",
		"18446744073709551616", "99999999999999999999", " 1", "1e3",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := resp.ParseInt([]byte(s))
		want, err := strconv.ParseInt(s, 10, 64)
		canonical := err == nil && strconv.FormatInt(want, 10) == s
		if ok != canonical {
			if s == "-0" {
				// Known: ParseInt accepts "-0" (TestParseInt/"-0" fails
				// until it is fixed); keep the fuzzer looking for others.
				return
			}
			t.Fatalf("ParseInt(%q) = %d, %v; strconv.ParseInt = %d, %v (canonical %v)", s, got, ok, want, err, canonical)
		}
		if ok && got != want {
			t.Fatalf("ParseInt(%q) = %d; strconv.ParseInt = %d", s, got, want)
		}
		if !ok && got != 0 {
			t.Fatalf("ParseInt(%q) = %d, false; want 0 on failure", s, got)
		}
	})
}
