// Package faultproxy is an in-process TCP proxy for fault tests: one Proxy
// listens on a free 127.0.0.1 port in front of one upstream (a Redis node,
// or lockproxy itself) and can be switched at run time, from any goroutine,
// between pass-through, added latency, a blackhole, connection resets and a
// RESP-aware "fast clock" that makes the node's keys expire sooner.
//
// It has no dependencies outside the standard library.
package faultproxy

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Mode is what a Proxy does with traffic.
type Mode int

const (
	// PassThrough forwards bytes both ways unchanged.
	PassThrough Mode = iota
	// Latency delays every chunk, in each direction, by a fixed delay ±
	// jitter, keeping the order of the bytes.
	Latency
	// Blackhole accepts connections and reads from both sides, but forwards
	// nothing and answers nothing, like a partition that DROPs packets.
	// When the proxy leaves Blackhole, every connection that lost bytes is
	// reset, since its byte stream has a hole.
	Blackhole
	// Reset closes every connection with a TCP RST and resets new ones as
	// soon as they are accepted.
	Reset
	// FastClock rewrites the TTLs of client→server RESP commands so that
	// the upstream's keys expire Rate times sooner (see FastClock).
	FastClock
)

func (m Mode) String() string {
	switch m {
	case PassThrough:
		return "pass-through"
	case Latency:
		return "latency"
	case Blackhole:
		return "blackhole"
	case Reset:
		return "reset"
	case FastClock:
		return "fast-clock"
	}
	return "unknown"
}

// state is the proxy's current behaviour; it is replaced as a whole.
type state struct {
	mode          Mode
	delay, jitter time.Duration
	rate          float64
	since         time.Time // when FastClock began: TIME replies run rate× fast from here
}

// Proxy is a TCP proxy in front of one upstream. All methods are safe for
// concurrent use.
type Proxy struct {
	upstream string
	ln       net.Listener

	mu     sync.Mutex
	st     state
	links  map[*link]struct{}
	closed bool

	wg sync.WaitGroup
	// held counts the chunks read with a delay (Latency) and not yet
	// written on.
	held atomic.Int64
}

// Held is the number of chunks the proxy read with a delay (Latency) and
// has not passed on yet: a test can tell that bytes it sent are held
// before it heals the proxy.
func (p *Proxy) Held() int { return int(p.held.Load()) }

