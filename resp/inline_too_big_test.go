package resp

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// segReader returns its input n bytes at a time, as a socket does.
type segReader struct {
	b []byte
	n int
}

func (r *segReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	k := copy(p[:min(len(p), r.n)], r.b)
	r.b = r.b[k:]
	return k, nil
}

// TestInlineTooBigRefused: an inline line longer than MaxInlineSize (64 KB)
// is refused with Redis's "too big inline request", however it arrives.
// redis-server 7.0.15 answers "-ERR Protocol error: too big inline request"
// to "ECHO <100,000 bytes>\r\n" sent in one write; lockproxy used to check
// the size only while no newline had come yet, so a line up to twice the
// limit that arrived whole (its buffer grows from 64 KB to 128 KB) was run.
func TestInlineTooBigRefused(t *testing.T) {
	for _, size := range []int{100_000, 130_000} {
		line := "ECHO " + strings.Repeat("a", size) + "\r\nPING\r\n"
		for _, rd := range []struct {
			name string
			r    func() io.Reader
		}{
			{"whole", func() io.Reader { return bytes.NewReader([]byte(line)) }},
			{"16KB reads", func() io.Reader { return &segReader{b: []byte(line), n: 16 << 10} }},
			{"half reads", func() io.Reader { return iotest.HalfReader(bytes.NewReader([]byte(line))) }},
		} {
			r := NewReader(rd.r())
			var err error
			var got [][][]byte
			for err == nil {
				var cmds [][][]byte
				cmds, err = r.ReadBatch()
				got = append(got, cmds...)
			}
			if len(got) != 0 || !IsProtocolError(err) || err.Error() != errInlineSize.Error() {
				t.Errorf("inline line of %d bytes, %s: %d commands, %v; want none and %q", size+5, rd.name, len(got), err, errInlineSize.Error())
			}
		}
	}
}
