package redis

import (
	"bufio"
	"bytes"
	"testing"
)

func replyConn(data string) *nodeConn {
	return &nodeConn{n: &Node{name: "test"}, rd: bufio.NewReader(bytes.NewReader([]byte(data)))}
}

func TestReadReply(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // kind, then what it carries
		bad  bool
	}{
		{in: "+OK\r\n", want: "+OK"},
		{in: "-NOSCRIPT No matching script\r\n", want: "-NOSCRIPT No matching script"},
		{in: ":42\r\n", want: ":42"},
		{in: ":-1\r\n", want: ":-1"},
		{in: "$-1\r\n", want: "$nil"},
		{in: "$5\r\nhello\r\n", want: "$hello"},
		{in: "*2\r\n:7\r\n:1\r\n", want: "*[:7 :1]"},
		{in: "*3\r\n:7\r\n+x\r\n$-1\r\n", want: "*[:7 +x $nil]"},
		{in: "*-1\r\n", want: "*nil"},
		{in: "*0\r\n", want: "*[]"},
		{in: ":4x\r\n", bad: true},
		{in: "$5\r\nhel", bad: true},
		{in: "*2\r\n:1\r\n", bad: true},
		{in: "?\r\n", bad: true},
		{in: "+OK\n", bad: true},
		{in: "*99999999\r\n", bad: true},
		{in: "$-7\r\n", bad: true},
		{in: "", bad: true},
	} {
		var r reply
		err := replyConn(tc.in).read(&r)
		if tc.bad {
			if err == nil {
				t.Errorf("read(%q) = %s; want an error", tc.in, describeReply(&r))
			}
			continue
		}
		if err != nil {
			t.Errorf("read(%q): %v", tc.in, err)
			continue
		}
		if got := describeReply(&r); got != tc.want {
			t.Errorf("read(%q) = %s; want %s", tc.in, got, tc.want)
		}
	}
}

func describeReply(r *reply) string {
	switch {
	case r.err != nil:
		return "-" + r.err.Error()
	case r.null:
		return string(r.kind) + "nil"
	case r.kind == ':':
		return ":" + itoa(r.n)
	case r.kind == '*':
		s := "*["
		for i := range r.arr {
			if i > 0 {
				s += " "
			}
			s += describeReply(&r.arr[i])
		}
		return s + "]"
	}
	return string(r.kind) + string(r.s)
}

func itoa(n int64) string {
	var b [20]byte
	return string(appendInt(b[:0], n))
}

func appendInt(b []byte, n int64) []byte {
	if n < 0 {
		return appendInt(append(b, '-'), -n)
	}
	if n >= 10 {
		b = appendInt(b, n/10)
	}
	return append(b, byte('0'+n%10))
}

// TestReplyResults: the answers of the lock scripts as the writer reads
// them, including the malformed ones a node we cannot trust might give.
func TestReplyResults(t *testing.T) {
	read := func(s string) *reply {
		var r reply
		if err := replyConn(s).read(&r); err != nil {
			t.Fatalf("read(%q): %v", s, err)
		}
		return &r
	}
	for _, tc := range []struct {
		in      string
		want    opResult
		wantErr bool
	}{
		{in: "*2\r\n:12\r\n:1\r\n", want: opResult{n: 12, holds: 1}},
		{in: "*3\r\n:12\r\n:2\r\n:15\r\n", want: opResult{n: 12, holds: 2, counter: 15}},
		{in: ":0\r\n", want: opResult{n: acquireRefused}},
		{in: ":-1\r\n", want: opResult{n: acquireUpgrade}},
		{in: "*2\r\n:12\r\n:0\r\n", wantErr: true},
		{in: "*2\r\n:-3\r\n:1\r\n", wantErr: true},
		{in: "*2\r\n+12\r\n:1\r\n", wantErr: true},
		{in: "*1\r\n:12\r\n", wantErr: true},
		{in: "$2\r\nOK\r\n", wantErr: true},
		{in: "-ERR busy\r\n", wantErr: true},
	} {
		got := acquireResult(read(tc.in))
		if (got.err != nil) != tc.wantErr || (!tc.wantErr && got != tc.want) {
			t.Errorf("acquireResult(%q) = %+v; want %+v (error %v)", tc.in, got, tc.want, tc.wantErr)
		}
	}
	for _, tc := range []struct {
		in   string
		n    int
		want []int64
	}{
		{"*3\r\n:1\r\n:0\r\n:1\r\n", 3, []int64{1, 0, 1}},
		{"*2\r\n:1\r\n:0\r\n", 3, nil},
		{"*1\r\n:2\r\n", 1, nil},
		{":1\r\n", 1, nil},
		{"-NOSCRIPT x\r\n", 1, nil},
	} {
		got, err := releaseResults(read(tc.in), tc.n)
		if (err == nil) != (tc.want != nil) || len(got) != len(tc.want) {
			t.Errorf("releaseResults(%q, %d) = %v, %v; want %v", tc.in, tc.n, got, err, tc.want)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("releaseResults(%q, %d) = %v; want %v", tc.in, tc.n, got, tc.want)
			}
		}
	}
}

// FuzzReadReply: whatever a node sends, reading it ends in replies or an
// error, never a panic or a runaway allocation.
func FuzzReadReply(f *testing.F) {
	for _, s := range []string{"+OK\r\n", ":1\r\n", "$3\r\nabc\r\n", "*2\r\n:1\r\n*1\r\n$-1\r\n", "-ERR x\r\n", "*-1\r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c := &nodeConn{n: &Node{name: "fuzz"}, rd: bufio.NewReader(bytes.NewReader(data))}
		var r reply
		for i := 0; i < 64; i++ {
			if err := c.read(&r); err != nil {
				return
			}
			_ = acquireResult(&r)
			_, _ = releaseResults(&r, 1)
		}
	})
}
