package commands

import (
	"errors"
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
			Help: "Lock acquisition attempts by result: acquired, not_acquired, no_quorum, error. A LOCK or RLOCK counts once (a grant given back because its client left or the server is closing counts as error); in transparent mode a SET … NX PX|EX on a lock key counts once, and a script (or SET without NX) once per lock key it tried to acquire.",
		}, []string{"result"}),
		acquireDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lockproxy_lock_acquire_duration_seconds",
			Help:    "Time to answer a lock acquisition attempt, as counted in lockproxy_lock_acquire_total: a LOCK or RLOCK, waiting included, or a transparent SET … NX PX|EX or acquiring script (observed once per lock key it tried to acquire).",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2.5, 14),
		}),
		heldDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lockproxy_lock_held_duration_seconds",
			Help:    "How long locks granted through this instance were held: from the first grant of a key to a token (LOCK, RLOCK, or a transparent SET NX PX or acquiring script) until its last hold was released (UNLOCK, or a transparent DEL, UNLINK, compare-and-delete script or DEL in MULTI), or it expired.",
			Buckets: prometheus.ExponentialBuckets(0.001, 3, 14),
		}),
		locksHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "lockproxy_locks_held",
			Help: "Locks (a key and a token) granted through this instance, by LOCK, RLOCK or a transparent acquisition, with a hold neither released (by UNLOCK or a transparent release) nor expired; reentrant and downgrade holds count with their lock.",
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

// acquireResult is the acquire counter of a transparent acquisition
// attempt that ended with err, by the meanings LOCK's results have:
// granted, refused (the key held: Redis's nil reply), no quorum of the
// nodes, or another failure.
func (m *metrics) acquireResult(err error) prometheus.Counter {
	switch {
	case err == nil:
		return m.acquired
	case errors.Is(err, backends.ErrNotAcquired), errors.Is(err, backends.ErrUpgrade):
		return m.notAcquired
	case isNoQuorum(err):
		return m.noQuorum
	}
	return m.acquireErr
}

// acquireDone counts n acquisition attempts of one command that took d in
// c, one of the acquire counters, and observes each in acquireDuration, so
// that the histogram's count follows the counter's sum as it does for
// LOCK.
func (m *metrics) acquireDone(c prometheus.Counter, n int, d time.Duration) {
	c.Add(float64(n))
	for range n {
		m.acquireDuration.Observe(d.Seconds())
	}
}

// scriptAttempts is what a script run by runAcquiring comes to in
// lockproxy_lock_acquire_total: the counter and the number of attempts,
// one per lock key it tried to acquire (0: it tried none). A key it wrote
// a new value to on some node is an attempt: acquired when the
// acquisition stood (and its fence rose: fenceErr nil), otherwise counted
// by why it was rolled back, as LOCK's roll-backs are: too few nodes
// answered (or took the fence), no_quorum; the nodes that did not write
// answered their "not acquired", not_acquired; else error. A script that
// wrote nothing anywhere tried every key of KEYS when it may acquire
// (refusable) and answered what lock scripts answer when the key is held
// (nil or 0; for one that returns a PTTL, the time left, bsm/redislock's
// and Redisson's way), or failed; what else it answered (OK, 1) was a
// renewal of the value the key held or a reply of another kind, no
// acquisition. A SET without NX (not refusable) that wrote nothing set
// the value the key held, or found no key for XX: no attempt either.
func (m *metrics) scriptAttempts(d scriptDecision, fenceErr error, keys int, refusable, ttlReply bool) (prometheus.Counter, int) {
	if d.tried > 0 {
		switch {
		case fenceErr != nil:
			return m.acquireResult(fenceErr), d.tried
		case len(d.holders) > 0:
			return m.acquired, d.tried
		case d.err != nil:
			return m.acquireResult(d.err), d.tried
		}
		if _, failed := d.reply.(backends.ReplyError); failed {
			return m.acquireErr, d.tried
		}
		return m.notAcquired, d.tried
	}
	if !refusable {
		return nil, 0
	}
	if d.err != nil {
		return m.acquireResult(d.err), keys
	}
	switch v := d.reply.(type) {
	case nil:
		return m.notAcquired, keys
	case int64:
		if v == 0 || ttlReply {
			return m.notAcquired, keys
		}
	case backends.ReplyError:
		return m.acquireErr, keys
	}
	return nil, 0
}

// heldLocks tracks the locks granted through this instance (LOCK, RLOCK,
// a transparent SET NX PX or acquiring script), for the holding-time
// histogram and the held gauge, and the transparent releases and renewals
// of them (keyGone, keyHolds, keyRenewed). A lock is a key and a token;
// it counts the token's holds of the key, by kind, as the lock store does
// (a reentrant LOCK adds a write hold, a downgrade's RLOCK a read hold,
// each UNLOCK takes one off), and is held until the last hold goes: only
// then is its holding time observed. Entries leave then, or when their
// lease runs out (a sweep each second), whatever holds they still count:
// a lock lost or left to expire is never released, so memory and the
// gauge follow the number of live locks.
type heldLocks struct {
	mu sync.Mutex
	m  map[heldKey]heldLock
	// byKey indexes m's tokens by key, for the transparent releases and
	// renewals, which name a key and not the token that holds it.
	byKey map[string]map[string]struct{}
	met   *metrics
	stop  chan struct{}
	done  chan struct{}
}

type heldKey struct{ key, token string }

