package relay

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lockproxy/lockproxy/internal/deadline"
	"github.com/lockproxy/lockproxy/internal/nbio"
)

// call collects the replies to one client's batch of requests. Only the
// connection's reader appends to buf until it signals done, or hands buf
// to deliver when that is set (CollectAsync).
type call struct {
	buf     []byte
	n       int // replies still to come
	done    chan struct{}
	deliver func([]byte)
}

// finish hands the complete replies on: to deliver, on the goroutine that
// completed them, or to the client goroutine waiting on done.
func (cl *call) finish() {
	if cl.deliver != nil {
		cl.deliver(cl.buf)
		return
	}
	cl.done <- struct{}{}
}

func newCall() *call { return &call{done: make(chan struct{}, 1)} }

// upConn is one upstream connection. Writers append requests under mu and
// the first of them writes for everyone who queued meanwhile (one write per
// batch, no goroutine hand-off); one reader goroutine cuts the reply stream
// into frames and hands each to the call waiting for it, in order.
type upConn struct {
	nc          net.Conn
	proto       int
	db          int
	readTimeout time.Duration
	// push receives out-of-band frames (RESP3 pushes, and every frame in
	// tunnel mode) on a pinned connection; nil on shared ones. It changes
	// when a pinned connection changes hands, while the reader runs.
	push atomic.Pointer[func([]byte)]
	// lost runs when a pinned connection fails by itself (not closed by
	// lockproxy): the client's state on it is gone.
	lost atomic.Pointer[func()]
	// stale, when set, is marked when the connection fails by itself: the
	// relay then reads the upstream's command table again.
	stale *atomic.Bool
	// id is the upstream's id of a connection dialed for pinning (CLIENT
	// ID, asked in the handshake), 0 for a shared one or when the upstream
	// refused to tell. Set before the connection is handed out.
	id int64
	// named: another client named it upstream by its id (Relay.Named),
	// so it never goes back to the idle list.
	named atomic.Bool
	// redirs counts the tracking redirections that name it (Named with
	// NameRedirect, less those Redis refused: Unredirect); while any
	// does, its client keeps it (Pipe.RedirectTarget). A count, not a
	// flag: one redirection refused must not take back another's.
	redirs atomic.Int32

	mu      sync.Mutex
	wbuf    []byte
	spare   []byte
	writing bool
	calls   []*call
	head    int
	err     error // set once the connection failed
	timed   bool  // a read deadline is armed for an outstanding call
	// armed is when the read deadline was last set: it is moved at most
	// every rearmEvery, not on every request (timer updates cost on the
	// hot path), so a reply may time out up to rearmEvery early.
	armed     time.Time
	wdeadline deadline.Write
	raw       syscall.RawConn // nc's, for the event loop's non-blocking writes
	// The event loop's write, made once: a method value or closure made
	// per round would allocate on the relay's hot path. rawBuf, rawN and
	// rawErr belong to the one writer (writing set).
	flushLoopFn func()
	rawWriteFn  func(fd uintptr) bool
	rawBuf      []byte
	rawN        int
	rawErr      error
	rd          *nbio.Reader // raw reads, when nc is a socket

	// tunnel: every frame goes to push (pub/sub, MONITOR), until a
	// marker reply finds no subscription left.
	tunnel atomic.Bool
	// tunneled: the connection was in tunnel mode at some time. It never
	// goes back to the idle list: the subscription count that ends the
	// mode comes from frames the upstream sends, and a client could make
	// one (a script's reply shaped like an unsubscribe confirmation),
	// which left a connection still subscribed to the client's channels
	// to the next client (see release).
	tunneled atomic.Bool
	// monitor: the tunnel is MONITOR's. Its mode has no subscription to
	// count down, so a marker reply never ends it (only RESET does), and
	// the feed names every command, the marker PINGs too: fedMarkers are
	// those markers (under mu), whose feed lines are lockproxy's, not the
	// client's, and are dropped. Each leaves the list with its line; a
	// line that never comes (a connection failing) leaves a stale entry,
	// so the list is bounded.
	monitor    atomic.Bool
	fedMarkers [][]byte
	// monitorAsked: MONITOR was sent and its reply has not come. One
	// the upstream refuses (an ACL) starts no feed: the tunnel then ends
	// at the next marker, as after a refused SUBSCRIBE.
	monitorAsked atomic.Bool
	// reserved is the lock key prefix: keyspace notifications about keys
	// under it are not passed on (see revealsReserved).
	reserved   []byte
	marker     []byte
	markerDone chan bool
	subs       int64 // channels + patterns, from the last (un)subscribe frame
	shardSubs  int64
	// resetting: a RESET of a connection kept through its client's RESET
	// is under way (Pipe.Reset); under mu. resetSent: frames are still
	// the client's (messages sent before the RESET); resetAnswered: the
	// upstream's +RESET came, and the resetLeft replies after it are the
	// sign-in's and the marker PING's, not the client's; resetRefused:
	// RESET or one of those was refused.
	resetting byte
	resetLeft int

	rbuf       []byte
	start, end int
	closed     chan struct{}

	// The event loop keeps one batch in flight (see queue): enq counts
	// the calls queued, written those whose requests went to the socket
	// (under mu), answered those whose replies came in (by the reader),
	// and deferred says requests wait for the batch in flight.
	enq, written int64
	answered     atomic.Int64
	deferred     atomic.Bool
	// The gate holds only where the upstream answers fast: a request
	// held back waits at most about one round trip. sentAt is when the
	// last batch was taken (ns since clockBase) and batchFirst the number
	// of its first call; rtt is a moving average of the time from a
	// batch's write to its first reply (the last would count Redis's
	// work on the whole batch, which grows with the batches the gate
	// makes); gateOn follows it with hysteresis.
	sentAt     atomic.Int64
	batchFirst atomic.Int64
	rtt        atomic.Int64
	gateOn     atomic.Bool
}

