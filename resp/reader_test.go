package resp

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// oneByteReader returns its input a byte at a time, to exercise every
// partial-command path.
type oneByteReader struct{ b []byte }

func (r *oneByteReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	p[0] = r.b[0]
	r.b = r.b[1:]
	return 1, nil
}

func encode(cmds [][]string) []byte {
	var b []byte
	for _, c := range cmds {
		b = append(b, '*')
		b = strconv.AppendInt(b, int64(len(c)), 10)
		b = append(b, "\r\n"...)
		for _, a := range c {
			b = append(b, '$')
			b = strconv.AppendInt(b, int64(len(a)), 10)
			b = append(b, "\r\n"...)
			b = append(b, a...)
			b = append(b, "\r\n"...)
		}
	}
	return b
}

// readAll reads every command until the input ends or is malformed.
func readAll(rd io.Reader) ([][]string, error) {
	out, err := readAllWith(rd, false)
	if errors.Is(err, io.EOF) {
		err = nil
	}
	return out, err
}

func TestReader(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		want    [][]string
		wantErr string
	}{
		{"one", "*1\r\n$4\r\nPING\r\n", [][]string{{"PING"}}, ""},
		{"pipeline", "*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nECHO\r\n$0\r\n\r\n", [][]string{{"PING"}, {"ECHO", ""}}, ""},
		{"binary", "*2\r\n$4\r\nECHO\r\n$4\r\na\r\n\x00\r\n", [][]string{{"ECHO", "a\r\n\x00"}}, ""},
		{"empty array ignored", "*0\r\n*1\r\n$4\r\nPING\r\n", [][]string{{"PING"}}, ""},
		{"inline", "LOCK  demo PX 100\r\n", [][]string{{"LOCK", "demo", "PX", "100"}}, ""},
		{"inline LF only", "PING\n", [][]string{{"PING"}}, ""},
		{"inline quotes", "ECHO \"a b\\n\" 'c d'\r\n", [][]string{{"ECHO", "a b\n", "c d"}}, ""},
		{"inline hex escapes", "ECHO \"\\x41\\x62\\x0a\\xZZ\\x4\"\r\n", [][]string{{"ECHO", "Ab\nxZZx4"}}, ""},
		{"inline hex escape at the end", "ECHO \"a\\x41\"\r\n", [][]string{{"ECHO", "aA"}}, ""},
		{"inline empty line", "\r\nPING\r\n", [][]string{{"PING"}}, ""},
		{"unbalanced quotes", "ECHO \"a\r\n", nil, "Protocol error: unbalanced quotes in request"},
		{"bad bulk length", "*2\r\n$x\r\n", nil, "Protocol error: invalid bulk length"},
		{"negative bulk", "*1\r\n$-1\r\n", nil, "Protocol error: invalid bulk length"},
		{"huge bulk", "*1\r\n$1000000000\r\n", nil, "Protocol error: invalid bulk length"},
		{"huge multibulk", "*2147483648\r\n", nil, "Protocol error: invalid multibulk length"},
		{"bad multibulk", "*x\r\n", nil, "Protocol error: invalid multibulk length"},
		{"not a bulk", "*1\r\n:1\r\n", nil, "Protocol error: expected '$', got ':'"},
		{"missing CRLF after bulk", "*1\r\n$4\r\nPINGxx", nil, "Protocol error: invalid bulk length"},
		{"commands before an error are kept", "*1\r\n$4\r\nPING\r\n*2\r\n$x\r\n", [][]string{{"PING"}}, "Protocol error: invalid bulk length"},
		{"truncated", "*2\r\n$4\r\nECHO\r\n$3\r\nab", nil, ""},
	} {
		for _, split := range []bool{false, true} {
			name := tc.name
			if split {
				name += "/byte at a time"
			}
			t.Run(name, func(t *testing.T) {
				var rd io.Reader = bytes.NewReader([]byte(tc.in))
				if split {
					rd = &oneByteReader{[]byte(tc.in)}
				}
				got, err := readAll(rd)
				if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || err.Error() != tc.wantErr) {
					t.Fatalf("read %q: err = %v; want %q", tc.in, err, tc.wantErr)
				}
				if len(got) != len(tc.want) {
					t.Fatalf("read %q = %q; want %q", tc.in, got, tc.want)
				}
				for i := range got {
					if len(got[i]) != len(tc.want[i]) {
						t.Fatalf("read %q = %q; want %q", tc.in, got, tc.want)
					}
					for j := range got[i] {
						if got[i][j] != tc.want[i][j] {
							t.Fatalf("read %q = %q; want %q", tc.in, got, tc.want)
						}
					}
				}
			})
		}
	}
}

// A big bulk makes the buffer grow to it, then shrink back when idle.
func TestReaderBigBulk(t *testing.T) {
	big := string(bytes.Repeat([]byte("x"), 1<<20))
	in := encode([][]string{{"ECHO", big}, {"PING"}})
	got, err := readAll(bytes.NewReader(in))
	if err != nil || len(got) != 2 || got[0][1] != big || got[1][0] != "PING" {
		t.Fatalf("big bulk: %d commands, err %v", len(got), err)
	}
}

