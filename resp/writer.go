package resp

import (
	"strconv"
	"strings"
)

// Writer appends RESP2 or RESP3 frames to a buffer. Aggregate types that
// RESP2 lacks fall back the way Redis does: a map becomes a flat array of
// key, value pairs, a push an array, null "$-1".
type Writer struct {
	b     []byte
	proto int
	// resets counts Reset calls: what a caller noted of the buffer (an
	// offset) before a Reset says nothing of it after (Resets).
	resets uint64
}

// NewWriter returns a RESP2 writer.
func NewWriter() *Writer { return &Writer{proto: 2, b: make([]byte, 0, 4096)} }

// Proto is 2 or 3.
func (w *Writer) Proto() int { return w.proto }

// SetProto switches the protocol for replies written from now on.
func (w *Writer) SetProto(p int) { w.proto = p }

// Bytes returns what was written since the last Reset.
func (w *Writer) Bytes() []byte { return w.b }

// maxKeptReply is the reply buffer memory a Writer keeps across Reset: a
// full batch (maxBatchCommands) of lock replies, about 90 bytes each,
// reuses it, so that the hot path does not allocate; what one big reply
// (a large value, COMMAND DOCS) grew is given back once it is written, as
// the read buffer (maxKeptBuffer) and the output buffer (maxKeptOutput)
// give theirs back, so that a connection idling after it does not keep
// it.
const maxKeptReply = 128 << 10

// Reset empties the buffer, keeping its memory unless it grew large.
func (w *Writer) Reset() {
	w.resets++
	if cap(w.b) > maxKeptReply {
		w.b = make([]byte, 0, 4096)
		return
	}
	w.b = w.b[:0]
}

// Len is the number of bytes buffered.
func (w *Writer) Len() int { return len(w.b) }

// Resets is how many times the buffer was Reset: flushed to the client
// (Session.Flush), or rebuilt by a caller that inserts or takes out
// replies. An offset noted with Len stands for the same reply only while
// Resets stays the same.
func (w *Writer) Resets() uint64 { return w.resets }

func (w *Writer) header(c byte, n int64) {
	w.b = append(w.b, c)
	w.b = strconv.AppendInt(w.b, n, 10)
	w.b = append(w.b, '\r', '\n')
}

// Simple writes a status reply such as +OK. Line breaks are replaced.
func (w *Writer) Simple(s string) {
	w.b = append(w.b, '+')
	w.b = appendLine(w.b, s)
}

// Error writes an error reply; s starts with its code ("ERR …").
func (w *Writer) Error(s string) {
	w.b = append(w.b, '-')
	w.b = appendLine(w.b, s)
}

func appendLine(b []byte, s string) []byte {
	if strings.ContainsAny(s, "\r\n") {
		s = strings.NewReplacer("\r", " ", "\n", " ").Replace(s)
	}
	b = append(b, s...)
	return append(b, '\r', '\n')
}

// Int writes an integer reply.
func (w *Writer) Int(n int64) { w.header(':', n) }

// Uint writes an integer reply from an unsigned value.
func (w *Writer) Uint(n uint64) {
	w.b = append(w.b, ':')
	w.b = strconv.AppendUint(w.b, n, 10)
	w.b = append(w.b, '\r', '\n')
}

// Bulk writes a bulk string.
func (w *Writer) Bulk(p []byte) {
	w.header('$', int64(len(p)))
	w.b = append(w.b, p...)
	w.b = append(w.b, '\r', '\n')
}

// BulkString writes a bulk string.
func (w *Writer) BulkString(s string) {
	w.header('$', int64(len(s)))
	w.b = append(w.b, s...)
	w.b = append(w.b, '\r', '\n')
}

// Null writes the null reply: "_" in RESP3, a null bulk in RESP2.
func (w *Writer) Null() {
	if w.proto == 3 {
		w.b = append(w.b, '_', '\r', '\n')
		return
	}
	w.b = append(w.b, "$-1\r\n"...)
}

// NullArray writes a null array in RESP2 ("*-1"), null in RESP3.
func (w *Writer) NullArray() {
	if w.proto == 3 {
		w.b = append(w.b, '_', '\r', '\n')
		return
	}
	w.b = append(w.b, "*-1\r\n"...)
}

// Array writes an array header of n elements.
func (w *Writer) Array(n int) { w.header('*', int64(n)) }

// Map writes a map header of n pairs (RESP2: an array of 2n elements).
func (w *Writer) Map(n int) {
	if w.proto == 3 {
		w.header('%', int64(n))
		return
	}
	w.header('*', int64(2*n))
}

// Set writes a set header (RESP2: an array).
func (w *Writer) Set(n int) {
	if w.proto == 3 {
		w.header('~', int64(n))
		return
	}
	w.header('*', int64(n))
}

// Push writes a push header (RESP2: an array, as Redis sends pub/sub).
func (w *Writer) Push(n int) {
	if w.proto == 3 {
		w.header('>', int64(n))
		return
	}
	w.header('*', int64(n))
}

// Bool writes a boolean (RESP2: 1 or 0).
func (w *Writer) Bool(v bool) {
	if w.proto == 3 {
		if v {
			w.b = append(w.b, "#t\r\n"...)
		} else {
			w.b = append(w.b, "#f\r\n"...)
		}
		return
	}
	if v {
		w.Int(1)
	} else {
		w.Int(0)
	}
}

// Verbatim writes a verbatim string of format "txt" (RESP2: a bulk string),
// as Redis does for INFO and CLIENT INFO.
func (w *Writer) Verbatim(s string) {
	if w.proto == 3 {
		w.header('=', int64(len(s)+4))
		w.b = append(w.b, "txt:"...)
		w.b = append(w.b, s...)
		w.b = append(w.b, '\r', '\n')
		return
	}
	w.BulkString(s)
}

// Raw appends pre-encoded RESP.
func (w *Writer) Raw(p []byte) { w.b = append(w.b, p...) }
