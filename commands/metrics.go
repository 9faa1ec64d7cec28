package commands

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockproxy/lockproxy/backends"
)

type metrics struct {
	commands        *prometheus.CounterVec
	acquire         *prometheus.CounterVec
	acquireDuration prometheus.Histogram
	heldDuration    prometheus.Histogram
	locksHeld       prometheus.Gauge
	// counters are each command's {ok, error} children, resolved at start
	// so the hot path does no label lookup.
	counters                                    map[*Command][2]prometheus.Counter
	acquired, notAcquired, noQuorum, acquireErr prometheus.Counter
	// Failed passwords: compared and wrong, or refused unchecked.
	wrongPassword, authThrottled prometheus.Counter
	// Commands auth.permissions refused, for the command or a key.
	deniedCommand, deniedKey, deniedChannel prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockproxy_commands_total",
			Help: "Commands served, by command and result (ok or error).",
		}, []string{"cmd", "result"}),
		acquire: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockproxy_lock_acquire_total",
			Help: "Lock acquisitions by result: acquired, not_acquired, no_quorum, error (a grant given back because its client left or the server is closing included).",
		}, []string{"result"}),
		acquireDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lockproxy_lock_acquire_duration_seconds",
			Help:    "Time to answer a LOCK, waiting included.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2.5, 14),
		}),
		heldDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lockproxy_lock_held_duration_seconds",
			Help:    "How long locks granted through this instance were held: from the first grant of a key to a token until its last hold was released, or it expired.",
			Buckets: prometheus.ExponentialBuckets(0.001, 3, 14),
		}),
		locksHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "lockproxy_locks_held",
			Help: "Locks (a key and a token) granted through this instance with a hold neither released nor expired; reentrant and downgrade holds count with their lock.",
		}),
	}
	authFailures := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockproxy_auth_failures_total",
		Help: "Failed AUTH and HELLO … AUTH: wrong_password, or throttled (too many failures from the address; not compared).",
	}, []string{"result"})
	m.wrongPassword = authFailures.WithLabelValues("wrong_password")
	m.authThrottled = authFailures.WithLabelValues("throttled")
	denied := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockproxy_auth_denied_total",
		Help: "Commands auth.permissions refused, by reason: command (not granted), key (outside the user's patterns, scripts and SORT … BY/GET included) or channel (a pub/sub channel outside its patterns).",
	}, []string{"reason"})
	m.deniedCommand = denied.WithLabelValues("command")
	m.deniedKey = denied.WithLabelValues("key")
	m.deniedChannel = denied.WithLabelValues("channel")
	reg.MustRegister(m.commands, m.acquire, m.acquireDuration, m.heldDuration, m.locksHeld, authFailures, denied)
	m.counters = map[*Command][2]prometheus.Counter{}
	add := func(c *Command) {
		m.counters[c] = [2]prometheus.Counter{
			m.commands.WithLabelValues(c.Metric, "ok"), m.commands.WithLabelValues(c.Metric, "error"),
		}
	}
	for _, c := range table {
		add(c)
		for _, sc := range c.Subs {
			add(sc)
		}
	}
	m.acquired = m.acquire.WithLabelValues("acquired")
	m.notAcquired = m.acquire.WithLabelValues("not_acquired")
	m.noQuorum = m.acquire.WithLabelValues("no_quorum")
	m.acquireErr = m.acquire.WithLabelValues("error")
	return m
}

// heldLocks tracks the locks granted through this instance, for the
// holding-time histogram and the held gauge. A lock is a key and a token;
// it counts the token's holds of the key, by kind, as the lock store does
// (a reentrant LOCK adds a write hold, a downgrade's RLOCK a read hold,
// each UNLOCK takes one off), and is held until the last hold goes: only
// then is its holding time observed. Entries leave then, or when their
// lease runs out (a sweep each second), whatever holds they still count:
// a lock lost or left to expire is never released, so memory and the
// gauge follow the number of live locks.
type heldLocks struct {
	mu   sync.Mutex
	m    map[heldKey]heldLock
	met  *metrics
	stop chan struct{}
	done chan struct{}
}

