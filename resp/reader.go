package resp

import (
	"bytes"
	"errors"
	"io"
)

// Limits on what a client may send, as Redis sets them: a bulk string of at
// most 512 MB (proto-max-bulk-len), a command of at most INT_MAX arguments
// (Redis 7's multibulk cap; 1024*1024 was older Redis's, and a DEL or MSET of
// more arguments runs on Redis 7), and inline commands of 64 KB. Memory
// for the arguments grows as they arrive, never on the header's word.
const (
	MaxBulkLen    = 512 << 20
	MaxArgs       = 1<<31 - 1
	MaxInlineSize = 64 << 10
)

// Before a client has authenticated (when the server requires it), Redis's
// tighter caps hold: at most 10 arguments and 16 KB per argument, so that
// a client that does not know the password cannot make the server buffer
// a 512 MB argument or a million-argument command.
const (
	PreAuthMaxArgs    = 10
	PreAuthMaxBulkLen = 16 << 10
)

// maxBatchCommands caps the commands of one batch. A buffer that a big
// command grew may next hold hundreds of thousands of small ones; run as
// one batch, their replies would all be built before any is written (see
// also the server's maxBatchReply), and on the event loop the other
// clients would wait for all of them.
const maxBatchCommands = 1024

// maxGrowStep bounds how much the read buffer grows ahead of the data.
const maxGrowStep = 1 << 20

// initialReadBuffer is each connection's read buffer until a command needs
// more: lock commands are small, and ten thousand idle clients should cost
// tens of MB, not hundreds.
const initialReadBuffer = 4 << 10

// What a big command grew is given back once it is served: a read buffer
// over maxKeptBuffer, and argument scratch (offsets, the event loop's
// views) for more than maxKeptArgs arguments. A connection that once sent
// a 32 MB value or a million-argument DEL must not keep tens of MB while
// it idles. The bounds let a full batch of ordinary commands reuse its
// memory, so that the hot path does not allocate.
const (
	maxKeptBuffer = 64 << 10
	maxKeptArgs   = 4 * maxBatchCommands
)

// ProtocolError is malformed input; the connection is answered with
// "-ERR Protocol error: …" and closed, as Redis does.
type ProtocolError struct{ Msg string }

func (e *ProtocolError) Error() string { return "Protocol error: " + e.Msg }

var (
	errMultibulkLen = &ProtocolError{"invalid multibulk length"}
	errBulkLen      = &ProtocolError{"invalid bulk length"}
	errInlineSize   = &ProtocolError{"too big inline request"}
	errQuotes       = &ProtocolError{"unbalanced quotes in request"}
	errInlineNUL    = &ProtocolError{"NUL byte in inline request"}
	// Redis's texts for the pre-auth caps.
	errPreAuthArgs = &ProtocolError{"unauthenticated multibulk length"}
	errPreAuthBulk = &ProtocolError{"unauthenticated bulk length"}
)

// Reader reads client commands: RESP arrays of bulk strings, and inline
// commands for people typing into telnet. It hands out whole batches (every
// complete command that arrived together), each in memory of its own, so a
// batch stays valid while the next is read.
type Reader struct {
	rd    io.Reader
	buf   []byte
	start int // first unparsed byte
	end   int // end of the data read
	// scratch for one batch: argument offsets into buf, and per-command
	// argument counts.
	offs   []int
	counts []int
	// need is what the last parseViews said the next command needs.
	need int
	// the event loop's views of one batch, reused (parseViews)
	vargs [][]byte
	vcmds [][][]byte
	// part is how far parseOne got into the command at start when it was
	// incomplete, so that the next parse resumes there instead of reading
	// every argument again: a command of a million arguments arriving a
	// segment at a time would otherwise cost time quadratic in its size.
	part partial
	// preAuth: the client has not authenticated yet; the pre-auth caps
	// hold, and a batch is one command, so that the commands after an AUTH
	// are parsed with the caps it lifts. cut: the last batch stopped
	// there (pre-auth, or maxBatchCommands) with more input buffered.
	preAuth, cut bool
}

