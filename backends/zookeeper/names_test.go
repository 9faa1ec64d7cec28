package zookeeper

import (
	"strings"
	"testing"
	"time"
)

// FuzzParseChild: any child name parses or is rejected without a panic,
// and a parsed one rebuilds to the same name.
func FuzzParseChild(f *testing.F) {
	for _, s := range []string{"w-0123456789abcdef-0a0b0c0d-0000000001", "r-x-y-0000000042", "w--", "", "lock-0000000001", "w-a-b-c-0000000001", "w-a-b--2147483648", "r-a-b--000000007"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		c, ok := parseChild(name)
		if !ok {
			return
		}
		if got := childPrefix(c.kind, c.hash, c.nonce) + formatSeq(c.seq); got != name {
			t.Fatalf("parseChild(%q) = %+v, which rebuilds to %q", name, c, got)
		}
	})
}

// FuzzDecodeData: any node data decodes or is rejected without a panic;
// decoded data encodes back to the same bytes, or, for data in the
// previous format (which is read but no longer written), to bytes that
// decode to the same data.
func FuzzDecodeData(f *testing.F) {
	f.Add(lockData{write: 1, ttl: time.Second, startMS: 1700000000000, token: "t"}.encode())
	f.Add(lockData{read: 3, ttl: 30 * time.Second, token: strings.Repeat("\x00", 40)}.encode())
	f.Add([]byte("\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x03\xe8tok"))
	f.Add([]byte("hello"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := decodeData(b)
		if err != nil {
			return
		}
		got := d.encode()
		if b[0] == dataVersion && string(got) != string(b) {
			t.Fatalf("encode(decode(%x)) = %x", b, got)
		}
		if again, err := decodeData(got); err != nil || again != d {
			t.Fatalf("decode(encode(decode(%x))) = %+v, %v; want %+v", b, again, err, d)
		}
	})
}
