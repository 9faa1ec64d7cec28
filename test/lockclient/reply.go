package lockclient

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Reply is one RESP2/RESP3 reply read off a raw connection.
type Reply struct {
	Kind  byte   // '+', '-', ':', '$', '*', '%', '~', '>', '_', '#', ',', '=', '('
	Str   string // simple, error, bulk, verbatim, double and big number text
	Int   int64
	Null  bool    // $-1, *-1 or _
	Elems []Reply // array, set and push elements; map keys and values alternate
}

func (r Reply) String() string {
	switch {
	case r.Null:
		return "(nil)"
	case r.Kind == ':':
		return fmt.Sprintf(":%d", r.Int)
	case r.Kind == '*' || r.Kind == '%' || r.Kind == '~' || r.Kind == '>':
		parts := make([]string, len(r.Elems))
		for i, e := range r.Elems {
			parts[i] = e.String()
		}
		return string(r.Kind) + "[" + strings.Join(parts, " ") + "]"
	default:
		return string(r.Kind) + strconv.Quote(r.Str)
	}
}

// Pairs returns the key/value pairs of a map reply (RESP3 %) or of a flat
// RESP2 array, by key.
func (r Reply) Pairs() map[string]Reply {
	m := map[string]Reply{}
	for i := 0; i+1 < len(r.Elems); i += 2 {
		m[r.Elems[i].Str] = r.Elems[i+1]
	}
	return m
}

// Encode is args as a RESP array of bulk strings, as a client sends a
// command.
func Encode(args ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	return b.String()
}

// maxDepth bounds how deeply ReadReply follows nested aggregates, so that
// a reply that nests without end fails instead of exhausting the stack.
const maxDepth = 32

// ReadReply parses one RESP2 or RESP3 reply from br.
func ReadReply(br *bufio.Reader) (Reply, error) {
	return readReply(br, 0)
}

func readReply(br *bufio.Reader, depth int) (Reply, error) {
	if depth > maxDepth {
		return Reply{}, errors.New("reply nested too deeply")
	}
	line, err := br.ReadString('\n')
	if err != nil {
		return Reply{}, err
	}
	if len(line) < 3 || !strings.HasSuffix(line, "\r\n") {
		return Reply{}, fmt.Errorf("malformed reply line %q", line)
	}
	kind, body := line[0], line[1:len(line)-2]
	r := Reply{Kind: kind}
	switch kind {
	case '+', '-', ',', '(':
		r.Str = body
	case '_':
		r.Null = true
	case '#':
		r.Str = body
		r.Int = map[string]int64{"t": 1}[body]
	case ':':
		if r.Int, err = strconv.ParseInt(body, 10, 64); err != nil {
			return Reply{}, fmt.Errorf("bad integer reply %q", line)
		}
	case '$', '=', '*', '%', '~', '>':
		n, err := strconv.Atoi(body)
		if err != nil {
			return Reply{}, fmt.Errorf("bad length %q", line)
		}
		if n < 0 {
			r.Null = true
			return r, nil
		}
		if kind == '$' || kind == '=' {
			buf := make([]byte, n+2)
			if _, err := io.ReadFull(br, buf); err != nil {
				return Reply{}, err
			}
			if string(buf[n:]) != "\r\n" {
				return Reply{}, fmt.Errorf("bulk of %d bytes not followed by CRLF", n)
			}
			r.Str = string(buf[:n])
			return r, nil
		}
		if kind == '%' {
			n *= 2
		}
		for i := 0; i < n; i++ {
			e, err := readReply(br, depth+1)
			if err != nil {
				return Reply{}, err
			}
			r.Elems = append(r.Elems, e)
		}
	default:
		return Reply{}, fmt.Errorf("unknown reply type %q", line)
	}
	return r, nil
}