// partial is an incomplete multibulk command at Reader.start. Positions
// are from start, which stays valid when fill moves the data.
type partial struct {
	n    int64 // its argument count; 0 when no command is in progress
	next int   // where its next argument's header starts
	offs []int // its complete arguments, start and end of each
}

// NewReader returns a Reader over rd.
func NewReader(rd io.Reader) *Reader {
	return &Reader{rd: rd, buf: make([]byte, initialReadBuffer)}
}

// ReadBatch returns the commands that are complete in the input, reading
// when none is. When the input turns out malformed, it returns the commands
// before the fault together with a *ProtocolError, so their replies can be
// sent before the error.
func (r *Reader) ReadBatch() ([][][]byte, error) {
	for {
		need, perr := r.parse()
		if len(r.counts) > 0 || perr != nil {
			return r.batch(), perr
		}
		if err := r.fill(need); err != nil {
			return nil, err
		}
	}
}

// Buffered is how many bytes are read and not yet handed out.
func (r *Reader) Buffered() int { return r.end - r.start }

// parseViews is ReadBatch without the read, for the event loop: the
// commands complete in what was read so far (none when the next is not
// complete yet), and a *ProtocolError after them when the input is
// malformed. The commands are views of the read buffer, valid until the
// next read; detach copies them into memory of their own.
func (r *Reader) parseViews() ([][][]byte, error) {
	need, err := r.parse()
	r.need = need
	if len(r.counts) == 0 {
		return nil, err
	}
	r.vargs = r.vargs[:0]
	for k := 0; k+1 < len(r.offs); k += 2 {
		a, b := r.offs[k], r.offs[k+1]
		r.vargs = append(r.vargs, r.buf[a:b:b])
	}
	r.vcmds = r.vcmds[:0]
	k := 0
	for _, n := range r.counts {
		r.vcmds = append(r.vcmds, r.vargs[k:k+n:k+n])
		k += n
	}
	return r.vcmds, err
}

// detach copies the commands of the last parseViews, for a batch that
// outlives the next read.
func (r *Reader) detach() [][][]byte {
	cmds := r.batch()
	r.forgetViews()
	return cmds
}

// release ends the event loop's batch once it is served, when no view of
// it is in use any more (ServeLoop keeps none). An idle client on the loop
// is not read again until it sends more, so this, not the next fill, is
// where the memory a big command grew is given back: the views are
// forgotten, so that they keep no old buffer alive, big scratch is
// dropped, and so is a big read buffer when what is left fits a small one.
// The old buffer is replaced, never written to.
func (r *Reader) release() {
	r.forgetViews()
	r.offs, r.counts = r.offs[:0], r.counts[:0]
	r.trim()
	r.shrink(r.need)
}

// forgetViews clears the loop's views of the last batch. Clearing them
// after every batch means no stale view is ever left beyond len, so
// dropping or replacing what they point into frees it. (vcmds, like
// counts, holds at most maxBatchCommands entries: not worth dropping.)
func (r *Reader) forgetViews() {
	clear(r.vargs)
	clear(r.vcmds)
	r.vargs, r.vcmds = r.vargs[:0], r.vcmds[:0]
	if cap(r.vargs) > maxKeptArgs {
		r.vargs = nil
	}
}

// trim drops the argument offsets a big command grew, once its batch is
// served or copied.
func (r *Reader) trim() {
	if cap(r.offs) > 2*maxKeptArgs {
		r.offs = nil
	}
}

// shrink gives back a read buffer that a big command grew, once what is
// buffered and what the command in progress still needs (need) fit a
// small one; a buffer about to be filled by a big command in progress is
// kept. Positions in r.part are from start, so they stay valid.
func (r *Reader) shrink(need int) {
	rest := r.end - r.start
	if len(r.buf) <= maxKeptBuffer || rest+need > initialReadBuffer {
		return
	}
	nb := make([]byte, initialReadBuffer)
	copy(nb, r.buf[r.start:r.end])
	r.buf, r.start, r.end = nb, 0, rest
}