// Batches handed out stay intact while the reader reads on.
func TestReaderBatchesAreIndependent(t *testing.T) {
	in := encode([][]string{{"A", "1"}})
	r := NewReader(&oneByteReader{append(in, encode([][]string{{"B", "2"}})...)})
	first, err := r.ReadBatch()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadBatch(); err != nil {
		t.Fatal(err)
	}
	if string(first[0][0]) != "A" || string(first[0][1]) != "1" {
		t.Fatalf("first batch changed to %q", first)
	}
}

func FuzzReader(f *testing.F) {
	f.Add([]byte("*1\r\n$4\r\nPING\r\n"))
	f.Add([]byte("*3\r\n$4\r\nLOCK\r\n$4\r\ndemo\r\n$5\r\n10000\r\n"))
	f.Add([]byte("LOCK demo PX 10000\r\n"))
	f.Add([]byte("ECHO \"a\\x\" 'b'\n"))
	f.Add([]byte("*2\r\n$x\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		whole, werr := readAll(bytes.NewReader(in))
		split, serr := readAll(&oneByteReader{in})
		// However the input is cut into reads, the same commands come out.
		if (werr == nil) != (serr == nil) || len(whole) != len(split) {
			t.Fatalf("whole: %d cmds, %v; byte at a time: %d cmds, %v", len(whole), werr, len(split), serr)
		}
		// Re-encoding what was read reads back the same.
		again, err := readAll(bytes.NewReader(encode(whole)))
		if err != nil || len(again) != len(whole) {
			t.Fatalf("round trip: %d cmds, %v; want %d", len(again), err, len(whole))
		}
	})
}

// A header announcing a huge bulk string does not make the reader allocate
// it before the data comes.
func TestReaderHugeHeaderAllocatesLittle(t *testing.T) {
	r := NewReader(bytes.NewReader([]byte("*1\r\n$500000000\r\nabc")))
	_, err := r.ReadBatch()
	if err == nil {
		t.Fatal("truncated input read without error")
	}
	if len(r.buf) > 4*maxGrowStep {
		t.Fatalf("read buffer grew to %d bytes on a header alone", len(r.buf))
	}
}

// TestReaderPreAuth: before a client authenticates, Redis's caps hold (10
// arguments, 16 KB per argument, with Redis's texts), and every batch is
// one command, so that what follows an AUTH is read with the caps it
// lifted.
func TestReaderPreAuth(t *testing.T) {
	bulk := func(n int) string { return "$" + strconv.Itoa(n) + "\r\n" + strings.Repeat("x", n) + "\r\n" }
	for _, tc := range []struct {
		name, in string
		batches  []int // commands per batch
		wantErr  string
	}{
		{"10 arguments", "*10\r\n" + strings.Repeat(bulk(1), 10), []int{1}, ""},
		{"11 arguments", "*11\r\n", nil, "Protocol error: unauthenticated multibulk length"},
		{"16 KB", "*2\r\n$4\r\nECHO\r\n" + bulk(16<<10), []int{1}, ""},
		{"16 KB and a byte", "*2\r\n$4\r\nECHO\r\n$16385\r\n", nil, "Protocol error: unauthenticated bulk length"},
		{"a pipeline, one command at a time", "*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nPING\r\n", []int{1, 1, 1}, ""},
		{"inline", "PING\r\nPING\r\n", []int{1, 1}, ""},
		{"inline, 10 arguments", "ECHO" + strings.Repeat(" a", 9) + "\r\n", []int{1}, ""},
		{"inline, 11 arguments", "ECHO" + strings.Repeat(" a", 10) + "\r\n", nil, "Protocol error: unauthenticated multibulk length"},
		{"inline, 16 KB and a byte", "ECHO " + strings.Repeat("x", 16<<10+1) + "\r\n", nil, "Protocol error: unauthenticated bulk length"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewReader(bytes.NewReader([]byte(tc.in)))
			r.preAuth = true
			var got []int
			for {
				cmds, err := r.ReadBatch()
				if len(cmds) > 0 {
					got = append(got, len(cmds))
				}
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					if err.Error() != tc.wantErr {
						t.Fatalf("err = %v; want %q", err, tc.wantErr)
					}
					break
				}
			}
			if !slices.Equal(got, tc.batches) {
				t.Fatalf("batches of %v commands; want %v", got, tc.batches)
			}
		})
	}

	// Lifted after the first command (an AUTH that succeeded), the rest is
	// read whole and without the caps.
	in := "*2\r\n$4\r\nAUTH\r\n$2\r\npw\r\n*2\r\n$4\r\nECHO\r\n" + bulk(20000) + "*11\r\n" + strings.Repeat(bulk(1), 11)
	r := NewReader(bytes.NewReader([]byte(in)))
	r.preAuth = true
	first, err := r.ReadBatch()
	if err != nil || len(first) != 1 {
		t.Fatalf("first batch = %d commands, %v; want the AUTH alone", len(first), err)
	}
	r.preAuth = false
	var rest [][][]byte
	for {
		cmds, err := r.ReadBatch()
		rest = append(rest, cmds...)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("after AUTH: %v", err)
		}
	}
	if len(rest) != 2 || len(rest[0][1]) != 20000 || len(rest[1]) != 11 {
		t.Fatalf("after AUTH: %d commands; want the 20 KB ECHO and the 11 arguments", len(rest))
	}
}

