package resp

import (
	"bytes"
	"io"
	"slices"
	"testing"
)

// inlineCases are inline commands and how redis-server splits them
// (sdssplitargs). Every expectation without a note was checked against
// redis-server 7.0.15 with the same bytes (MONITOR shows the arguments).
// A quote inside a word opens a quoted part of that word; a closing quote
// must be followed by a blank or the end of the line; outside quotes a
// word ends at a space, tab or carriage return, while \v and \f are
// skipped between words but are part of a word.
var inlineCases = []struct {
	name    string
	in      string
	want    [][]string
	wantErr string
}{
	{"double quotes inside a word", "SET k a\"b c\"\r\n", [][]string{{"SET", "k", "ab c"}}, ""},
	{"single quotes inside a word", "ECHO a'b c'\r\n", [][]string{{"ECHO", "ab c"}}, ""},
	{"escape inside a quoted part of a word", "RPUSH l a\"b\\x41\"\r\n", [][]string{{"RPUSH", "l", "abA"}}, ""},
	{"empty quoted part of a word", "RPUSH l a\"\" b\r\n", [][]string{{"RPUSH", "l", "a", "b"}}, ""},
	{"lone quote inside a word", "ECHO foo\"bar\r\n", nil, "Protocol error: unbalanced quotes in request"},
	{"JSON typed inline", "ECHO {\"json\":1}\r\n", nil, "Protocol error: unbalanced quotes in request"},
	{"text after a closing quote", "RPUSH l \"a\"b\r\n", nil, "Protocol error: unbalanced quotes in request"},
	{"text after a quoted part of a word", "RPUSH l a\"b\"c\r\n", nil, "Protocol error: unbalanced quotes in request"},
	{"quote after a closing quote", "RPUSH l a'b'\"c d\"\r\n", nil, "Protocol error: unbalanced quotes in request"},
	{"empty quotes then text", "RPUSH l a\"\"b\r\n", nil, "Protocol error: unbalanced quotes in request"},
	{"carriage return separates", "RPUSH l a\rb\r\n", [][]string{{"RPUSH", "l", "a", "b"}}, ""},
	{"carriage return ends a quoted part", "RPUSH l a\"b c\"\r\r\n", [][]string{{"RPUSH", "l", "ab c"}}, ""},
	{"carriage return inside quotes", "RPUSH l \"a\r\"\r\n", [][]string{{"RPUSH", "l", "a\r"}}, ""},
	{"vertical tab inside a word", "RPUSH l a\vb\r\n", [][]string{{"RPUSH", "l", "a\vb"}}, ""},
	{"form feed inside a word", "RPUSH l a\fb\r\n", [][]string{{"RPUSH", "l", "a\fb"}}, ""},
	{"vertical tab and form feed skipped between words", "RPUSH l \va \fb\r\n", [][]string{{"RPUSH", "l", "a", "b"}}, ""},
	{"tab after a closing quote", "RPUSH l \"a\"\tb\r\n", [][]string{{"RPUSH", "l", "a", "b"}}, ""},
	{"vertical tab after a closing quote", "RPUSH l \"a\"\vb\r\n", [][]string{{"RPUSH", "l", "a", "b"}}, ""},
	{"form feed after a closing single quote", "RPUSH l 'a'\fb\r\n", [][]string{{"RPUSH", "l", "a", "b"}}, ""},
	{"blanks around", "  RPUSH\tl\t a \r\n", [][]string{{"RPUSH", "l", "a"}}, ""},
	{"empty quoted arguments", "RPUSH l \"\" ''\r\n", [][]string{{"RPUSH", "l", "", ""}}, ""},
	{"escaped single quote, bad hex escape", "RPUSH l 'it\\'s' \"\\x41\\x4g\"\r\n", [][]string{{"RPUSH", "l", "it's", "Ax4g"}}, ""},
	{"escaped double quote", "RPUSH l \"a\\\"b\"\r\n", [][]string{{"RPUSH", "l", "a\"b"}}, ""},
	{"no escapes in single quotes", "RPUSH l 'a\\nb'\r\n", [][]string{{"RPUSH", "l", "a\\nb"}}, ""},
	{"C escapes in double quotes", "RPUSH l \"a\\qb\\n\\r\\t\\b\\a\"\r\n", [][]string{{"RPUSH", "l", "aqb\n\r\t\b\a"}}, ""},
	{"short hex escape", "RPUSH l \"\\x4\"\r\n", [][]string{{"RPUSH", "l", "x4"}}, ""},
	{"hex escape without digits", "RPUSH l \"x\\x\"\r\n", [][]string{{"RPUSH", "l", "xx"}}, ""},
	{"backslash at the end of the line", "RPUSH l \"a\\\r\n", nil, "Protocol error: unbalanced quotes in request"},
	{"backslash before a closing single quote", "RPUSH l 'a\\'\r\n", nil, "Protocol error: unbalanced quotes in request"},
	{"two backslashes before a closing single quote", "RPUSH l 'a\\\\'\r\n", nil, "Protocol error: unbalanced quotes in request"},
	// redis-server looks for the end of an inline line with strchr, so
	// it never runs a line with a NUL in it (it fails the connection once
	// 64 KB have come); sdssplitargs would run the part before the NUL, a
	// different command. lockproxy refuses the line at once.
	{"NUL in a word", "RPUSH l a\x00b c\r\nPING\r\n", nil, "Protocol error: NUL byte in inline request"},
	{"NUL inside quotes", "RPUSH l \"a\x00b\"\r\n", nil, "Protocol error: NUL byte in inline request"},
}

