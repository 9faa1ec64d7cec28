package redis

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// RedLock assumes that the clocks of the nodes run at the rate of the
// proxy's clock to within the drift factor: a node whose clock runs 3 %
// fast expires a lease of ttl 3 % early, and a drift allowance of 1 % then
// no longer covers it. Nothing in RedLock checks the assumption. The
// proxy measures it instead: every health check also reads the node's TIME,
// and a least-squares fit of node time against the proxy's monotonic clock
// over a bounded window gives the node's clock rate. The rate error is
// |rate − 1|.
//
// Two rules follow from it (see Backend.updateDrift and Node.sampleClock):
// the drift allowance grows by ttl × (e − drift_factor) when the largest
// rate error e among the nodes that may vote exceeds the drift factor, and
// a node whose rate error exceeds redlock.max_clock_rate_error stops voting
// (it fails fast with reason "clock") until its estimate is back within
// the bound.

// Estimator bounds. The window holds 60 samples at least a second apart
// (checks run every 10 ms to 5 s, a quarter of locks.max_ttl at most, so
// short TTLs must not shrink the window's span below minSpan) and never
// more than ten minutes of history, so a node whose clock was corrected is
// trusted again within that time.
//
// How soon an estimate may be trusted follows from the samples themselves:
// the moment a node read its clock is known to within half the round trip
// of its TIME, so the fitted rate is off by at most about three times the
// largest half round trip divided by the span the samples cover (a least-
// squares slope through points each off by at most u moves by under
// 3u/span). An estimate counts once that bound is under
// sampleMaxUncertainty (0.1 %, a tenth of the default drift factor) over
// at least sampleFastSpan — on a LAN, with round trips well under a
// millisecond, that is two seconds after the first sample, where a fixed
// span made every node wait ten — and in any case once the samples span
// sampleMinSpan (10 s; with half round trips under sampleMaxRTT/2 = 10 ms
// the bound is then 0.3 %).
const (
	sampleWindow         = 60
	sampleMinGap         = time.Second
	sampleMaxAge         = 10 * time.Minute
	sampleMaxRTT         = 20 * time.Millisecond
	sampleMinSpan        = 10 * time.Second
	sampleFastSpan       = 2 * time.Second
	sampleMaxUncertainty = 0.001
	sampleMinSamples     = 3
	// recentMaxUncertainty bounds the latest samples' fit (see
	// recentRate): it only ever raises the error reported, so it may be
	// looser; a fifth of the default max_clock_rate_error lets a node
	// whose clock turned fast be taken out within a few samples even when
	// round trips are long, and no node within 4 % of the right rate is
	// taken out by it.
	recentMaxUncertainty = 0.01
)

// clockSample is one TIME reading.
type clockSample struct {
	local time.Time     // the proxy's clock halfway through the round trip
	node  int64         // the node's clock, µs since the epoch
	half  time.Duration // half the round trip: how far off local may be
}

// rateEstimator estimates a node's clock rate relative to the proxy's
// clock from TIME samples. It is not safe for concurrent use.
type rateEstimator struct {
	window     int
	maxAge     time.Duration
	maxRTT     time.Duration
	minGap     time.Duration // between kept samples
	minSpan    time.Duration // a span that always suffices
	fastSpan   time.Duration // the least span, with small round trips
	maxUncert  float64       // the rate error the samples may leave
	recentMax  float64       // the same for the latest samples' fit
	minSamples int
	samples    []clockSample
}

func newRateEstimator() *rateEstimator {
	return &rateEstimator{
		window: sampleWindow, maxAge: sampleMaxAge, maxRTT: sampleMaxRTT, minGap: sampleMinGap,
		minSpan: sampleMinSpan, fastSpan: sampleFastSpan, maxUncert: sampleMaxUncertainty, recentMax: recentMaxUncertainty,
		minSamples: sampleMinSamples,
	}
}

// add records the node's clock nodeMicros as read by a TIME sent at sent
// and answered at received (both on the proxy's clock). It reports whether
// the sample was kept: one with a round trip over maxRTT is not, as the
// moment the node read its clock is known only to within half of it, nor
// one taken less than minGap after the last one kept.
func (e *rateEstimator) add(sent, received time.Time, nodeMicros int64) bool {
	rtt := received.Sub(sent)
	if rtt < 0 || rtt > e.maxRTT {
		return false
	}
	mid := sent.Add(rtt / 2)
	if n := len(e.samples); n > 0 {
		since := mid.Sub(e.samples[n-1].local)
		if since <= 0 || since < e.minGap {
			return false // the proxy's clock did not move, or too little
		}
	}
	e.samples = append(e.samples, clockSample{local: mid, node: nodeMicros, half: rtt / 2})
	drop := 0
	if over := len(e.samples) - e.window; over > 0 {
		drop = over
	}
	for drop < len(e.samples) && mid.Sub(e.samples[drop].local) > e.maxAge {
		drop++
	}
	if drop > 0 {
		e.samples = append(e.samples[:0], e.samples[drop:]...)
	}
	return true
}

// reset forgets every sample: after a restart the node's clock may be
// another one.
func (e *rateEstimator) reset() { e.samples = e.samples[:0] }

// rate is the least-squares slope of node time against proxy time over
// the whole window: 1 for a node whose clock runs at the proxy's rate. ok
// is false until the window holds minSamples samples whose span bounds the
// rate's error (see the estimator bounds).
func (e *rateEstimator) rate() (rate float64, ok bool) { return e.fit(e.samples, e.maxUncert) }

