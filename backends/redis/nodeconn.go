package redis

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/lockproxy/lockproxy/conf"
	"github.com/lockproxy/lockproxy/internal/nbio"
)

// nodeConn is one writer's own connection to its node, for the batches of
// lock operations (see Node.exec). The writer owns it alone, so it needs no
// lock: commands are appended to one buffer, written in one call, and the
// replies read back in order into reusable values. This is the node's hot
// path; go-redis, which the rest of the node uses, costs several
// allocations per command here (a command object, its arguments boxed in
// interfaces, its reply), which under load was a sixth of lockproxy's CPU.
//
// Like go-redis's OnConnect hook before it, every new connection reads
// INFO server before any lock command is sent on it, so a node that
// restarted is known (and quarantined) before a command of ours can reach
// the server that forgot its locks.
type nodeConn struct {
	n    *Node
	nc   net.Conn
	rd   *bufio.Reader
	wbuf []byte
	// rtt is the round trip of the connection's first commands, as its
	// set-up measured it.
	rtt time.Duration
	// id is the connection's client id on the node (CLIENT ID), 0 where
	// it was refused; run is the node's run_id when the connection was
	// made, "" where INFO was refused. A writer that drops the connection
	// with acquires unanswered kills it by id from its next one (see
	// owed), on the same server only.
	id  int64
	run string
	// epoch is the node's data epoch (its epoch key) as the connection's
	// set-up read it; nil where it could not (the key absent after its
	// SET NX was refused, or the GET refused): such a connection checks
	// nothing. Every batch on the connection reads the key again after
	// its commands (see Node.send): another value, or none, means the
	// data its votes stood on was replaced meanwhile.
	epoch []byte
	// until and quiet, while a batch whose latest deadline is past the
	// node timeout is read (see Node.exec): each answer read moves the
	// connection's deadline to quiet from then, up to until.
	until time.Time
	quiet time.Duration
	// late is when reads or writes on the connection were done past
	// their deadline, what the node sent there when lockproxy looked (see
	// lateReads): from the deadline to the look, lockproxy was late, not
	// the node (see Node.exec).
	late *lateness
}

// lateness is what a node connection's socket (see lateReads) found late.
type lateness struct {
	lateSpan
	// rewait, while a batch is written, lets a write made past its
	// deadline (a stop of the process between the batch's setting it and
	// its write) move the read deadline on by as much: the node gets the
	// time the deadline gave it from the write. Not past heard, when set:
	// an acquire's answer must come while the quorum still listens for it
	// (by answeredBy, see quorum's hearOut, and Node.waitedForUs). Before, a batch with an acquire was read as
	// before, only what was there by the deadline: nothing yet, just
	// written, and the batch failed whole, the releases and renewals in
	// it too (an UNLOCK answered NOQUORUM in test/fault's
	// sigstop-lockproxy-short-repeated: a LOCK fans out to every node's
	// writer at once, so a stop catches several between the two).
	rewait bool
	heard  time.Time
}

// stoppedLate is how long after its deadline a call must have come to
// have been held up by a stop of the process, as the quorum's hearOut
// judges its limit (its least node timeout): the runtime wakes a call at
// its deadline within far less, even on a loaded host.
const stoppedLate = 10 * time.Millisecond

// lateSpan is a span of time, from a deadline that passed to when the
// socket was looked at and held what was waited for. Spans that touch are
// joined; a later one replaces an earlier one.
type lateSpan struct{ from, to time.Time }

func (s *lateSpan) add(from, to time.Time) {
	if s.to.IsZero() || from.After(s.to) || from.Before(s.from) {
		s.from = from
	}
	s.to = to
}

// has tells whether t is within s.
func (s *lateSpan) has(t time.Time) bool {
	return !s.to.IsZero() && !t.Before(s.from) && !t.After(s.to)
}

// serverError is an error reply from the node: the node is there and
// refused the command. It satisfies go-redis's Error interface, so
// isServerError sees it as such.
type serverError string