// TestInlineSplitsAsRedis: inline commands are split the way redis-server
// splits them (sdssplitargs), so that a command typed into telnet means
// the same through the proxy as to Redis itself: the same bytes reach a
// lock key or the upstream, and what Redis rejects is rejected.
func TestInlineSplitsAsRedis(t *testing.T) {
	for _, tc := range inlineCases {
		for _, split := range []bool{false, true} {
			name := tc.name
			var rd io.Reader = bytes.NewReader([]byte(tc.in))
			if split {
				name += "/byte at a time"
				rd = &oneByteReader{[]byte(tc.in)}
			}
			t.Run(name, func(t *testing.T) {
				got, err := readAll(rd)
				var gotErr string
				if err != nil {
					gotErr = err.Error()
				}
				if gotErr != tc.wantErr || !slices.EqualFunc(got, tc.want, slices.Equal) {
					t.Errorf("read %q = %q, err %q; redis-server reads %q, err %q", tc.in, got, gotErr, tc.want, tc.wantErr)
				}
			})
		}
	}
}

// FuzzInlineSplit: the reader's in-place inline splitting agrees with
// splitArgs, a line-by-line port of Redis's sdssplitargs, on any line.
func FuzzInlineSplit(f *testing.F) {
	for _, tc := range inlineCases {
		f.Add([]byte(tc.in))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) == 0 || in[0] == '*' {
			return // not an inline command
		}
		line, _, found := bytes.Cut(in, []byte("\n"))
		if !found || len(line) > MaxInlineSize {
			return
		}
		in = append(line, '\n')
		line = bytes.TrimSuffix(line, []byte("\r"))
		got, err := readAll(bytes.NewReader(in))
		if bytes.IndexByte(line, 0) >= 0 {
			if err == nil || err.Error() != errInlineNUL.Error() {
				t.Fatalf("read %q = %q, %v; want %v", in, got, err, errInlineNUL)
			}
			return
		}
		want, ok := splitArgs(line)
		if !ok {
			if err == nil || err.Error() != errQuotes.Error() {
				t.Fatalf("read %q = %q, %v; want %v", in, got, err, errQuotes)
			}
			return
		}
		if err != nil {
			t.Fatalf("read %q: %v; want %q", in, err, want)
		}
		var wantCmds [][]string // an empty line is no command
		if len(want) > 0 {
			wantCmds = [][]string{want}
		}
		if !slices.EqualFunc(got, wantCmds, slices.Equal) {
			t.Fatalf("read %q = %q; sdssplitargs reads %q", in, got, want)
		}
	})
}

// splitArgs is Redis's sdssplitargs (src/sds.c), ported statement for
// statement, with the line read as a C string (ending at a NUL). ok is
// false where sdssplitargs returns NULL (unbalanced quotes).
func splitArgs(line []byte) (args []string, ok bool) {
	if i := bytes.IndexByte(line, 0); i >= 0 {
		line = line[:i]
	}
	at := func(p int) byte { // *p, with the C string's terminator
		if p < len(line) {
			return line[p]
		}
		return 0
	}
	isspace := func(c byte) bool {
		return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
	}
	p := 0
	for {
		for at(p) != 0 && isspace(at(p)) {
			p++
		}
		if at(p) == 0 {
			return args, true
		}
		inq, insq, done := false, false, false
		var cur []byte
		for !done {
			switch {
			case inq:
				if at(p) == '\\' && at(p+1) == 'x' && isHex(at(p+2)) && isHex(at(p+3)) {
					cur = append(cur, unhex(at(p+2))*16+unhex(at(p+3)))
					p += 3
				} else if at(p) == '\\' && at(p+1) != 0 {
					p++
					c := at(p)
					switch c {
					case 'n':
						c = '\n'
					case 'r':
						c = '\r'
					case 't':
						c = '\t'
					case 'b':
						c = '\b'
					case 'a':
						c = '\a'
					}
					cur = append(cur, c)
				} else if at(p) == '"' {
					if at(p+1) != 0 && !isspace(at(p+1)) {
						return nil, false
					}
					done = true
				} else if at(p) == 0 {
					return nil, false
				} else {
					cur = append(cur, at(p))
				}
			case insq:
				if at(p) == '\\' && at(p+1) == '\'' {
					p++
					cur = append(cur, '\'')
				} else if at(p) == '\'' {
					if at(p+1) != 0 && !isspace(at(p+1)) {
						return nil, false
					}
					done = true
				} else if at(p) == 0 {
					return nil, false
				} else {
					cur = append(cur, at(p))
				}
			default:
				switch at(p) {
				case ' ', '\n', '\r', '\t', 0:
					done = true
				case '"':
					inq = true
				case '\'':
					insq = true
				default:
					cur = append(cur, at(p))
				}
			}
			if at(p) != 0 {
				p++
			}
		}
		args = append(args, string(cur))
	}
}
