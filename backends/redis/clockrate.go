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
// trusted again within that time. An
// estimate needs a span of 10 s: a sample's error is at most half its round
// trip (under sampleMaxRTT/2 = 10 ms), which over 10 s bounds the rate
// error of the fit well below the 1 % drift factor's scale.
const (
	sampleWindow     = 60
	sampleMinGap     = time.Second
	sampleMaxAge     = 10 * time.Minute
	sampleMaxRTT     = 20 * time.Millisecond
	sampleMinSpan    = 10 * time.Second
	sampleMinSamples = 5
)

// clockSample is one TIME reading.
type clockSample struct {
	local time.Time // the proxy's clock halfway through the round trip
	node  int64     // the node's clock, µs since the epoch
}

// rateEstimator estimates a node's clock rate relative to the proxy's
// clock from TIME samples. It is not safe for concurrent use.
type rateEstimator struct {
	window     int
	maxAge     time.Duration
	maxRTT     time.Duration
	minGap     time.Duration // between kept samples
	minSpan    time.Duration
	minSamples int
	samples    []clockSample
}

func newRateEstimator() *rateEstimator {
	return &rateEstimator{
		window: sampleWindow, maxAge: sampleMaxAge, maxRTT: sampleMaxRTT, minGap: sampleMinGap,
		minSpan: sampleMinSpan, minSamples: sampleMinSamples,
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
	e.samples = append(e.samples, clockSample{local: mid, node: nodeMicros})
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

// rate is the least-squares slope of node time against proxy time: 1 for a
// node whose clock runs at the proxy's rate. ok is false until the window
// holds minSamples samples spanning minSpan.
func (e *rateEstimator) rate() (rate float64, ok bool) {
	n := len(e.samples)
	if n < e.minSamples || n < 2 {
		return 0, false
	}
	first := e.samples[0]
	if e.samples[n-1].local.Sub(first.local) < e.minSpan {
		return 0, false
	}
	// Offsets from the first sample keep the sums small and exact enough
	// in float64 (µs over ten minutes).
	var sx, sy float64
	for _, s := range e.samples {
		sx += s.local.Sub(first.local).Seconds()
		sy += float64(s.node-first.node) / 1e6
	}
	mx, my := sx/float64(n), sy/float64(n)
	var sxy, sxx float64
	for _, s := range e.samples {
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

// rateError is |rate − 1|, or ok false without an estimate.
func (e *rateEstimator) rateError() (float64, bool) {
	r, ok := e.rate()
	if !ok {
		return 0, false
	}
	return math.Abs(r - 1), true
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