type heldKey struct{ key, token string }

type heldLock struct {
	since time.Time
	// expires is when the last lease of the token's holds ends: the holds
	// of one token share a lease (a downgrade's write hold lasts as long
	// as its read hold), so one time serves them all.
	expires time.Time
	holds   [2]int // by backends.Mode
}

func newHeldLocks(m *metrics) *heldLocks {
	h := &heldLocks{m: map[heldKey]heldLock{}, met: m, stop: make(chan struct{}), done: make(chan struct{})}
	go h.sweep()
	return h
}

// granted counts a hold of mode of key by token granted with ttl. A
// reentrant grant, or a downgrade, extends the lease counted, never
// shortens it: neither shortens the lease of the holds the token has.
func (h *heldLocks) granted(key, token string, mode backends.Mode, ttl time.Duration) {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	k := heldKey{key, token}
	l, ok := h.m[k]
	if !ok {
		l = heldLock{since: now}
	}
	if e := now.Add(ttl); e.After(l.expires) {
		l.expires = e
	}
	l.holds[mode]++
	h.m[k] = l
	h.met.locksHeld.Set(float64(len(h.m)))
}

// renewed sets the lease of key held by token to ttl from now. With holds
// of both kinds it only extends it: renewing one kind leaves the other's
// lease as it is.
func (h *heldLocks) renewed(key, token string, ttl time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := heldKey{key, token}
	if l, ok := h.m[k]; ok {
		e := time.Now().Add(ttl)
		if l.holds[backends.Write] == 0 || l.holds[backends.Read] == 0 || e.After(l.expires) {
			l.expires = e
		}
		h.m[k] = l
	}
}

// raised extends the lease of key held by token to ttl from now but never
// shortens it, as a KEEPALIVE watchdog's renewals and its lock-delay do on
// the nodes (backends.HoldKeeper.RenewHold): the token's holds taken
// without KEEPALIVE keep the longer lease they were told of.
func (h *heldLocks) raised(key, token string, ttl time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := heldKey{key, token}
	if l, ok := h.m[k]; ok {
		if e := time.Now().Add(ttl); e.After(l.expires) {
			l.expires = e
			h.m[k] = l
		}
	}
}

// released takes off the hold an UNLOCK of key by token released: a write
// hold while the token has one, else a read hold, as the lock store
// releases them.
func (h *heldLocks) released(key, token string) {
	h.release(key, token, backends.Write)
}

// releasedHold takes off a hold of mode that was released.
func (h *heldLocks) releasedHold(key, token string, mode backends.Mode) {
	h.release(key, token, mode)
}

// release takes one hold of mode off key by token, of the other kind when
// it counts none of mode (the hold released was granted through another
// instance, or counted before a loss), and ends the lock with its last.
func (h *heldLocks) release(key, token string, mode backends.Mode) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := heldKey{key, token}
	l, ok := h.m[k]
	if !ok {
		return
	}
	if l.holds[mode] == 0 {
		mode = 1 - mode
	}
	if l.holds[mode] > 0 {
		l.holds[mode]--
	}
	if l.holds != ([2]int{}) {
		h.m[k] = l
		return
	}
	h.met.heldDuration.Observe(time.Since(l.since).Seconds())
	delete(h.m, k)
	h.met.locksHeld.Set(float64(len(h.m)))
}

func (h *heldLocks) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.m)
}

func (h *heldLocks) sweep() {
	defer close(h.done)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case now := <-t.C:
			h.expire(now)
		}
	}
}

// expire ends the locks whose lease ran out by now, however many holds
// they count.
func (h *heldLocks) expire(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for k, l := range h.m {
		if now.After(l.expires) {
			h.met.heldDuration.Observe(l.expires.Sub(l.since).Seconds())
			delete(h.m, k)
		}
	}
	h.met.locksHeld.Set(float64(len(h.m)))
}

func (h *heldLocks) close() {
	close(h.stop)
	<-h.done
}
