package resp

import (
	"bytes"
	"strconv"
	"testing"
)

// TestMultibulkOverMillionArgs: a command of more than 1,048,576 arguments
// is read, as redis-server 7 reads it: its multibulk cap is INT_MAX (the
// 1024*1024 cap is older Redis's), so a DEL or MSET of 1.1 million arguments
// relayed through lockproxy used to end the connection with "Protocol
// error: invalid multibulk length" where Redis runs it. Redis's text stays
// for a count past INT_MAX.
func TestMultibulkOverMillionArgs(t *testing.T) {
	cases := []struct {
		name    string
		n       int64 // arguments announced
		send    bool  // send them all, then PING
		wantErr bool
	}{
		{"1,048,577 arguments", 1<<20 + 1, true, false},
		{"1,100,000 arguments", 1_100_000, true, false},
		{"past INT_MAX", 1<<31 + 1, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			b.WriteString("*" + strconv.FormatInt(tc.n, 10) + "\r\n")
			if tc.send {
				b.WriteString("$3\r\nDEL\r\n")
				for i := int64(1); i < tc.n; i++ {
					b.WriteString("$1\r\nk\r\n")
				}
				b.WriteString("*1\r\n$4\r\nPING\r\n")
			}
			r := NewReader(&segReader{b: b.Bytes(), n: 64 << 10})
			var cmds [][][]byte
			var err error
			for err == nil && len(cmds) < 2 {
				var batch [][][]byte
				batch, err = r.ReadBatch()
				cmds = append(cmds, batch...)
			}
			if tc.wantErr {
				if !IsProtocolError(err) || err.Error() != errMultibulkLen.Error() {
					t.Errorf("*%d: %v; want %q", tc.n, err, errMultibulkLen.Error())
				}
				return
			}
			if len(cmds) != 2 || int64(len(cmds[0])) != tc.n || string(cmds[1][0]) != "PING" {
				t.Fatalf("*%d DEL k k … then PING: %d commands (first of %d arguments), %v; want DEL of %d arguments, then PING", tc.n, len(cmds), lenFirst(cmds), err, tc.n)
			}
		})
	}
}

func lenFirst(cmds [][][]byte) int {
	if len(cmds) == 0 {
		return 0
	}
	return len(cmds[0])
}