// chunkReader hands out its input in reads of 1–7 bytes, the sizes taken
// in turn from cuts (one byte at a time without them).
type chunkReader struct {
	b    []byte
	cuts []byte
	i    int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := 1
	if len(r.cuts) > 0 {
		n = int(r.cuts[r.i%len(r.cuts)])%7 + 1
		r.i++
	}
	n = min(n, len(p), len(r.b))
	copy(p, r.b[:n])
	r.b = r.b[n:]
	return n, nil
}

// readAllWith is readAll with the pre-auth caps on or off.
func readAllWith(rd io.Reader, preAuth bool) ([][]string, error) {
	r := NewReader(rd)
	r.preAuth = preAuth
	var out [][]string
	for {
		cmds, err := r.ReadBatch()
		for _, c := range cmds {
			var s []string
			for _, a := range c {
				s = append(s, string(a))
			}
			out = append(out, s)
		}
		if err != nil {
			return out, err
		}
	}
}

// FuzzReaderSplits: however the input is cut into reads, the same
// commands, argument for argument, come out, and a protocol error where
// the whole input has one. It covers the reader resuming a command it
// found incomplete (Reader.part).
func FuzzReaderSplits(f *testing.F) {
	f.Add([]byte("*1\r\n$4\r\nPING\r\n"), []byte{3, 5}, false)
	f.Add([]byte("*3\r\n$4\r\nLOCK\r\n$4\r\ndemo\r\n$5\r\n10000\r\n*1\r\n$4\r\nPING\r\n"), []byte{6, 0, 2}, false)
	f.Add([]byte("ECHO \"a\\x\" 'b'\n*2\r\n$1\r\na\r\n$0\r\n\r\nPING\n"), []byte{1}, true)
	f.Add([]byte("*2\r\n$1\r\na\r\n$x\r\n"), []byte{2}, false)
	f.Fuzz(func(t *testing.T, in, cuts []byte, preAuth bool) {
		whole, werr := readAllWith(bytes.NewReader(in), preAuth)
		split, serr := readAllWith(&chunkReader{b: in, cuts: cuts}, preAuth)
		if IsProtocolError(werr) != IsProtocolError(serr) || fmt.Sprint(whole) != fmt.Sprint(split) {
			t.Fatalf("whole: %q, %v\nsplit: %q, %v", whole, werr, split, serr)
		}
	})
}

// TestReaderResumesManyArgs: a command of many arguments arriving a
// segment at a time reads whole and intact, followed by the next command,
// with a protocol error in the next still reported.
func TestReaderResumesManyArgs(t *testing.T) {
	args := make([]string, 5000)
	for i := range args {
		args[i] = strconv.Itoa(i)
	}
	in := append(encode([][]string{args, {"PING"}}), "*1\r\n$x\r\n"...)
	got, err := readAllWith(&chunkReader{b: in, cuts: []byte{6, 2, 4, 1}}, false)
	if !IsProtocolError(err) {
		t.Errorf("error = %v; want the protocol error at the end", err)
	}
	if len(got) != 2 || fmt.Sprint(got[0]) != fmt.Sprint(args) || fmt.Sprint(got[1]) != "[PING]" {
		t.Fatalf("read %d commands; want the %d-argument one and PING", len(got), len(args))
	}
}

// segmentReader hands out its input in reads of at most n bytes.
type segmentReader struct {
	b []byte
	n int
}

func (r *segmentReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	k := copy(p[:min(len(p), r.n)], r.b)
	r.b = r.b[k:]
	return k, nil
}

// BenchmarkReaderManyArgs reads one command of args one-byte arguments in
// 1,460-byte reads (one TCP segment each). Its time per op grows linearly
// with args: each read resumes the command where the last stopped.
func BenchmarkReaderManyArgs(b *testing.B) {
	for _, n := range []int{25000, 100000, 400000} {
		args := make([]string, n)
		for i := range args {
			args[i] = "x"
		}
		in := encode([][]string{args})
		b.Run("args="+strconv.Itoa(n), func(b *testing.B) {
			b.SetBytes(int64(len(in)))
			for range b.N {
				r := NewReader(&segmentReader{b: in, n: 1460})
				cmds, err := r.ReadBatch()
				if err != nil || len(cmds) != 1 || len(cmds[0]) != n {
					b.Fatalf("read %d commands, %v", len(cmds), err)
				}
			}
		})
	}
}