// gateMaxRTT is the round trip past which requests no longer wait for the
// batch in flight: holding one back would cost its client more than the
// fewer, larger writes save. The gate opens again under gateMinRTT.
// A sample counts for at most rttSampleCap, so that one slow command
// (a big KEYS, DEBUG SLEEP) keeps the gate off for a few batches, not
// for as many as its length would take to average out.
const (
	gateMaxRTT   = 500 * time.Microsecond
	gateMinRTT   = 250 * time.Microsecond
	rttSampleCap = 4 * gateMaxRTT
)

var clockBase = time.Now()

func newUpConn(nc net.Conn, proto, db int, readTimeout time.Duration) *upConn {
	var raw syscall.RawConn
	// Without nbio's raw calls (Windows) raw stays nil: the upstream is
	// written and read through nc, as a TLS one is.
	if sc, ok := nc.(syscall.Conn); ok && nbio.Raw {
		raw, _ = sc.SyscallConn()
	}
	c := &upConn{
		nc: nc, raw: raw, proto: proto, db: db, readTimeout: readTimeout,
		rbuf:       make([]byte, 16<<10),
		closed:     make(chan struct{}),
		markerDone: make(chan bool, 1),
	}
	c.gateOn.Store(true)
	c.flushLoopFn = c.flushLoop
	if raw != nil {
		c.rd = nbio.NewReader(raw, nc.LocalAddr(), nc.RemoteAddr())
	}
	c.rawWriteFn = func(fd uintptr) bool {
		c.rawN, c.rawErr = nbio.Write(int(fd), c.rawBuf)
		return true // one attempt: never wait for the socket
	}
	return c
}

// failed returns the error the connection died of, or nil.
func (c *upConn) failed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// send queues req; cl (nil in tunnel mode) gets the replies. timed arms the
// read timeout for them (not for blocking commands).
func (c *upConn) send(req []byte, cl *call, timed bool) error {
	c.mu.Lock()
	if err := c.enqueueLocked(req, cl, timed); err != nil {
		c.mu.Unlock()
		return err
	}
	if c.writing {
		c.mu.Unlock()
		return nil
	}
	c.writing = true
	// Let the clients about to queue join this write: one write for many
	// clients' requests costs the upstream one read instead of many.
	c.mu.Unlock()
	runtime.Gosched()
	c.mu.Lock()
	c.writeQueuedLocked()
	return nil
}

// queue is send for the event loop, which must not wait for the upstream's
// socket: req is queued, and when no write is under way the first queuer
// has later run flushLoop once the loop has served every ready client, so
// that their requests go out in one write.
func (c *upConn) queue(req []byte, cl *call, later func(func())) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.enqueueLocked(req, cl, true); err != nil {
		return err
	}
	if !c.writing {
		if c.written > c.answered.Load() && c.gateOn.Load() {
			// A batch is in flight: these requests go out when its
			// replies are in (the reader sends them). Under load that
			// makes the batches, and so the writes and reads on both
			// sides, several times fewer; Redis would make the requests
			// wait behind that batch anyway. Marked before the second
			// look, so that the reader, counting the last reply after
			// it, sees the mark.
			c.deferred.Store(true)
			if c.written > c.answered.Load() {
				return nil
			}
			c.deferred.Store(false)
		}
		c.writing = true
		later(c.flushLoopFn)
	}
	return nil
}

