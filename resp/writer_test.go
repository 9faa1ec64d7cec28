package resp_test

import (
	"math"
	"strings"
	"testing"

	"github.com/lockproxy/lockproxy/resp"
)

func TestWriter(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(w *resp.Writer)
		resp2 string
		resp3 string
	}{
		{"Simple", func(w *resp.Writer) { w.Simple("OK") }, "+OK\r\n", "+OK\r\n"},
		{"Simple with line breaks", func(w *resp.Writer) { w.Simple("a\r\nb\nc") }, "+a  b c\r\n", "+a  b c\r\n"},
		{"Error", func(w *resp.Writer) { w.Error("ERR syntax error") }, "-ERR syntax error\r\n", "-ERR syntax error\r\n"},
		{"Error with embedded CRLF", func(w *resp.Writer) { w.Error("ERR bad\r\n+OK") },
			"-ERR bad  +OK\r\n", "-ERR bad  +OK\r\n"},
		{"Error with lone CR and LF", func(w *resp.Writer) { w.Error("ERR a\rb\nc") }, "-ERR a b c\r\n", "-ERR a b c\r\n"},
		{"Int", func(w *resp.Writer) { w.Int(-5) }, ":-5\r\n", ":-5\r\n"},
		{"Int min", func(w *resp.Writer) { w.Int(math.MinInt64) }, ":-9223372036854775808\r\n", ":-9223372036854775808\r\n"},
		{"Uint max", func(w *resp.Writer) { w.Uint(math.MaxUint64) }, ":18446744073709551615\r\n", ":18446744073709551615\r\n"},
		{"Bulk", func(w *resp.Writer) { w.Bulk([]byte("a\r\nb")) }, "$4\r\na\r\nb\r\n", "$4\r\na\r\nb\r\n"},
		{"Bulk nil", func(w *resp.Writer) { w.Bulk(nil) }, "$0\r\n\r\n", "$0\r\n\r\n"},
		{"BulkString binary", func(w *resp.Writer) { w.BulkString("\x00\xff") }, "$2\r\n\x00\xff\r\n", "$2\r\n\x00\xff\r\n"},
		{"Array", func(w *resp.Writer) { w.Array(2) }, "*2\r\n", "*2\r\n"},
		{"Array empty", func(w *resp.Writer) { w.Array(0) }, "*0\r\n", "*0\r\n"},
		{"Map", func(w *resp.Writer) { w.Map(3) }, "*6\r\n", "%3\r\n"},
		{"Map empty", func(w *resp.Writer) { w.Map(0) }, "*0\r\n", "%0\r\n"},
		{"Null", func(w *resp.Writer) { w.Null() }, "$-1\r\n", "_\r\n"},
		{"NullArray", func(w *resp.Writer) { w.NullArray() }, "*-1\r\n", "_\r\n"},
		{"Set", func(w *resp.Writer) { w.Set(2) }, "*2\r\n", "~2\r\n"},
		{"Push", func(w *resp.Writer) { w.Push(3) }, "*3\r\n", ">3\r\n"},
		{"Bool true", func(w *resp.Writer) { w.Bool(true) }, ":1\r\n", "#t\r\n"},
		{"Bool false", func(w *resp.Writer) { w.Bool(false) }, ":0\r\n", "#f\r\n"},
		{"Verbatim", func(w *resp.Writer) { w.Verbatim("# Server\r\nredis_version:7.2.0\r\n") },
			"$31\r\n# Server\r\nredis_version:7.2.0\r\n\r\n",
			"=35\r\ntxt:# Server\r\nredis_version:7.2.0\r\n\r\n"},
		{"Verbatim empty", func(w *resp.Writer) { w.Verbatim("") }, "$0\r\n\r\n", "=4\r\ntxt:\r\n"},
		{"Raw", func(w *resp.Writer) { w.Raw([]byte(">2\r\n$4\r\nlost\r\n$1\r\nk\r\n")) },
			">2\r\n$4\r\nlost\r\n$1\r\nk\r\n", ">2\r\n$4\r\nlost\r\n$1\r\nk\r\n"},
		{"lease map", func(w *resp.Writer) {
			w.Map(3)
			w.BulkString("token")
			w.BulkString("t1")
			w.BulkString("validity_ms")
			w.Int(29689)
			w.BulkString("fence")
			w.Uint(17)
		},
			"*6\r\n$5\r\ntoken\r\n$2\r\nt1\r\n$11\r\nvalidity_ms\r\n:29689\r\n$5\r\nfence\r\n:17\r\n",
			"%3\r\n$5\r\ntoken\r\n$2\r\nt1\r\n$11\r\nvalidity_ms\r\n:29689\r\n$5\r\nfence\r\n:17\r\n"},
		{"lost-lock push", func(w *resp.Writer) {
			w.Push(2)
			w.BulkString("lockproxy-lost")
			w.BulkString("k")
		},
			"*2\r\n$14\r\nlockproxy-lost\r\n$1\r\nk\r\n",
			">2\r\n$14\r\nlockproxy-lost\r\n$1\r\nk\r\n"},
	} {
		for _, proto := range []int{2, 3} {
			want := tc.resp2
			if proto == 3 {
				want = tc.resp3
			}
			w := resp.NewWriter()
			w.SetProto(proto)
			tc.write(w)
			if got := string(w.Bytes()); got != want {
				t.Errorf("%s in RESP%d = %q; want %q", tc.name, proto, got, want)
			}
			if w.Len() != len(want) {
				t.Errorf("%s in RESP%d: Len() = %d; want %d", tc.name, proto, w.Len(), len(want))
			}
		}
	}
}

