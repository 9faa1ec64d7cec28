package fault

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// rawConn is a bare RESP connection to lockproxy, for what go-redis does
// not show: RESP3 push frames (lock-lost) between replies.
type rawConn struct {
	c net.Conn
	r *bufio.Reader
}

// pushFrame is a RESP3 push, such as ["lock-lost", key, token].
type pushFrame []any

func dialRaw(addr string) (*rawConn, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	return &rawConn{c: c, r: bufio.NewReader(c)}, nil
}

func (c *rawConn) Close() error { return c.c.Close() }

// send writes one command.
func (c *rawConn) send(args ...string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	_ = c.c.SetWriteDeadline(time.Now().Add(2 * time.Second))
	_, err := io.WriteString(c.c, b.String())
	return err
}

// read reads one value before the deadline. Errors come back as error
// values (not Go errors); push frames as pushFrame.
func (c *rawConn) read(deadline time.Time) (any, error) {
	_ = c.c.SetReadDeadline(deadline)
	return readValue(c.r)
}

// do sends a command and returns its reply, skipping push frames (which
// it returns too, in order).
func (c *rawConn) do(timeout time.Duration, args ...string) (any, []pushFrame, error) {
	if err := c.send(args...); err != nil {
		return nil, nil, err
	}
	var pushes []pushFrame
	for {
		v, err := c.read(time.Now().Add(timeout))
		if err != nil {
			return nil, pushes, err
		}
		if p, ok := v.(pushFrame); ok {
			pushes = append(pushes, p)
			continue
		}
		return v, pushes, nil
	}
}

type respError string

func (e respError) Error() string { return string(e) }

// readValue reads one RESP2/RESP3 value: strings as string, integers as
// int64, arrays/sets as []any, maps as map[string]any (keys as text), nulls
// as nil, errors as respError.
func readValue(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("empty RESP line")
	}
	body := line[1:]
	switch line[0] {
	case '+':
		return body, nil
	case '-', '!':
		if line[0] == '!' {
			s, err := readBulk(r, body)
			return respError(s), err
		}
		return respError(body), nil
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case ',':
		return strconv.ParseFloat(body, 64)
	case '#':
		return body == "t", nil
	case '_':
		return nil, nil
	case '$', '=':
		if body == "-1" {
			return nil, nil
		}
		return readBulk(r, body)
	case '*', '~', '>':
		n, err := strconv.Atoi(body)
		if err != nil {
			return nil, err
		}
		if n < 0 {
			return nil, nil
		}
		arr := make([]any, n)
		for i := range arr {
			if arr[i], err = readValue(r); err != nil {
				return nil, err
			}
		}
		if line[0] == '>' {
			return pushFrame(arr), nil
		}
		return arr, nil
	case '%', '|':
		n, err := strconv.Atoi(body)
		if err != nil {
			return nil, err
		}
		m := make(map[string]any, n)
		for range n {
			k, err := readValue(r)
			if err != nil {
				return nil, err
			}
			v, err := readValue(r)
			if err != nil {
				return nil, err
			}
			m[fmt.Sprint(k)] = v
		}
		if line[0] == '|' { // attributes precede the real value
			return readValue(r)
		}
		return m, nil
	}
	return nil, fmt.Errorf("unknown RESP type %q", line)
}

func readBulk(r *bufio.Reader, lenText string) (string, error) {
	n, err := strconv.Atoi(lenText)
	if err != nil || n < 0 {
		return "", fmt.Errorf("bad bulk length %q", lenText)
	}
	b := make([]byte, n+2)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", err
	}
	return string(b[:n]), nil
}

// rawGrant turns a LOCK reply (RESP3 map or RESP2 flat array) into a
// reply.
func rawGrant(v any) (lockclient.Grant, error) {
	switch x := v.(type) {
	case map[string]any:
		flat := make([]any, 0, 6)
		for _, k := range []string{"token", "validity_ms", "fence"} {
			flat = append(flat, k, x[k])
		}
		return lockclient.ParseGrant(flat)
	case respError:
		return lockclient.Grant{}, x
	}
	return lockclient.ParseGrant(v)
}