// flushLoop writes what is queued with non-blocking writes, on the event
// loop; what the socket does not take at once a goroutine writes.
func (c *upConn) flushLoop() {
	c.mu.Lock()
	for len(c.wbuf) > 0 {
		buf := c.wbuf
		c.wbuf = c.spare[:0]
		c.taken()
		c.mu.Unlock()
		n, err := c.writeOnce(buf)
		c.mu.Lock()
		if err != nil {
			c.writing = false
			c.mu.Unlock()
			c.fail(fmt.Errorf("write: %w", err))
			return
		}
		if n < len(buf) {
			// The socket is full: the rest goes first, then whatever was
			// queued meanwhile.
			c.wbuf = append(buf[n:], c.wbuf...)
			c.mu.Unlock()
			go func() {
				c.mu.Lock()
				c.writeQueuedLocked()
			}()
			return
		}
		if cap(buf) <= 1<<20 {
			c.spare = buf[:0]
		} else {
			c.spare = nil // c.wbuf may be the old spare: never both one array
		}
	}
	c.writing = false
	c.mu.Unlock()
}

// taken notes, under c.mu, that a writer took the whole write buffer:
// every call queued so far is in flight, and nothing waits any more.
func (c *upConn) taken() {
	if c.enq != c.written {
		// sentAt before batchFirst: a reader that sees this batch's
		// first call number sees its time too.
		c.sentAt.Store(int64(time.Since(clockBase)))
		c.batchFirst.Store(c.written + 1)
	}
	c.written = c.enq
	c.deferred.Store(false)
}

// seedRTT starts the round-trip estimate at d (the dial's), so that the
// first batches behind a distant upstream are not held back.
func (c *upConn) seedRTT(d time.Duration) {
	d = min(max(d, 0), rttSampleCap)
	c.rtt.Store(int64(d))
	c.gateOn.Store(d < gateMaxRTT)
}

// sampleRTT is the reader's: call number n was just answered. When it was
// the first of the last batch taken, the time since that batch's write is
// a round-trip sample.
func (c *upConn) sampleRTT(n int64) {
	sent := c.sentAt.Load()
	if n != c.batchFirst.Load() {
		return
	}
	// A batch taken between the two loads has a later first call, so a
	// match means sent is this batch's time (taken stores it first).
	d := min(max(int64(time.Since(clockBase))-sent, 0), int64(rttSampleCap))
	old := c.rtt.Load()
	rtt := old + (d-old)/8
	c.rtt.Store(rtt)
	switch {
	case rtt >= int64(gateMaxRTT):
		c.gateOn.Store(false)
	case rtt < int64(gateMinRTT):
		c.gateOn.Store(true)
	}
}

// sendDeferred sends the requests the event loop queued behind the batch
// in flight, once that batch is answered, from the reader: with a
// non-blocking write, as the loop would (a reader that blocked on a write
// to a Redis blocked on writing its replies would wait forever).
func (c *upConn) sendDeferred() {
	c.mu.Lock()
	if !c.deferred.Load() || c.writing || c.answered.Load() < c.written {
		c.mu.Unlock()
		return
	}
	c.writing = true
	c.mu.Unlock()
	c.flushLoop()
}

// writeOnce is one non-blocking write attempt of b.
func (c *upConn) writeOnce(b []byte) (int, error) {
	if c.raw == nil {
		return 0, nil
	}
	// An old deadline would fail the attempt; this is the only writer.
	c.wdeadline.Arm(c.nc, writeTimeout)
	c.rawBuf, c.rawN, c.rawErr = b, 0, nil
	err := c.raw.Write(c.rawWriteFn)
	n, werr := c.rawN, c.rawErr
	c.rawBuf = nil
	switch {
	case err != nil:
		return 0, err
	case werr == syscall.EAGAIN || werr == syscall.EINTR:
		return max(n, 0), nil
	case werr != nil:
		return 0, werr
	}
	return n, nil
}