type heldLock struct {
	since time.Time
	// expires is when the last lease of the token's holds ends: the holds
	// of one token share a lease (a downgrade's write hold lasts as long
	// as its read hold), so one time serves them all.
	expires time.Time
	holds   [2]int // by backends.Mode
	// counted is when the lock's last grant was counted: a transparent
	// release or renewal begun before it cannot have ended or renewed
	// that grant, and leaves the lock to its lease.
	counted time.Time
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
	l.counted = now
	h.put(k, l)
}

// acquired counts a lock granted by a transparent acquisition (SET … NX
// PX, a SET or script that wrote a new value) begun at began: the key
// then held token alone, with ttl, so every lock of key counted here
// before, by that token or another, had ended (its lease ran out, or it
// was released or taken over elsewhere) and is ended now. One counted
// since may have been granted after this one ended, and is left.
func (h *heldLocks) acquired(key, token string, ttl time.Duration, began time.Time) {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	for tok := range h.byKey[key] {
		k := heldKey{key, tok}
		if l := h.m[k]; l.counted.Before(began) || tok == token {
			h.end(k, l, now)
		}
	}
	h.put(heldKey{key, token}, heldLock{since: now, expires: now.Add(ttl), holds: [2]int{backends.Write: 1}, counted: now})
}

// put stores l as k's lock. h.mu is held.
func (h *heldLocks) put(k heldKey, l heldLock) {
	if _, ok := h.m[k]; !ok {
		if h.byKey == nil {
			h.byKey = map[string]map[string]struct{}{}
		}
		ts := h.byKey[k.key]
		if ts == nil {
			ts = map[string]struct{}{}
			h.byKey[k.key] = ts
		}
		ts[k.token] = struct{}{}
	}
	h.m[k] = l
	h.met.locksHeld.Set(float64(len(h.m)))
}

// end takes k's lock off, observing its holding time: until now, or until
// its lease ran out if that was before. h.mu is held.
func (h *heldLocks) end(k heldKey, l heldLock, now time.Time) {
	until := now
	if l.expires.Before(now) {
		until = l.expires
	}
	h.met.heldDuration.Observe(until.Sub(l.since).Seconds())
	h.drop(k)
}

// drop removes k. h.mu is held.
func (h *heldLocks) drop(k heldKey) {
	delete(h.m, k)
	if ts := h.byKey[k.key]; ts != nil {
		delete(ts, k.token)
		if len(ts) == 0 {
			delete(h.byKey, k.key)
		}
	}
	h.met.locksHeld.Set(float64(len(h.m)))
}

// tracks reports whether a lock of any of keys is counted.
func (h *heldLocks) tracks(keys []string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range keys {
		if len(h.byKey[k]) > 0 {
			return true
		}
	}
	return false
}

// keyGone ends every lock of key counted before since: a transparent
// command begun then (a DEL, UNLINK, a PEXPIRE of no time, a script)
// left the key missing on a majority of the nodes, which no lock of it
// outlives. A grant counted after since may have landed after that
// command, and is left to its release or its lease.
func (h *heldLocks) keyGone(key string, since time.Time) {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	for tok := range h.byKey[key] {
		k := heldKey{key, tok}
		if l := h.m[k]; l.counted.Before(since) {
			h.end(k, l, now)
		}
	}
}

// keyHolds records what a transparent command begun at since left in key
// on a majority of the nodes: value, with ttl left (negative: unknown).
// The lock of key by that value is renewed to ttl as a RENEW would (a
// compare-and-expire script, a SET … XX PX of the same value); a write
// lock of another token counted before since is over, as the key holds
// another value. Read holds are left as they are: the key then holds the
// readers' marker, no token.
func (h *heldLocks) keyHolds(key, value string, ttl time.Duration, since time.Time) {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	for tok := range h.byKey[key] {
		k := heldKey{key, tok}
		l := h.m[k]
		switch {
		case tok == value:
			if ttl >= 0 {
				h.renewLocked(k, l, now.Add(ttl))
			}
		case l.counted.Before(since) && l.holds[backends.Read] == 0:
			h.end(k, l, now)
		}
	}
}

// keyRenewed renews every lock of key whose lease has not run out to ttl
// from now, as a RENEW would: a transparent PEXPIRE or EXPIRE set the
// key's TTL on a majority, for whichever token holds it. One whose lease
// ran out is no longer the holder, and is left to the sweep.
func (h *heldLocks) keyRenewed(key string, ttl time.Duration) {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	for tok := range h.byKey[key] {
		k := heldKey{key, tok}
		if l := h.m[k]; l.expires.After(now) {
			h.renewLocked(k, l, now.Add(ttl))
		}
	}
}

// renewLocked sets k's lease to end at e, as renewed does. h.mu is held.
func (h *heldLocks) renewLocked(k heldKey, l heldLock, e time.Time) {
	if l.holds[backends.Write] == 0 || l.holds[backends.Read] == 0 || e.After(l.expires) {
		l.expires = e
	}
	h.m[k] = l
}

// renewed sets the lease of key held by token to ttl from now. With holds
// of both kinds it only extends it: renewing one kind leaves the other's
// lease as it is.
func (h *heldLocks) renewed(key, token string, ttl time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := heldKey{key, token}
	if l, ok := h.m[k]; ok {
		h.renewLocked(k, l, time.Now().Add(ttl))
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
	h.drop(k)
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
			h.drop(k)
		}
	}
	h.met.locksHeld.Set(float64(len(h.m)))
}

func (h *heldLocks) close() {
	close(h.stop)
	<-h.done
}
