package relay

import (
	"bytes"
	"errors"
	"strconv"
)

// maxLine bounds a frame's header line (a type and a length or number): a
// longer one from the upstream is a broken stream. Simple strings and
// errors are not bounded by Redis (a script's error_reply can be any
// length); maxTextLine bounds them as Redis bounds a bulk string.
const (
	maxLine     = 64 << 10
	maxTextLine = 512 << 20
)

// errBadFrame is a reply stream that is not RESP: the connection is
// dropped, since nothing after it can be matched to a request.
var errBadFrame = errors.New("relay: malformed reply from upstream")

// frameEnd returns the length of the complete frame at the start of b, 0
// when b holds only part of it, or errBadFrame. Aggregates are walked with
// a counter of elements still to come, not recursively, so a deep or wide
// reply costs no stack. An attribute (|) counts together with the value it
// annotates, so it is relayed as part of that reply.
func frameEnd(b []byte) (int, error) {
	pos, remaining := 0, 1
	for remaining > 0 {
		if pos >= len(b) {
			return 0, nil
		}
		t := b[pos]
		nl := indexCRLF(b[pos:])
		if nl == 0 || nl == badLine {
			// A line with no type byte (the bare newlines a replication
			// stream sends as keepalives) or ending in a lone LF: no
			// reply of Redis's, and nothing after it can be framed.
			return 0, errBadFrame
		}
		if nl < 0 {
			limit := maxLine
			if t == '+' || t == '-' {
				limit = maxTextLine
			}
			if len(b)-pos > limit {
				return 0, errBadFrame
			}
			return 0, nil
		}
		line := b[pos+1 : pos+nl]
		next := pos + nl + 2
		remaining--
		switch t {
		case '+', '-', ':', '_', '#', ',', '(':
			pos = next
		case '$', '!', '=':
			n, ok := parseLen(line)
			if !ok {
				return 0, errBadFrame
			}
			if n < 0 {
				pos = next
				continue
			}
			end := next + n + 2
			if end > len(b) {
				return 0, nil
			}
			pos = end
		case '*', '~', '>', '%', '|':
			n, ok := parseLen(line)
			if !ok {
				return 0, errBadFrame
			}
			if n > 0 {
				switch t {
				case '%':
					n *= 2
				case '|':
					n = 2*n + 1
				}
				remaining += n
			} else if t == '|' {
				remaining++
			}
			pos = next
		default:
			return 0, errBadFrame
		}
	}
	return pos, nil
}

// badLine is indexCRLF's answer for a line that ends in LF without CR.
const badLine = -2

// indexCRLF returns where the line at the start of b ends (its CR), -1
// when b holds no LF yet, or badLine.
func indexCRLF(b []byte) int {
	limit := maxLine
	if len(b) > 0 && (b[0] == '+' || b[0] == '-') {
		limit = maxTextLine
	}
	if len(b) > limit+2 {
		b = b[:limit+2]
	}
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return -1
	}
	if i < 1 || b[i-1] != '\r' {
		return badLine
	}
	return i - 1
}

// parseLen parses a length: a decimal integer, -1 for null.
func parseLen(b []byte) (int, bool) {
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	if len(b) == 2 && b[0] == '-' && b[1] == '1' {
		return -1, true
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// elements splits an aggregate frame into its type, the frames of its
// elements (a map's keys and values alternate) and whether it was an
// aggregate at all. A leading attribute is skipped.
func elements(f []byte) (byte, [][]byte, bool) {
	for len(f) > 0 && f[0] == '|' {
		// Skip the attribute: its header and 2n element frames.
		nl := indexCRLF(f)
		if nl < 0 {
			return 0, nil, false
		}
		n, ok := parseLen(f[1:nl])
		if !ok {
			return 0, nil, false
		}
		pos := nl + 2
		for i := 0; i < 2*n; i++ {
			e, err := frameEnd(f[pos:])
			if err != nil || e == 0 {
				return 0, nil, false
			}
			pos += e
		}
		f = f[pos:]
	}
	if len(f) == 0 {
		return 0, nil, false
	}
	t := f[0]
	switch t {
	case '*', '~', '>', '%':
	default:
		return t, nil, false
	}
	nl := indexCRLF(f)
	if nl < 0 {
		return t, nil, false
	}
	n, ok := parseLen(f[1:nl])
	if !ok {
		return t, nil, false
	}
	if t == '%' {
		n *= 2
	}
	if n < 0 {
		return t, nil, true
	}
	out := make([][]byte, 0, n)
	pos := nl + 2
	for i := 0; i < n; i++ {
		e, err := frameEnd(f[pos:])
		if err != nil || e == 0 {
			return t, nil, false
		}
		out = append(out, f[pos:pos+e])
		pos += e
	}
	return t, out, true
}

// str returns the text of a simple, bulk or verbatim string frame.
func str(f []byte) ([]byte, bool) {
	if len(f) < 3 {
		return nil, false
	}
	switch f[0] {
	case '+', '-':
		return f[1 : len(f)-2], true
	case '$', '=':
		nl := indexCRLF(f)
		if nl < 0 {
			return nil, false
		}
		n, ok := parseLen(f[1:nl])
		if !ok || n < 0 || nl+2+n > len(f) {
			return nil, false
		}
		s := f[nl+2 : nl+2+n]
		if f[0] == '=' && len(s) >= 4 {
			s = s[4:] // "txt:"
		}
		return s, true
	}
	return nil, false
}

// integer returns the value of an integer frame.
func integer(f []byte) (int64, bool) {
	if len(f) < 4 || f[0] != ':' {
		return 0, false
	}
	n, err := strconv.ParseInt(string(f[1:len(f)-2]), 10, 64)
	return n, err == nil
}

// appendCommand appends args as a RESP array of bulk strings.
func appendCommand(b []byte, args [][]byte) []byte {
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(len(args)), 10)
	b = append(b, '\r', '\n')
	for _, a := range args {
		b = append(b, '$')
		b = strconv.AppendInt(b, int64(len(a)), 10)
		b = append(b, '\r', '\n')
		b = append(b, a...)
		b = append(b, '\r', '\n')
	}
	return b
}

// appendError appends an error reply, its text on one line.
func appendError(b []byte, msg string) []byte {
	b = append(b, '-')
	for i := 0; i < len(msg); i++ {
		c := msg[i]
		if c == '\r' || c == '\n' {
			c = ' '
		}
		b = append(b, c)
	}
	return append(b, '\r', '\n')
}

// Split splits an aggregate reply into its type and element frames (a
// map's keys and values alternate); ok is false for any other reply.
func Split(f []byte) (t byte, elems [][]byte, ok bool) { return elements(f) }

// Text returns the text of a simple, bulk or verbatim string reply.
func Text(f []byte) ([]byte, bool) { return str(f) }

// FrameEnd is frameEnd for tools that split RESP reply streams (the test
// fault proxy): the length of the complete frame at the start of b, 0 when
// b holds only part of it, or an error for a stream that is not RESP.
func FrameEnd(b []byte) (int, error) { return frameEnd(b) }

// AppendCommand appends args as a RESP array of bulk strings (a command,
// or a reply of that shape), for tools that write RESP (the test fault
// proxy).
func AppendCommand(b []byte, args [][]byte) []byte { return appendCommand(b, args) }