// enqueueLocked adds req to the write buffer and cl to the calls waiting
// for replies; under c.mu.
func (c *upConn) enqueueLocked(req []byte, cl *call, timed bool) error {
	if c.err != nil {
		return c.err
	}
	c.wbuf = append(c.wbuf, req...)
	if cl != nil {
		c.enq++
		c.calls = append(c.calls, cl)
		switch {
		case timed && c.readTimeout > 0:
			if now := time.Now(); !c.timed || now.Sub(c.armed) > rearmEvery(c.readTimeout) {
				c.timed, c.armed = true, now
				_ = c.nc.SetReadDeadline(now.Add(c.readTimeout))
			}
		case !timed && c.timed:
			// A blocking command may wait as long as it says.
			c.timed = false
			_ = c.nc.SetReadDeadline(time.Time{})
		}
	}
	return nil
}

// writeQueuedLocked writes the buffer until it stays empty, then ends the
// write under way; it is called with c.mu held, and returns without it.
func (c *upConn) writeQueuedLocked() {
	for len(c.wbuf) > 0 {
		buf := c.wbuf
		c.wbuf = c.spare[:0]
		c.taken()
		c.mu.Unlock()
		c.wdeadline.Arm(c.nc, writeTimeout)
		_, err := c.nc.Write(buf)
		c.mu.Lock()
		if cap(buf) <= 1<<20 {
			c.spare = buf[:0]
		} else {
			c.spare = nil
		}
		if err != nil {
			c.writing = false
			c.mu.Unlock()
			c.fail(fmt.Errorf("write: %w", err)) // the calls queued get the error
			return
		}
	}
	c.writing = false
	c.mu.Unlock()
}

// rearmEvery is how stale a read deadline may get: a tenth of the timeout,
// at most a second.
func rearmEvery(timeout time.Duration) time.Duration { return min(timeout/10, time.Second) }

// writeTimeout bounds one write to the upstream; a Redis that accepts no
// input for this long is treated as down.
const writeTimeout = 10 * time.Second

// fail ends the connection: every call still waiting gets err as the reply
// to each of its outstanding requests, in order.
func (c *upConn) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	calls := c.calls[c.head:]
	c.calls, c.head = nil, 0
	c.mu.Unlock()
	_ = c.nc.Close()
	if lost := c.lost.Load(); lost != nil && err != errClosed {
		// Before the calls get their answers: the hook reads the
		// client's state (commands: whether the connection held only
		// WAIT's count), which the client goroutine, woken by them,
		// changes as it takes the loss in.
		(*lost)()
	}
	if c.stale != nil && err != errClosed {
		c.stale.Store(true)
	}
	msg := unavailable(err)
	for _, cl := range calls {
		for ; cl.n > 0; cl.n-- {
			cl.buf = appendError(cl.buf, msg)
		}
		cl.finish()
	}
	select {
	case c.markerDone <- false:
	default:
	}
}

func unavailable(err error) string {
	return "ERR upstream unavailable: " + err.Error()
}

// close drops the connection; waiting calls get an error.
func (c *upConn) close() { c.fail(errClosed) }

var errClosed = errors.New("connection closed by lockproxy")

// readLoop delivers every reply frame until the connection fails.
func (c *upConn) readLoop() {
	defer close(c.closed)
	var cur *call
	for {
		f, err := c.next()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			c.mu.Lock()
			if cur == nil && c.head == len(c.calls) {
				// Nothing waits: the deadline was armed for replies that
				// came since. Disarm it under mu, so that a new call's
				// deadline is not lost.
				c.timed = false
				_ = c.nc.SetReadDeadline(time.Time{})
				c.mu.Unlock()
				continue
			}
			c.mu.Unlock()
			err = errors.New("read timeout")
		}
		if err != nil {
			if cur != nil {
				// cur was popped already: fail it here, the rest in fail.
				c.mu.Lock()
				if failed := c.err; failed != nil {
					// A write failed first, and its fail did not see cur.
					c.mu.Unlock()
					msg := unavailable(failed)
					for ; cur.n > 0; cur.n-- {
						cur.buf = appendError(cur.buf, msg)
					}
					cur.finish()
					return
				}
				c.calls = append([]*call{cur}, c.calls[c.head:]...)
				c.head = 0
				c.mu.Unlock()
			}
			c.fail(err)
			return
		}
		if c.tunnel.Load() {
			c.tunnelFrame(f)
			continue
		}
		if f[0] == '>' {
			if push := c.push.Load(); push != nil {
				(*push)(bytes.Clone(f))
			}
			continue
		}
		if cur == nil {
			c.mu.Lock()
			if c.head < len(c.calls) {
				cur = c.calls[c.head]
				c.calls[c.head] = nil
				c.head++
				if c.head == len(c.calls) {
					c.calls, c.head = c.calls[:0], 0
				}
			}
			c.mu.Unlock()
			if cur == nil {
				c.fail(errors.New("reply with no request waiting for it"))
				return
			}
		}
		cur.buf = append(cur.buf, f...)
		cur.n--
		if cur.n == 0 {
			// Counted before the call finishes: whoever its reply wakes
			// sees the count and the estimate it made.
			done := cur
			cur = nil
			c.sampleRTT(c.answered.Add(1))
			done.finish()
			if c.deferred.Load() {
				c.sendDeferred()
			}
		}
	}
}