// maxWatchBuffer bounds what a client may pipeline behind a blocked
// command while the reader watches for it to go away.
const maxWatchBuffer = 1 << 20

// watch reads ahead while the connection's command blocks, only to notice
// the peer closing; what it reads stays buffered for ReadBatch. It returns
// the read error that ended it, or nil when the buffer bound is reached.
func (r *Reader) watch() error {
	for r.end-r.start < maxWatchBuffer {
		if err := r.fill(0); err != nil {
			return err
		}
	}
	return nil
}

// fill reads more input, making room for at least need more bytes.
func (r *Reader) fill(need int) error {
	if r.start > 0 {
		copy(r.buf, r.buf[r.start:r.end])
		r.end -= r.start
		r.start = 0
	}
	// Give back a buffer a big command grew before waiting for more: on a
	// goroutine, the read below is where an idle client waits.
	r.shrink(need)
	// Grow towards what the command says it needs, but no faster than the
	// data arrives: a client announcing a 512 MB bulk string gets memory as
	// it sends it, not on the header's word.
	want := r.end + min(max(need, 1), maxGrowStep)
	if want > len(r.buf) {
		nb := make([]byte, max(want, 2*len(r.buf)))
		copy(nb, r.buf[:r.end])
		r.buf = nb
	}
	n, err := r.rd.Read(r.buf[r.end:])
	r.end += n
	if n > 0 {
		return nil
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	return err
}

// parse parses every complete command in buf[start:end], recording offsets.
// It returns how many more bytes the next command needs at least (0 when
// unknown).
func (r *Reader) parse() (int, error) {
	r.offs, r.counts = r.offs[:0], r.counts[:0]
	r.cut = false
	for r.start < r.end {
		if len(r.counts) > 0 && (r.preAuth || len(r.counts) >= maxBatchCommands) {
			r.cut = true
			return 0, nil
		}
		p, need, err := r.parseOne(r.start)
		if err != nil {
			return 0, err
		}
		if p < 0 {
			return need, nil
		}
		r.start = p
	}
	return 0, nil
}

// parseOne parses the command at i (always start). It returns the position
// after it, or -1 when the command is incomplete (with the bytes it still
// needs, if known); then r.part keeps how far it got.
func (r *Reader) parseOne(i int) (next, need int, err error) {
	b := r.buf[:r.end]
	var n int64
	var p int
	rel := r.part.offs[:0]
	if r.part.n > 0 {
		// Resume: the header and the arguments in part were read before.
		n, p, rel = r.part.n, i+r.part.next, r.part.offs
	} else {
		if b[i] != '*' {
			return r.parseInline(i)
		}
		var ok bool
		n, p, ok = readNumber(b, i+1)
		if !ok {
			return -1, 0, nil
		}
		if p < 0 {
			return 0, 0, errMultibulkLen
		}
		if n > MaxArgs {
			return 0, 0, errMultibulkLen
		}
		if r.preAuth && n > PreAuthMaxArgs {
			return 0, 0, errPreAuthArgs
		}
		if n <= 0 {
			return p, 0, nil // an empty command: ignored, as Redis does
		}
	}
	incomplete := func(need int) (int, int, error) {
		r.part = partial{n: n, next: p - i, offs: rel}
		return -1, need, nil
	}
	fail := func(err error) (int, int, error) {
		r.part = partial{offs: rel[:0]}
		return 0, 0, err
	}
	for j := int64(len(rel) / 2); j < n; j++ {
		if p >= len(b) {
			return incomplete(0)
		}
		if b[p] != '$' {
			return fail(&ProtocolError{"expected '$', got '" + printable(b[p]) + "'"})
		}
		size, q, ok := readNumber(b, p+1)
		if !ok {
			return incomplete(0)
		}
		if q < 0 || size < 0 || size > MaxBulkLen {
			return fail(errBulkLen)
		}
		if r.preAuth && size > PreAuthMaxBulkLen {
			return fail(errPreAuthBulk)
		}
		endArg := q + int(size)
		if endArg+2 > len(b) {
			return incomplete(endArg + 2 - len(b))
		}
		if b[endArg] != '\r' || b[endArg+1] != '\n' {
			return fail(errBulkLen)
		}
		rel = append(rel, q-i, endArg-i)
		p = endArg + 2
	}
	for k := 0; k < len(rel); k += 2 {
		r.offs = append(r.offs, i+rel[k], i+rel[k+1])
	}
	if cap(rel) > 4096 {
		rel = nil // a big command's scratch is not kept for the next
	}
	r.part = partial{offs: rel[:0]}
	r.counts = append(r.counts, int(n))
	return p, 0, nil
}

// preAuthCapped is the pre-auth cap error of args, a command read while
// the client was signed in and served after it signed out (RESET): Redis
// reads a command only once the one before it ran, and holds the commands
// after a RESET to the caps. nil when args is within them.
func preAuthCapped(args [][]byte) error {
	if len(args) > PreAuthMaxArgs {
		return errPreAuthArgs
	}
	for _, a := range args {
		if len(a) > PreAuthMaxBulkLen {
			return errPreAuthBulk
		}
	}
	return nil
}

// partCapped is preAuthCapped for the command in progress, as far as it
// came: its argument count, and the arguments complete so far (the next
// one's header is read again, under the caps, when it resumes).
func (r *Reader) partCapped() error {
	p := r.part
	if p.n == 0 {
		return nil
	}
	if p.n > PreAuthMaxArgs {
		return errPreAuthArgs
	}
	for k := 0; k+1 < len(p.offs); k += 2 {
		if p.offs[k+1]-p.offs[k] > PreAuthMaxBulkLen {
			return errPreAuthBulk
		}
	}
	return nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// readNumber reads "<digits>\r\n" at i. ok is false when the line is not
// complete yet; next is -1 when it is not a number.
func readNumber(b []byte, i int) (n int64, next int, ok bool) {
	nl := bytes.IndexByte(b[i:], '\n')
	if nl < 0 {
		if len(b)-i > 32 {
			return 0, -1, true // no number is that long
		}
		return 0, 0, false
	}
	line := b[i : i+nl]
	if len(line) == 0 || line[len(line)-1] != '\r' {
		return 0, -1, true
	}
	v, good := ParseInt(line[:len(line)-1])
	if !good {
		return 0, -1, true
	}
	return v, i + nl + 1, true
}

// parseInline splits a line into arguments as Redis's sdssplitargs does,
// so that an inline command means to the proxy what it means to Redis:
// blanks (isspace) separate arguments; within a word a space, tab or
// carriage return ends it (\v and \f do not), and a quote opens a quoted
// part of the same argument: "…" with C escapes (\xHH, \n, \r, \t, \b,
// \a, \<any>), '…' with only \'. A closing quote must be followed by a
// blank or the end of the line, else the line has unbalanced quotes.
// A line with a NUL byte is refused.
func (r *Reader) parseInline(i int) (int, int, error) {
	b := r.buf[:r.end]
	nl := bytes.IndexByte(b[i:], '\n')
	if nl < 0 {
		if r.end-i > MaxInlineSize {
			return 0, 0, errInlineSize
		}
		return -1, 0, nil
	}
	if nl > MaxInlineSize {
		// The limit holds however the line arrived: whole in one read,
		// or in pieces (checked above while no newline has come).
		return 0, 0, errInlineSize
	}
	lineEnd := i + nl
	next := lineEnd + 1
	if lineEnd > i && b[lineEnd-1] == '\r' {
		lineEnd--
	}
	if bytes.IndexByte(b[i:lineEnd], 0) >= 0 {
		// sdssplitargs would end the line at the NUL and run the part
		// before it: a different command from the one sent. redis-server
		// never runs such a line at all (it looks for the newline with
		// strchr, waits, and fails the connection at 64 KB): refuse it now.
		return 0, 0, errInlineNUL
	}
	mark := len(r.offs)
	unbalanced := func() (int, int, error) {
		r.offs = r.offs[:mark]
		return 0, 0, errQuotes
	}
	// Unquoting rewrites the line in place, which is safe: every byte
	// written consumes at least one read, so w never passes p.
	p := i
	for {
		for p < lineEnd && isSpace(b[p]) {
			p++
		}
		if p >= lineEnd {
			break
		}
		argStart, w := p, p
		var quote byte // the quote of the part p is in; 0 outside quotes
	word:
		for ; ; p++ {
			if p >= lineEnd {
				if quote != 0 {
					return unbalanced()
				}
				break
			}
			c := b[p]
			switch {
			case quote == 0:
				switch c {
				case ' ', '\t', '\r':
					break word
				case '"', '\'':
					quote = c
					continue
				}
			case c == quote:
				if p+1 < lineEnd && !isSpace(b[p+1]) {
					return unbalanced()
				}
				p++
				break word
			case quote == '"' && c == '\\' && p+3 < lineEnd && b[p+1] == 'x' && isHex(b[p+2]) && isHex(b[p+3]):
				c = unhex(b[p+2])<<4 | unhex(b[p+3])
				p += 3
			case quote == '"' && c == '\\' && p+1 < lineEnd:
				p++
				switch c = b[p]; c {
				case 'n':
					c = '\n'
				case 'r':
					c = '\r'
				case 't':
					c = '\t'
				case 'b':
					c = '\b'
				case 'a':
					c = '\a'
				}
			case quote == '\'' && c == '\\' && p+1 < lineEnd && b[p+1] == '\'':
				p++
				c = '\''
			}
			b[w] = c
			w++
		}
		if r.preAuth {
			// The pre-auth caps hold for inline commands too: a 64 KB
			// line can carry thousands of arguments.
			if w-argStart > PreAuthMaxBulkLen {
				r.offs = r.offs[:mark]
				return 0, 0, errPreAuthBulk
			}
			if (len(r.offs)-mark)/2 >= PreAuthMaxArgs {
				r.offs = r.offs[:mark]
				return 0, 0, errPreAuthArgs
			}
		}
		r.offs = append(r.offs, argStart, w)
	}
	if n := (len(r.offs) - mark) / 2; n > 0 {
		r.counts = append(r.counts, n)
	}
	return next, 0, nil
}

// isSpace is C's isspace in the C locale, which sdssplitargs skips
// between arguments.
func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
}

// batch copies the parsed commands out of the read buffer into memory of
// their own: one block for the bytes, one slice for all arguments.
func (r *Reader) batch() [][][]byte {
	if len(r.counts) == 0 {
		return nil
	}
	lo, hi := r.offs[0], r.offs[len(r.offs)-1]
	block := make([]byte, hi-lo)
	copy(block, r.buf[lo:hi])
	args := make([][]byte, len(r.offs)/2)
	for k := range args {
		a, b := r.offs[2*k]-lo, r.offs[2*k+1]-lo
		args[k] = block[a:b:b]
	}
	cmds := make([][][]byte, len(r.counts))
	k := 0
	for c, n := range r.counts {
		cmds[c] = args[k : k+n : k+n]
		k += n
	}
	r.offs, r.counts = r.offs[:0], r.counts[:0]
	r.trim()
	return cmds
}

func printable(c byte) string {
	if c >= ' ' && c <= '~' {
		return string(c)
	}
	return "\\x" + string("0123456789abcdef"[c>>4]) + string("0123456789abcdef"[c&15])
}

// IsProtocolError reports whether err is malformed input.
func IsProtocolError(err error) bool {
	var pe *ProtocolError
	return errors.As(err, &pe)
}