func (e serverError) Error() string { return string(e) }
func (serverError) RedisError()     {}

// reply is one RESP2 reply. Arrays hold their elements in arr; a nil bulk
// string or nil array has null set.
type reply struct {
	kind byte // '+', '-', ':', '$', '*'
	null bool
	n    int64
	s    []byte // valid until the next read
	arr  []reply
	err  error // an error reply, as a serverError
}

// maxReplyElements bounds an array reply: the scripts answer with a few
// elements, or one per release of a batch.
const maxReplyElements = 4096

// connect dials the node and reads INFO server and the connection's
// client id on the new connection.
func (n *Node) connect(ctx context.Context) (*nodeConn, error) {
	return n.connectTracked(ctx, nil)
}

// connectTracked is connect, telling inTLS (when not nil) while the TLS
// handshake is under way: an operation that gives up on the connection
// meanwhile can say why (see writer.get).
func (n *Node) connectTracked(ctx context.Context, inTLS *atomic.Bool) (*nodeConn, error) {
	d := net.Dialer{Timeout: n.dialTimeout}
	nc, err := d.DialContext(ctx, "tcp", n.name)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", n.name, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	// Raw reads and writes: see nbio. Under TLS too, which reads and
	// writes through it. A read that fails at its deadline looks once
	// more at what the socket holds (see lateReads), under TLS too.
	late := new(lateness)
	nc = lateReads(nbio.Wrap(nc), late)
	deadline := time.Now().Add(n.dialTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	// The handshake too: ctx may carry a deadline nothing enforces.
	_ = nc.SetDeadline(deadline)
	if n.tls != nil {
		tc := tls.Client(nc, n.tls)
		// A node that never answers the hello (a plain-text port) fails
		// with a reason that says so, not as a bare timeout.
		if inTLS != nil {
			inTLS.Store(true)
			defer inTLS.Store(false)
		}
		if err := conf.Handshake(ctx, tc); err != nil {
			_ = nc.Close()
			return nil, fmt.Errorf("tls with %s: %w", n.name, err)
		}
		nc = tc
	}
	c := &nodeConn{n: n, nc: nc, rd: bufio.NewReaderSize(nc, 16<<10), wbuf: make([]byte, 0, 16<<10), late: late}
	_ = nc.SetDeadline(deadline)
	auth := n.password != ""
	switch {
	case n.username != "":
		c.add("AUTH", n.username, n.password)
	case auth:
		c.add("AUTH", n.password)
	}
	c.add("INFO", "server")
	c.add("HINCRBY", n.fenceKey, fenceHashPad, "0")
	c.add("CLIENT", "ID")
	// The data epoch: every lockproxy sharing the node reads the same
	// value, until the node's data is replaced (see Node.send).
	c.add("SET", n.epochKey, newEpoch(), "NX")
	c.add("GET", n.epochKey)
	// The scripts batches send by SHA, loaded now: a batch whose script
	// the node does not have yet sends it again after the batch's other
	// commands (Node.exec), after a release of the same key that came in
	// the same batch, which then found nothing to release.
	for _, s := range batchScripts {
		c.add("SCRIPT", "LOAD", s.src)
	}
	sent := time.Now()
	if err := c.flush(); err != nil {
		c.close()
		return nil, err
	}
	if auth {
		var r reply
		if err := c.read(&r); err != nil {
			c.close()
			return nil, err
		}
		if r.err != nil {
			c.close()
			return nil, fmt.Errorf("auth: %w", r.err)
		}
	}
	var info reply
	if err := c.read(&info); err != nil {
		c.close()
		return nil, err
	}
	switch {
	case info.err != nil:
		// INFO denied (an ACL): restarts cannot be seen; say so once.
		n.noInfo(info.err)
	case info.kind == '$' && !info.null:
		si := parseServerInfo(string(info.s))
		c.run = si.runID
		// A restart seen here quarantines the node and forgets its
		// epoch: the one read below is the new server's, no change.
		n.learn(si)
	default:
		c.close()
		return nil, fmt.Errorf("unexpected reply to INFO: %q", info.kind)
	}
	// The pad's answer does not matter: where it is refused (an ACL, a
	// read-only replica) the grants that follow say why.
	if err := c.read(&info); err != nil {
		c.close()
		return nil, err
	}
	if err := c.read(&info); err != nil {
		c.close()
		return nil, err
	}
	switch {
	case info.kind == ':' && info.n > 0:
		c.id = info.n
	case info.err != nil:
		// CLIENT ID denied (an ACL): a LOCK that timed out on this
		// connection cannot have it killed; say so once.
		n.noClientID(info.err)
	}
	// The SET NX's answer matters only where the key is absent: the
	// GET's tells what is there.
	if err := c.read(&info); err != nil {
		c.close()
		return nil, err
	}
	setErr := info.err
	if err := c.read(&info); err != nil {
		c.close()
		return nil, err
	}
	switch {
	case info.kind == '$' && !info.null:
		c.epoch = info.s // a bulk's bytes are its own
		// Another value than the node's last (its data replaced between
		// two connections) quarantines it before any command of ours
		// runs here, as a new run_id does.
		n.learnEpoch(string(c.epoch), true)
	case info.err != nil && transientReply(info.err):
		// The node loads its data, or runs another client's long
		// script: a connection made now would check no epoch for its
		// whole life (a FLUSHALL later unseen by its batches). Its
		// commands could not run either; the next one is made later.
		c.close()
		return nil, fmt.Errorf("%s: epoch: %w", n.name, info.err)
	case info.err != nil:
		n.noEpoch(info.err)
	default:
		// Absent though SET NX ran: refused (a read-only replica, an
		// ACL, maxmemory). The data is not the one the node had if it
		// had one.
		n.learnEpoch("", false)
		if setErr != nil {
			n.noEpoch(setErr)
		}
	}
	c.rtt = time.Since(sent)
	// Their answers do not matter: where SCRIPT LOAD is refused (an ACL)
	// a batch loads a script with EVAL when the node answers NOSCRIPT.
	for range batchScripts {
		if err := c.read(&info); err != nil {
			c.close()
			return nil, err
		}
	}
	return c, nil
}

// fenceHashPad is a field of the fence hash that only keeps it a hash
// table. Redis stores a hash of at most hash-max-listpack-entries (128)
// short fields as one listpack, where HINCRBY scans the fields and moves
// the tail of the list when a value grows a digit: with a hundred slots in
// use that made the grant's HINCRBY cost 8 µs on the node, against half a
// microsecond in a hash table, and a quarter of a node's time per lock.
// A field longer than hash-max-listpack-value (64 bytes) converts the hash
// for good. Its value stays 0, which re-seeding ignores (mergeFences).
const fenceHashPad = "lockproxy:pad:a field longer than 64 bytes keeps this hash a hash table"

func (c *nodeConn) close() { _ = c.nc.Close() }

// transientReply tells an error reply that passes with time (the node
// loading its data, a long script) from a refusal (an ACL).
func transientReply(err error) bool {
	m := err.Error()
	return strings.HasPrefix(m, "LOADING") || strings.HasPrefix(m, "BUSY")
}

// newEpoch is a fresh data epoch: 16 random bytes in hex.
func newEpoch() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// addEpochGet adds the GET of the node's epoch key (see Node.send).
func (c *nodeConn) addEpochGet() {
	c.begin(2)
	c.bulk("GET")
	c.bulk(c.n.epochKey)
}

// readEpoch reads the answer to addEpochGet and tells whether it is the
// connection's epoch. The bytes are compared where the reader holds them:
// a batch's check allocates nothing. When it differs, got is the value
// read (ok false: absent), for the node's record. An error reply (BUSY:
// another client's script runs long; LOADING: a new server behind the
// connection) is unknown: it says nothing about the data, so it is no
// change the node is quarantined for, but no proof of the data either.
func (c *nodeConn) readEpoch() (same bool, got string, ok, unknown bool, err error) {
	same, got, ok, err = c.readEpochReply()
	if errors.Is(err, errEpochReply) {
		return false, "", false, true, nil
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		err = fmt.Errorf("read from %s: %w", c.n.name, err)
	}
	return same, got, ok, false, err
}

// errEpochReply is readEpochReply's error reply to the epoch GET.
var errEpochReply = errors.New("error reply to the epoch GET")

func (c *nodeConn) readEpochReply() (bool, string, bool, error) {
	line, err := c.rd.ReadSlice('\n')
	if err != nil {
		return false, "", false, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return false, "", false, errors.New("malformed reply line")
	}
	line = line[:len(line)-2]
	switch line[0] {
	case '$':
	case '-':
		// An error (BUSY, LOADING, WRONGTYPE): see readEpoch.
		return false, "", false, errEpochReply
	case '+', ':':
		// Not a GET's answer.
		return false, "", false, nil
	default:
		return false, "", false, fmt.Errorf("unexpected reply type %q to GET", line[0])
	}
	size, err := strconv.Atoi(string(line[1:]))
	if err != nil || size < -1 || size > 64<<20 {
		return false, "", false, fmt.Errorf("bad bulk length %q", line[1:])
	}
	if size == -1 {
		return false, "", false, nil
	}
	if size+2 <= c.rd.Size() {
		p, err := c.rd.Peek(size + 2)
		if err != nil {
			return false, "", false, err
		}
		same := bytes.Equal(p[:size], c.epoch)
		var got string
		if !same {
			got = string(p[:size])
		}
		_, _ = c.rd.Discard(size + 2)
		return same, got, true, nil
	}
	buf := make([]byte, size+2)
	if _, err := io.ReadFull(c.rd, buf); err != nil {
		return false, "", false, err
	}
	return false, string(buf[:size]), true, nil
}

// add appends one command; args are strings, []byte or integers.
func (c *nodeConn) add(args ...any) {
	c.wbuf = append(c.wbuf, '*')
	c.wbuf = strconv.AppendInt(c.wbuf, int64(len(args)), 10)
	c.wbuf = append(c.wbuf, '\r', '\n')
	for _, a := range args {
		switch a := a.(type) {
		case string:
			c.bulk(a)
		case int64:
			c.bulkInt(a)
		case int:
			c.bulkInt(int64(a))
		case uint16:
			c.bulkInt(int64(a))
		default:
			panic(fmt.Sprintf("nodeConn.add: argument of type %T", a))
		}
	}
}

// begin starts a command of argc arguments, which follow with bulk and
// bulkInt: the batch path adds its commands without boxing arguments.
func (c *nodeConn) begin(argc int) {
	c.wbuf = append(c.wbuf, '*')
	c.wbuf = strconv.AppendInt(c.wbuf, int64(argc), 10)
	c.wbuf = append(c.wbuf, '\r', '\n')
}

func (c *nodeConn) bulk(s string) {
	c.wbuf = append(c.wbuf, '$')
	c.wbuf = strconv.AppendInt(c.wbuf, int64(len(s)), 10)
	c.wbuf = append(c.wbuf, '\r', '\n')
	c.wbuf = append(c.wbuf, s...)
	c.wbuf = append(c.wbuf, '\r', '\n')
}

// bulk3 writes a+b+c as one bulk string without building it first.
func (c *nodeConn) bulk3(a, b, d string) {
	c.wbuf = append(c.wbuf, '$')
	c.wbuf = strconv.AppendInt(c.wbuf, int64(len(a)+len(b)+len(d)), 10)
	c.wbuf = append(c.wbuf, '\r', '\n')
	c.wbuf = append(c.wbuf, a...)
	c.wbuf = append(c.wbuf, b...)
	c.wbuf = append(c.wbuf, d...)
	c.wbuf = append(c.wbuf, '\r', '\n')
}

func (c *nodeConn) bulkInt(v int64) {
	var b [20]byte
	d := strconv.AppendInt(b[:0], v, 10)
	c.wbuf = append(c.wbuf, '$')
	c.wbuf = strconv.AppendInt(c.wbuf, int64(len(d)), 10)
	c.wbuf = append(c.wbuf, '\r', '\n')
	c.wbuf = append(c.wbuf, d...)
	c.wbuf = append(c.wbuf, '\r', '\n')
}

// bulkIntTail writes v followed by sep and tail as one bulk string
// without building it first.
func (c *nodeConn) bulkIntTail(v int64, sep, tail string) {
	var b [20]byte
	d := strconv.AppendInt(b[:0], v, 10)
	c.wbuf = append(c.wbuf, '$')
	c.wbuf = strconv.AppendInt(c.wbuf, int64(len(d)+len(sep)+len(tail)), 10)
	c.wbuf = append(c.wbuf, '\r', '\n')
	c.wbuf = append(c.wbuf, d...)
	c.wbuf = append(c.wbuf, sep...)
	c.wbuf = append(c.wbuf, tail...)
	c.wbuf = append(c.wbuf, '\r', '\n')
}

// flush writes the commands added so far in one write.
func (c *nodeConn) flush() error {
	if len(c.wbuf) == 0 {
		return nil
	}
	_, err := c.nc.Write(c.wbuf)
	if cap(c.wbuf) > 1<<20 {
		c.wbuf = make([]byte, 0, 16<<10)
	} else {
		c.wbuf = c.wbuf[:0]
	}
	if err != nil {
		return fmt.Errorf("write to %s: %w", c.n.name, err)
	}
	return nil
}

// read reads the next reply into r, reusing r.arr. A transport or protocol
// error leaves the connection unusable: the caller closes it.
func (c *nodeConn) read(r *reply) error {
	if err := c.readReply(r, 0); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("read from %s: %w", c.n.name, err)
	}
	if c.quiet > 0 {
		_ = c.nc.SetDeadline(earlier(c.until, time.Now().Add(c.quiet)))
	}
	return nil
}

