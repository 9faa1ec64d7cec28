package redis

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the node-level metrics of the RedLock backend.
type Metrics struct {
	requestDuration *prometheus.HistogramVec
	errors          *prometheus.CounterVec
	batchSize       *prometheus.HistogramVec
	quarantined     *prometheus.GaugeVec
	restarts        *prometheus.CounterVec
	clockRateError  *prometheus.GaugeVec
	driftExtra      prometheus.Gauge
}

// NewMetrics registers the node metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "lockproxy_node_request_duration_seconds",
			Help: "Time from queueing an operation for a Redis node to its answer.",
			// From 100µs (pipelined, loopback) to 1 s (a node past its timeout).
			Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 12),
		}, []string{"node", "op"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockproxy_node_errors_total",
			Help: "Failed operations on a Redis node, by reason.",
		}, []string{"node", "reason"}),
		batchSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "lockproxy_node_batch_size",
			Help: "Operations carried by one pipelined write to a Redis node.",
			// Batching is the proxy's lever: under load one write carries
			// many clients' operations.
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256},
		}, []string{"node"}),
		quarantined: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lockproxy_node_quarantined",
			Help: "1 while a Redis node that restarted, or is a master again after being a replica, is kept out of every quorum, else 0.",
		}, []string{"node"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockproxy_node_restarts_total",
			Help: "Restarts of a Redis node seen as a new run_id (or a younger uptime).",
		}, []string{"node"}),
		clockRateError: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lockproxy_node_clock_rate_error",
			Help: "Estimated |rate - 1| of a Redis node's clock against the proxy's monotonic clock " +
				"(0.01 = 1 %), from TIME read with each health check; -1 until enough samples were taken.",
		}, []string{"node"}),
		driftExtra: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "lockproxy_drift_extra_ratio",
			Help: "Drift allowance per unit of TTL added to redlock.drift_factor because a voting node's " +
				"measured clock rate error exceeds it.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.requestDuration, m.errors, m.batchSize, m.quarantined, m.restarts, m.clockRateError, m.driftExtra)
	}
	return m
}

var (
	nodeUpDesc = prometheus.NewDesc("lockproxy_node_up",
		"1 when the last health check of a Redis node reached it, else 0.", []string{"node"}, nil)
	nodeVotingDesc = prometheus.NewDesc("lockproxy_node_voting",
		"1 when a Redis node counts in quorums now (reached, not quarantined after a restart, not a replica, "+
			"its clock within redlock.max_clock_rate_error), else 0. Grants need a majority of all nodes voting.",
		[]string{"node"}, nil)
	nodeReplicaDesc = prometheus.NewDesc("lockproxy_node_replica",
		"1 while the last health check found a Redis node a replica (INFO replication role:slave), which "+
			"does not vote, else 0.", []string{"node"}, nil)
)

// stateCollector reads the nodes' states at each scrape.
type stateCollector struct{ nodes []*Node }

// StateCollector exports whether each node is reachable and whether it
// votes, read from the health checks at each scrape: an alert can fire
// while a quorum still holds but one more failure would lose it.
func (b *Backend) StateCollector() prometheus.Collector { return stateCollector{b.nodes} }

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- nodeUpDesc
	ch <- nodeVotingDesc
	ch <- nodeReplicaDesc
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	for _, n := range c.nodes {
		up := n.health.reachable()
		ch <- prometheus.MustNewConstMetric(nodeUpDesc, prometheus.GaugeValue, b2f(up), n.Name())
		ch <- prometheus.MustNewConstMetric(nodeVotingDesc, prometheus.GaugeValue, b2f(up && !n.health.quarantined()), n.Name())
		ch <- prometheus.MustNewConstMetric(nodeReplicaDesc, prometheus.GaugeValue, b2f(n.health.isReplica()), n.Name())
	}
}