// next returns the next complete frame, valid until the following call.
func (c *upConn) next() ([]byte, error) {
	for {
		if c.end > c.start {
			n, err := frameEnd(c.rbuf[c.start:c.end])
			if err != nil {
				return nil, err
			}
			if n > 0 {
				f := c.rbuf[c.start : c.start+n]
				c.start += n
				return f, nil
			}
		}
		if c.start > 0 {
			copy(c.rbuf, c.rbuf[c.start:c.end])
			c.end -= c.start
			c.start = 0
		}
		if c.end == 0 && len(c.rbuf) > 1<<20 {
			c.rbuf = make([]byte, 16<<10)
		}
		if c.end == len(c.rbuf) {
			nb := make([]byte, 2*len(c.rbuf))
			copy(nb, c.rbuf[:c.end])
			c.rbuf = nb
		}
		n, err := c.read(c.rbuf[c.end:])
		c.end += n
		if n > 0 {
			continue
		}
		if err == nil {
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, err
		}
		return nil, fmt.Errorf("read: %w", err)
	}
}

// read reads what the upstream sent into b, waiting for it in Go's
// poller; on a socket the read itself is a raw system call (see nbio).
func (c *upConn) read(b []byte) (int, error) {
	if c.rd == nil {
		return c.nc.Read(b)
	}
	return c.rd.Read(b)
}

// pubsubKinds are the frames whose third element is the connection's
// subscription count.
var pubsubKinds = map[string]bool{
	"subscribe": true, "unsubscribe": true, "psubscribe": true, "punsubscribe": true,
	"ssubscribe": true, "sunsubscribe": true,
}

// States of upConn.resetting.
const (
	resetSent = 1 + iota
	resetAnswered
	resetRefused
)

// resetFrame takes the frames of a RESET under way (Pipe.Reset) in
// state, and reports false for one that is still the client's: a message
// (or MONITOR line, or push) the upstream sent before the RESET. No such
// frame is a bare +RESET or an error, which only RESET's reply can be.
// RESET ends the subscriptions (and MONITOR), so every frame after its
// reply is a reply too: the sign-in's, then the marker PING's, whose
// bulk marker tells the connection answers signed in. That last one
// ends the RESET, as markerDone's answer (true: done).
func (c *upConn) resetFrame(f, marker []byte, state byte) bool {
	if state == resetSent {
		switch {
		case string(f) == "+RESET\r\n":
			state = resetAnswered
		case len(f) > 0 && f[0] == '-':
			state = resetRefused // RESET itself (an ACL)
		default:
			return false
		}
		c.mu.Lock()
		c.resetting = state
		c.mu.Unlock()
		return true
	}
	c.mu.Lock()
	c.resetLeft--
	if len(f) > 0 && f[0] == '-' {
		c.resetting = resetRefused
	}
	left, ok := c.resetLeft, c.resetting == resetAnswered
	if left == 0 {
		c.marker, c.resetting = nil, 0
	}
	c.mu.Unlock()
	if left > 0 {
		return true
	}
	if ok = ok && bytes.Contains(f, marker); ok {
		// No unsubscribe frame counted the subscriptions down, and
		// RESET ends MONITOR too.
		c.subs, c.shardSubs = 0, 0
		c.monitor.Store(false)
		c.tunnel.Store(false)
	}
	select {
	case c.markerDone <- ok:
	default:
	}
	return true
}