// New starts a proxy for upstream on a free 127.0.0.1 port, in
// PassThrough mode.
func New(upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{upstream: upstream, ln: ln, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's listening address (host:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Upstream is the address the proxy forwards to.
func (p *Proxy) Upstream() string { return p.upstream }

// Mode returns the current mode.
func (p *Proxy) Mode() Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st.mode
}

// PassThrough heals the proxy: bytes flow unchanged from now on.
func (p *Proxy) PassThrough() { p.set(state{mode: PassThrough}) }

// SetLatency delays each chunk, in each direction, by delay plus a uniform
// random amount in [-jitter, +jitter] (never below 0), keeping order.
func (p *Proxy) SetLatency(delay, jitter time.Duration) {
	p.set(state{mode: Latency, delay: delay, jitter: jitter})
}

// Blackhole drops everything in both directions; connections stay open and
// new ones are accepted.
func (p *Proxy) Blackhole() { p.set(state{mode: Blackhole}) }

// Reset closes every connection with a TCP RST and refuses (resets) new
// ones until the mode changes.
func (p *Proxy) Reset() {
	p.set(state{mode: Reset})
	p.mu.Lock()
	ls := p.snapshotLocked()
	p.mu.Unlock()
	for _, l := range ls {
		l.reset()
	}
}

// FastClock makes the upstream's clock seem to run rate times fast (rate >
// 1): keys expire rate times sooner, by rewriting client→server commands
// (SET … PX ms / EX s, PSETEX, SETEX, PEXPIRE, EXPIRE, and the lease of
// lockproxy's lock scripts: every TTL becomes ttl/rate ms, at least 1), and
// TIME replies run rate times fast from now on, so that a client measuring
// the node's clock rate sees it too.
func (p *Proxy) FastClock(rate float64) {
	if rate < 1 {
		rate = 1
	}
	p.set(state{mode: FastClock, rate: rate, since: time.Now()})
}

func (p *Proxy) set(st state) {
	p.mu.Lock()
	was := p.st.mode
	p.st = st
	ls := p.snapshotLocked()
	p.mu.Unlock()
	if was == Blackhole && st.mode != Blackhole {
		for _, l := range ls {
			if l.holed() {
				l.reset()
			}
		}
	}
}

func (p *Proxy) state() state {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st
}

func (p *Proxy) snapshotLocked() []*link {
	ls := make([]*link, 0, len(p.links))
	for l := range p.links {
		ls = append(ls, l)
	}
	return ls
}

// Close stops listening, closes every connection and waits for the
// proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	ls := p.snapshotLocked()
	p.mu.Unlock()
	err := p.ln.Close()
	for _, l := range ls {
		l.close()
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.state().mode == Reset {
			rst(c)
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// rst closes c with an RST instead of a FIN.
func rst(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// link is one proxied connection: client ⇄ proxy ⇄ upstream.
type link struct {
	client, server net.Conn

	// times has an entry per command sent on the link whose reply has not
	// come back yet, true for TIME: the reply side finds TIME's replies by
	// it. untracked is set once the command stream is not RESP we parse.
	tmu       sync.Mutex
	times     []bool
	untracked bool

	mu     sync.Mutex
	hole   bool // bytes were dropped by Blackhole
	closed bool
}

func (l *link) holed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.hole
}

func (l *link) dropped() {
	l.mu.Lock()
	l.hole = true
	l.mu.Unlock()
}

func (l *link) reset() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	l.mu.Unlock()
	rst(l.client)
	rst(l.server)
}

func (l *link) close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	l.mu.Unlock()
	_ = l.client.Close()
	_ = l.server.Close()
}

func (p *Proxy) serve(c net.Conn) {
	defer p.wg.Done()
	s, err := net.DialTimeout("tcp", p.upstream, 2*time.Second)
	if err != nil {
		rst(c)
		return
	}
	l := &link{client: c, server: s}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		l.close()
		return
	}
	p.links[l] = struct{}{}
	p.mu.Unlock()

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(l, c, s, true) }()
	go func() { defer wg.Done(); p.pipe(l, s, c, false) }()
	wg.Wait()
	l.close()
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// chunk is bytes read from one side, due to be written at due.
type chunk struct {
	b    []byte
	due  time.Time
	held bool // counted in Proxy.held
}

// pipe copies src to dst: one goroutine reads and decides each chunk's
// fate when it is read, another writes chunks in order at their due time.
// toServer marks the client→server direction, the one FastClock rewrites.
func (p *Proxy) pipe(l *link, src, dst net.Conn, toServer bool) {
	q := make(chan chunk, 4096)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ch := range q {
			if d := time.Until(ch.due); d > 0 {
				time.Sleep(d)
			}
			_, err := dst.Write(ch.b)
			if ch.held {
				p.held.Add(-1)
			}
			if err != nil {
				l.close()
				for ch := range q { // drain so the reader never blocks
					if ch.held {
						p.held.Add(-1)
					}
				}
				return
			}
		}
	}()
	defer func() {
		close(q)
		<-done
		// Pass the end of the stream on, so that the other side sees it.
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}()

	var framer *respFramer
	var replies *replyFramer
	if toServer {
		framer = &respFramer{onCommand: l.sent}
	} else {
		replies = &replyFramer{l: l}
	}
	var lastDue time.Time
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			st := p.state()
			b := append([]byte(nil), buf[:n]...)
			if framer != nil {
				rate := 0.0
				if st.mode == FastClock {
					rate = st.rate
				}
				b = framer.feed(b, rate)
			}
			if replies != nil {
				b = replies.feed(b, st)
			}
			switch st.mode {
			case Blackhole:
				l.dropped()
				b = nil
			case Reset:
				l.reset()
				return
			}
			if len(b) > 0 {
				due := time.Now()
				if st.mode == Latency {
					d := st.delay
					if st.jitter > 0 {
						d += time.Duration(rand.Int64N(int64(2*st.jitter)+1)) - st.jitter
					}
					due = due.Add(max(d, 0))
				}
				// Never before the previous chunk: order is kept.
				if due.Before(lastDue) {
					due = lastDue
				}
				lastDue = due
				held := st.mode == Latency && due.After(time.Now())
				if held {
					p.held.Add(1)
				}
				q <- chunk{b: b, due: due, held: held}
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				l.close()
			}
			return
		}
	}
}
