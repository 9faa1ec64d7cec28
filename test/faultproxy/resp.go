package faultproxy

import (
	"bytes"
	"math"
	"strconv"
	"strings"
	"time"

	lpredis "github.com/lockproxy/lockproxy/backends/redis"
	"github.com/lockproxy/lockproxy/relay"
)

// leaseScripts maps the SHA1s (lower case) and sources of lockproxy's lock
// scripts whose ARGV[2] is a lease in ms to true, so that FastClock can
// scale the lease in their EVALSHA and EVAL.
var leaseScripts = func() map[string]bool {
	m := map[string]bool{}
	for _, s := range lpredis.LeaseScripts() {
		m[s.SHA], m[s.Src] = true, true
	}
	return m
}()

// respFramer splits a client→server byte stream into whole commands, so
// that FastClock can rewrite them. A stream that is not RESP (or a frame
// it cannot parse) is passed on unchanged from there on.
type respFramer struct {
	pending []byte
	raw     bool
	// onCommand, when set, hears of each command framed (time: it is
	// TIME), or of the stream turning raw (raw).
	onCommand func(time, raw bool)
}

// feed appends b and returns the bytes to forward now: every whole
// command, rewritten for rate if rate > 1. An incomplete command is held
// until the rest of it arrives.
func (f *respFramer) feed(b []byte, rate float64) []byte {
	if f.raw {
		return b
	}
	f.pending = append(f.pending, b...)
	var out []byte
	for len(f.pending) > 0 {
		args, n, ok := parseCommand(f.pending)
		if !ok {
			// Not RESP we understand: give up parsing for this stream.
			f.raw = true
			if f.onCommand != nil {
				f.onCommand(false, true)
			}
			out = append(out, f.pending...)
			f.pending = nil
			return out
		}
		if n == 0 {
			break // incomplete
		}
		frame := f.pending[:n]
		if f.onCommand != nil {
			f.onCommand(len(args) == 1 && strings.EqualFold(string(args[0]), "TIME"), false)
		}
		if args != nil && rate > 1 && rewrite(args, rate) {
			out = relay.AppendCommand(out, args)
		} else {
			out = append(out, frame...)
		}
		f.pending = f.pending[n:]
	}
	if len(f.pending) == 0 {
		f.pending = nil
	} else {
		f.pending = append([]byte(nil), f.pending...)
	}
	return out
}

// parseCommand parses one command at the start of b: a RESP array of bulk
// strings (args set), or an inline command line (args nil). n is the
// frame's length, 0 if b holds only part of it; ok is false if b does not
// start with something a Redis server would parse as a command.
func parseCommand(b []byte) (args [][]byte, n int, ok bool) {
	if b[0] != '*' {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return nil, 0, len(b) < 64*1024
		}
		return nil, i + 1, true
	}
	count, pos, ok := parseLen(b, 1)
	if !ok || pos == 0 {
		return nil, 0, ok
	}
	if count < 0 || count > 1024*1024 {
		return nil, 0, false
	}
	args = make([][]byte, 0, count)
	for range count {
		if pos >= len(b) {
			return nil, 0, true
		}
		if b[pos] != '$' {
			return nil, 0, false
		}
		l, next, ok := parseLen(b, pos+1)
		if !ok || next == 0 {
			return nil, 0, ok
		}
		if l < 0 || l > 512*1024*1024 {
			return nil, 0, false
		}
		end := next + int(l)
		if end+2 > len(b) {
			return nil, 0, true
		}
		if b[end] != '\r' || b[end+1] != '\n' {
			return nil, 0, false
		}
		args = append(args, b[next:end])
		pos = end + 2
	}
	return args, pos, true
}

// parseLen parses the decimal number at b[i:] up to CRLF and returns it and
// the position after the CRLF (0 if the line is incomplete).
func parseLen(b []byte, i int) (int64, int, bool) {
	j := bytes.Index(b[i:], []byte("\r\n"))
	if j < 0 {
		return 0, 0, len(b)-i < 32
	}
	v, err := strconv.ParseInt(string(b[i:i+j]), 10, 64)
	if err != nil {
		return 0, 0, false
	}
	return v, i + j + 2, true
}

// scaleMS returns ms/rate, rounded down, at least 1, as RESP text; ok is
// false if v is not a positive integer.
func scaleMS(v []byte, perUnit int64, rate float64) ([]byte, bool) {
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil || n <= 0 || n > math.MaxInt64/max(perUnit, 1) {
		return nil, false
	}
	ms := int64(float64(n*perUnit) / rate)
	return strconv.AppendInt(nil, max(ms, 1), 10), true
}