// tunnelFrame forwards a frame of a connection in pub/sub or MONITOR mode,
// keeping count of its subscriptions, and answers the marker PING that asks
// whether the mode has ended; during a RESET (Pipe.Reset) resetFrame
// takes the frames first.
func (c *upConn) tunnelFrame(f []byte) {
	c.mu.Lock()
	marker, resetting := c.marker, c.resetting
	c.mu.Unlock()
	if resetting != 0 && c.resetFrame(f, marker, resetting) {
		return
	}
	if c.monitorAsked.Load() && len(f) > 0 && (f[0] == '+' || f[0] == '-') {
		// MONITOR's reply: the first simple frame after it (a push may
		// come before).
		c.monitorAsked.Store(false)
		if f[0] == '-' {
			c.monitor.Store(false)
		}
		if push := c.push.Load(); push != nil {
			(*push)(bytes.Clone(f))
		}
		return
	}
	if c.monitor.Load() && len(f) > 0 && f[0] == '+' {
		// A feed line (MONITOR's feed is simple strings, the marker
		// PING's reply a bulk string), which may name the marker too,
		// before or after its reply: only the marker PING's own line is
		// dropped.
		c.mu.Lock()
		for i, fed := range c.fedMarkers {
			if bytes.Contains(f, fed) {
				c.fedMarkers = append(c.fedMarkers[:i], c.fedMarkers[i+1:]...)
				c.mu.Unlock()
				return
			}
		}
		c.mu.Unlock()
		if push := c.push.Load(); push != nil {
			(*push)(bytes.Clone(f))
		}
		return
	}
	if marker != nil && len(f) < 128 && bytes.Contains(f, marker) {
		ended := c.subs == 0 && c.shardSubs == 0 && !c.monitor.Load()
		if ended {
			c.tunnel.Store(false)
		}
		c.mu.Lock()
		c.marker = nil
		c.mu.Unlock()
		// Not waited for: EndTunnel may have given up (its client gone),
		// and fail may have filled the one slot already.
		select {
		case c.markerDone <- ended:
		default:
		}
		return
	}
	// A subscription's confirmations are pushes in RESP3; an array there is
	// a command's reply (a script can return one shaped like them), which
	// must not count. RESP2 allows only the subscription commands, PING
	// and QUIT/RESET in this mode.
	t, el, ok := elements(f)
	if ok && (t == '>' && c.proto == 3 || t == '*' && c.proto == 2) && len(el) == 3 {
		if kind, ok := str(el[0]); ok && pubsubKinds[string(kind)] {
			if n, ok := integer(el[2]); ok {
				// Shard channels are counted apart ("subscribe" starts with
				// an s too, and is not one).
				if k := string(kind); k == "ssubscribe" || k == "sunsubscribe" {
					c.shardSubs = n
				} else {
					c.subs = n
				}
			}
		}
	}
	if ok && revealsReserved(t, el, c.reserved) {
		return
	}
	if push := c.push.Load(); push != nil {
		(*push)(bytes.Clone(f))
	}
}

// revealsReserved tells whether a frame (its type t and elements el, as
// tunnelFrame parsed them) is a pub/sub message that names a key under
// the lock key prefix: a keyspace notification about such a key
// (channel __keyspace@<db>__:<key>), or a key-event one whose message is
// such a key (channel __keyevent@<db>__:<event>). Relayed commands may not
// touch those keys, nor list them (KEYS, SCAN), so a subscriber does not
// learn of them either; Redis sends them when the upstream has
// notify-keyspace-events set and something writes there (the upstream is
// also a lock node).
func revealsReserved(t byte, el [][]byte, reserved []byte) bool {
	if len(reserved) == 0 || t != '>' && t != '*' || len(el) < 3 {
		return false
	}
	kind, ok := str(el[0])
	if !ok {
		return false
	}
	var channel, message []byte
	switch {
	case string(kind) == "message" && len(el) == 3:
		channel, _ = str(el[1])
		message, _ = str(el[2])
	case string(kind) == "pmessage" && len(el) == 4:
		channel, _ = str(el[2])
		message, _ = str(el[3])
	default:
		return false
	}
	at := bytes.Index(channel, []byte("__:"))
	switch {
	case at < 0:
		return false
	case bytes.HasPrefix(channel, []byte("__keyspace@")):
		return bytes.HasPrefix(channel[at+3:], reserved)
	case bytes.HasPrefix(channel, []byte("__keyevent@")):
		return bytes.HasPrefix(message, reserved)
	}
	return false
}