func TestWriterProtoAndReset(t *testing.T) {
	w := resp.NewWriter()
	if w.Proto() != 2 {
		t.Errorf("NewWriter().Proto() = %d; want 2", w.Proto())
	}
	w.Null()
	w.SetProto(3)
	if w.Proto() != 3 {
		t.Errorf("Proto() after SetProto(3) = %d; want 3", w.Proto())
	}
	// Switching applies to replies written from then on.
	w.Null()
	if got, want := string(w.Bytes()), "$-1\r\n_\r\n"; got != want {
		t.Errorf("Null, SetProto(3), Null = %q; want %q", got, want)
	}
	w.Reset()
	if w.Len() != 0 || len(w.Bytes()) != 0 {
		t.Errorf("after Reset: Len() = %d, Bytes() = %q; want empty", w.Len(), w.Bytes())
	}
	if w.Proto() != 3 {
		t.Errorf("Reset changed the protocol to %d", w.Proto())
	}

	// A buffer that grew past 1 MiB is dropped on Reset.
	w.BulkString(strings.Repeat("x", 2<<20))
	w.Reset()
	if c := cap(w.Bytes()); c > 1<<20 {
		t.Errorf("cap after Reset of a 2 MiB buffer = %d; want at most 1 MiB", c)
	}
	w.Simple("OK")
	if got := string(w.Bytes()); got != "+OK\r\n" {
		t.Errorf("write after Reset = %q; want %q", got, "+OK\r\n")
	}
}

func TestWriterDoesNotAllocate(t *testing.T) {
	w := resp.NewWriter()
	w.SetProto(3)
	token := []byte("0123456789abcdef0123456789abcdef")
	allocs := testing.AllocsPerRun(100, func() {
		w.Reset()
		w.Map(3)
		w.BulkString("token")
		w.Bulk(token)
		w.BulkString("validity_ms")
		w.Int(29689)
		w.BulkString("fence")
		w.Uint(17)
		w.Null()
		w.Bool(true)
		w.Error("ERR syntax error")
	})
	if allocs != 0 {
		t.Errorf("writing a lease allocates %v times; want 0", allocs)
	}
}