// rewrite scales the TTLs in args in place for rate and reports whether it
// changed anything.
func rewrite(args [][]byte, rate float64) bool {
	if len(args) == 0 {
		return false
	}
	changed := false
	switch strings.ToUpper(string(args[0])) {
	case "SET":
		// SET key value [NX|XX] [GET] [EX s|PX ms|EXAT|PXAT|KEEPTTL]
		for i := 3; i+1 < len(args); i++ {
			switch strings.ToUpper(string(args[i])) {
			case "PX":
				if v, ok := scaleMS(args[i+1], 1, rate); ok {
					args[i+1], changed = v, true
				}
				i++
			case "EX":
				if v, ok := scaleMS(args[i+1], 1000, rate); ok {
					args[i], args[i+1], changed = []byte("PX"), v, true
				}
				i++
			}
		}
	case "PSETEX": // PSETEX key ms value
		if len(args) == 4 {
			if v, ok := scaleMS(args[2], 1, rate); ok {
				args[2], changed = v, true
			}
		}
	case "SETEX": // SETEX key s value
		if len(args) == 4 {
			if v, ok := scaleMS(args[2], 1000, rate); ok {
				args[0], args[2], changed = []byte("PSETEX"), v, true
			}
		}
	case "PEXPIRE": // PEXPIRE key ms [NX|XX|GT|LT]
		if len(args) >= 3 {
			if v, ok := scaleMS(args[2], 1, rate); ok {
				args[2], changed = v, true
			}
		}
	case "EXPIRE": // EXPIRE key s [NX|XX|GT|LT]
		if len(args) >= 3 {
			if v, ok := scaleMS(args[2], 1000, rate); ok {
				args[0], args[2], changed = []byte("PEXPIRE"), v, true
			}
		}
	case "EVALSHA", "EVAL":
		// EVAL[SHA] script numkeys key… arg…: the lease is ARGV[2].
		if len(args) >= 3 && leaseScripts[strings.ToLower(string(args[1]))] || len(args) >= 3 && leaseScripts[string(args[1])] {
			if nk, err := strconv.Atoi(string(args[2])); err == nil && nk >= 0 {
				if i := 3 + nk + 1; i < len(args) {
					if v, ok := scaleMS(args[i], 1, rate); ok {
						args[i], changed = v, true
					}
				}
			}
		}
	}
	return changed
}

// sent notes a command sent to the server (see link.times).
func (l *link) sent(isTime, raw bool) {
	l.tmu.Lock()
	defer l.tmu.Unlock()
	if raw {
		l.untracked = true
		l.times = nil
		return
	}
	if !l.untracked {
		l.times = append(l.times, isTime)
	}
}

// replied pops the oldest command sent and reports whether it was TIME.
// A reply with no command (a pub/sub message) pops nothing.
func (l *link) replied() bool {
	l.tmu.Lock()
	defer l.tmu.Unlock()
	if l.untracked || len(l.times) == 0 {
		return false
	}
	t := l.times[0]
	l.times = l.times[1:]
	return t
}

// replyFramer splits the server→client stream into replies and, under
// FastClock, rewrites TIME's.
type replyFramer struct {
	l       *link
	pending []byte
	raw     bool
}

func (f *replyFramer) feed(b []byte, st state) []byte {
	if f.raw {
		return b
	}
	f.pending = append(f.pending, b...)
	var out []byte
	for len(f.pending) > 0 {
		n, err := relay.FrameEnd(f.pending)
		if err != nil {
			f.raw = true
			out = append(out, f.pending...)
			f.pending = nil
			return out
		}
		if n == 0 {
			break
		}
		frame := f.pending[:n]
		if f.l.replied() && st.mode == FastClock && st.rate > 1 {
			if t, ok := fastTime(frame, st); ok {
				frame = t
			}
		}
		out = append(out, frame...)
		f.pending = f.pending[n:]
	}
	f.pending = append([]byte(nil), f.pending...)
	return out
}

// fastTime rewrites a TIME reply (*2 of seconds and microseconds) to run
// st.rate times fast since st.since.
func fastTime(frame []byte, st state) ([]byte, bool) {
	_, elems, ok := relay.Split(frame)
	if !ok || len(elems) != 2 {
		return nil, false
	}
	secs, ok1 := relay.Text(elems[0])
	usecs, ok2 := relay.Text(elems[1])
	if !ok1 || !ok2 {
		return nil, false
	}
	s, err1 := strconv.ParseInt(string(secs), 10, 64)
	us, err2 := strconv.ParseInt(string(usecs), 10, 64)
	if err1 != nil || err2 != nil {
		return nil, false
	}
	t := s*1_000_000 + us + int64(float64(time.Since(st.since).Microseconds())*(st.rate-1))
	return relay.AppendCommand(nil, [][]byte{
		[]byte(strconv.FormatInt(t/1_000_000, 10)),
		[]byte(strconv.FormatInt(t%1_000_000, 10)),
	}), true
}
