package commands

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
			Help: "Lock acquisitions by result: acquired, not_acquired, no_quorum, error.",
		}, []string{"result"}),
		acquireDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lockproxy_lock_acquire_duration_seconds",
			Help:    "Time to answer a LOCK, waiting included.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2.5, 14),
		}),
		heldDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lockproxy_lock_held_duration_seconds",
			Help:    "How long locks granted through this instance were held, until release or expiry.",
			Buckets: prometheus.ExponentialBuckets(0.001, 3, 14),
		}),
		locksHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "lockproxy_locks_held",
			Help: "Locks granted through this instance and neither released nor expired.",
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
// holding-time histogram and the held gauge. Entries leave on UNLOCK or
// when their lease runs out (a sweep each second), so memory follows the
// number of live locks.
type heldLocks struct {
	mu   sync.Mutex
	m    map[heldKey]heldLock
	met  *metrics
	stop chan struct{}
	done chan struct{}
}

type heldKey struct{ key, token string }

type heldLock struct {
	since   time.Time
	expires time.Time
}

func newHeldLocks(m *metrics) *heldLocks {
	h := &heldLocks{m: map[heldKey]heldLock{}, met: m, stop: make(chan struct{}), done: make(chan struct{})}
	go h.sweep()
	return h
}

func (h *heldLocks) granted(key, token string, ttl time.Duration) {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	k := heldKey{key, token}
	if old, ok := h.m[k]; ok {
		old.expires = now.Add(ttl)
		h.m[k] = old
		return
	}
	h.m[k] = heldLock{since: now, expires: now.Add(ttl)}
	h.met.locksHeld.Set(float64(len(h.m)))
}

func (h *heldLocks) renewed(key, token string, ttl time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := heldKey{key, token}
	if l, ok := h.m[k]; ok {
		l.expires = time.Now().Add(ttl)
		h.m[k] = l
	}
}

func (h *heldLocks) released(key, token string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := heldKey{key, token}
	if l, ok := h.m[k]; ok {
		h.met.heldDuration.Observe(time.Since(l.since).Seconds())
		delete(h.m, k)
		h.met.locksHeld.Set(float64(len(h.m)))
	}
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
			h.mu.Lock()
			for k, l := range h.m {
				if now.After(l.expires) {
					h.met.heldDuration.Observe(l.expires.Sub(l.since).Seconds())
					delete(h.m, k)
				}
			}
			h.met.locksHeld.Set(float64(len(h.m)))
			h.mu.Unlock()
		}
	}
}

func (h *heldLocks) close() {
	close(h.stop)
	<-h.done
}