// recentRate is the slope over the fewest latest samples that make an
// estimate on their own. The whole window's fit takes a while to follow a
// clock whose rate changed (its older samples pull it back); the recent
// one follows within seconds.
func (e *rateEstimator) recentRate() (rate float64, ok bool) {
	n := len(e.samples)
	for i := n - e.minSamples; i >= 0; i-- {
		if r, ok := e.fit(e.samples[i:], e.recentMax); ok {
			return r, true
		}
		if e.samples[n-1].local.Sub(e.samples[i].local) >= e.minSpan {
			break // a longer suffix is the window's business
		}
	}
	return 0, false
}

// fit is the least-squares slope through samples, when they make an
// estimate whose error from the round trips is at most maxUncert (or they
// span minSpan).
func (e *rateEstimator) fit(samples []clockSample, maxUncert float64) (rate float64, ok bool) {
	n := len(samples)
	if n < e.minSamples || n < 2 {
		return 0, false
	}
	first := samples[0]
	span := samples[n-1].local.Sub(first.local)
	if span < e.minSpan && (span < e.fastSpan || uncertainty(samples, span) > maxUncert) {
		return 0, false
	}
	// Offsets from the first sample keep the sums small and exact enough
	// in float64 (µs over ten minutes).
	var sx, sy float64
	for _, s := range samples {
		sx += s.local.Sub(first.local).Seconds()
		sy += float64(s.node-first.node) / 1e6
	}
	mx, my := sx/float64(n), sy/float64(n)
	var sxy, sxx float64
	for _, s := range samples {
		dx := s.local.Sub(first.local).Seconds() - mx
		dy := float64(s.node-first.node)/1e6 - my
		sxy += dx * dy
		sxx += dx * dx
	}
	if sxx == 0 {
		return 0, false
	}
	return sxy / sxx, true
}

// uncertainty bounds how far the rate fitted through samples may be off
// from their round trips alone, over span.
func uncertainty(samples []clockSample, span time.Duration) float64 {
	var worst time.Duration
	for _, s := range samples {
		worst = max(worst, s.half)
	}
	// A clock read is known to the microsecond at best (TIME's unit).
	worst = max(worst, time.Microsecond)
	return 3 * worst.Seconds() / span.Seconds()
}

// rateError is the larger of |rate − 1| over the whole window and over
// the latest samples (see recentRate), or ok false without an estimate:
// the larger error is the one the drift rule and the vote must allow for.
func (e *rateEstimator) rateError() (float64, bool) {
	r, ok := e.rate()
	rr, rok := e.recentRate()
	switch {
	case ok && rok:
		return max(math.Abs(r-1), math.Abs(rr-1)), true
	case ok:
		return math.Abs(r - 1), true
	case rok:
		return math.Abs(rr - 1), true
	}
	return 0, false
}

// rateUnknown is stored as a node's rate error while it has no estimate.
const rateUnknown = -1.0

// nodeClock is a node's clock-rate measurement. Only the node's health
// check adds samples; a restart seen on any connection resets them.
type nodeClock struct {
	mu  sync.Mutex
	est *rateEstimator
	// rateErr holds the float64 bits of the last rate error, or of
	// rateUnknown: INFO, metrics and the drift rule read it.
	rateErr atomic.Uint64
}

func newNodeClock() *nodeClock {
	c := &nodeClock{est: newRateEstimator()}
	c.rateErr.Store(math.Float64bits(rateUnknown))
	return c
}

// sample adds one TIME reading and returns the new estimate.
func (c *nodeClock) sample(sent, received time.Time, nodeMicros int64) (float64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.est.add(sent, received, nodeMicros)
	return c.est.rateError()
}

// reset forgets the samples, after a restart.
func (c *nodeClock) reset() {
	c.mu.Lock()
	c.est.reset()
	c.mu.Unlock()
	c.rateErr.Store(math.Float64bits(rateUnknown))
}

// rateError is the last published rate error; ok is false without one.
func (c *nodeClock) rateError() (float64, bool) {
	e := math.Float64frombits(c.rateErr.Load())
	return e, e >= 0
}

// publish makes e (or rateUnknown when !ok) the node's rate error.
func (c *nodeClock) publish(e float64, ok bool) {
	if !ok {
		e = rateUnknown
	}
	c.rateErr.Store(math.Float64bits(e))
}

// sampleTime records the answer to a TIME pipelined with the health
// check's INFO, sent and answered at the given times of the proxy's clock.
func (n *Node) sampleTime(sent, received time.Time, tm *goredis.TimeCmd) {
	t, err := tm.Result()
	if err != nil {
		if isServerError(err) {
			n.noTimeOnce.Do(func() {
				n.log.Warn("cannot read TIME from the redis node: its clock rate is not measured",
					zap.String("reason", reasonOf(err)))
			})
		}
		return
	}
	e, ok := n.clock.sample(sent, received, t.UnixMicro())
	n.applyClock(e, ok)
}

// applyClock publishes a new rate estimate and takes the node out of (or
// back into) every quorum by it. The order keeps the drift rule safe: a
// node is taken out before its error leaves the rule's maximum, and comes
// back only after the rule has counted its error.
func (n *Node) applyClock(e float64, ok bool) {
	out := ok && n.maxRateError > 0 && e > n.maxRateError
	if out && n.health.setClockOut(true) {
		n.log.Warn("redis node's clock rate is out of bound: it no longer votes",
			zap.Float64("rate_error", e), zap.Float64("max_clock_rate_error", n.maxRateError))
	}
	n.clock.publish(e, ok)
	if n.clockGauge != nil {
		if ok {
			n.clockGauge.Set(e)
		} else {
			n.clockGauge.Set(rateUnknown)
		}
	}
	if n.onClock != nil {
		n.onClock()
	}
	if !out && n.health.setClockOut(false) {
		n.log.Info("redis node's clock rate is back within bound: it votes again", zap.Float64("rate_error", e))
	}
}