func (c *nodeConn) readReply(r *reply, depth int) error {
	line, err := c.rd.ReadSlice('\n')
	if err != nil {
		return err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return errors.New("malformed reply line")
	}
	line = line[:len(line)-2]
	r.kind, r.null, r.n, r.s, r.err = line[0], false, 0, nil, nil
	r.arr = r.arr[:0]
	body := line[1:]
	switch r.kind {
	case '+':
		r.s = body
		if depth > 0 {
			// The next element's read reuses the buffer.
			r.s = append([]byte(nil), body...)
		}
	case '-':
		r.err = serverError(string(body))
	case ':':
		v, err := strconv.ParseInt(string(body), 10, 64)
		if err != nil {
			return fmt.Errorf("bad integer reply %q", body)
		}
		r.n = v
	case '$':
		size, err := strconv.Atoi(string(body))
		if err != nil || size < -1 || size > 64<<20 {
			return fmt.Errorf("bad bulk length %q", body)
		}
		if size == -1 {
			r.null = true
			return nil
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(c.rd, buf); err != nil {
			return err
		}
		r.s = buf[:size]
	case '*':
		size, err := strconv.Atoi(string(body))
		if err != nil || size < -1 || size > maxReplyElements || depth > 4 {
			return fmt.Errorf("bad array reply %q", body)
		}
		if size == -1 {
			r.null = true
			return nil
		}
		if cap(r.arr) < size {
			r.arr = make([]reply, size)
		}
		r.arr = r.arr[:size]
		for i := range r.arr {
			if err := c.readReply(&r.arr[i], depth+1); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("unexpected reply type %q", r.kind)
	}
	return nil
}

// nodeTLS is base for the node at addr: its ServerName, unless set, is
// addr's host, for the verifier of a reloadable CA file too
// (conf.WithServerName). nil without TLS.
func nodeTLS(base *tls.Config, addr string) *tls.Config {
	host, _, _ := net.SplitHostPort(addr)
	return conf.WithServerName(base, host)
}
