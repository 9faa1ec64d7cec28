package postgres

import "github.com/prometheus/client_golang/prometheus"

var (
	listeningDesc = prometheus.NewDesc("lockproxy_postgres_listening",
		"1 while the connection LISTENing for releases is up; 0 while it reconnects (waiters poll meanwhile).", nil, nil)
	wakeupsDesc = prometheus.NewDesc("lockproxy_postgres_wakeups_total",
		"Waiting LOCK calls woken by a NOTIFY of a release.", nil, nil)
	sweptDesc = prometheus.NewDesc("lockproxy_postgres_rows_swept_total",
		"Expired rows the periodic sweep deleted.", nil, nil)
	poolDesc = prometheus.NewDesc("lockproxy_postgres_pool_connections",
		"Connections of the pool to the database, by state: acquired (running a statement or a grant's transaction), idle, max (postgres.pool_size).",
		[]string{"state"}, nil)
	acquireWaitDesc = prometheus.NewDesc("lockproxy_postgres_pool_acquire_wait_seconds_total",
		"Time operations waited for a pool connection: when it grows fast, postgres.pool_size is too small for the load.", nil, nil)
	retriesDesc = prometheus.NewDesc("lockproxy_postgres_statement_retries_total",
		"Statements and transactions run again after the database rolled them back, by op (what they were for) and sqlstate: "+
			"40001 (serialization failure, under a repeatable read or serializable default_transaction_isolation) or 40P01 (deadlock).",
		[]string{"op", "sqlstate"}, nil)
)

// collector reads the backend's state at each scrape; nothing on the lock
// path touches Prometheus.
type collector struct{ b *Backend }

// Collector exports the listening connection, the wake-ups and sweeps,
// the pool's use, and the statements run again (every op and SQLSTATE,
// from 0: fixed labels, never a key or a token).
func (b *Backend) Collector() prometheus.Collector { return collector{b} }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{listeningDesc, wakeupsDesc, sweptDesc, poolDesc, acquireWaitDesc, retriesDesc} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	listening := 0.0
	if c.b.listening.Load() {
		listening = 1
	}
	ch <- prometheus.MustNewConstMetric(listeningDesc, prometheus.GaugeValue, listening)
	ch <- prometheus.MustNewConstMetric(wakeupsDesc, prometheus.CounterValue, float64(c.b.wakeups.Load()))
	ch <- prometheus.MustNewConstMetric(sweptDesc, prometheus.CounterValue, float64(c.b.swept.Load()))
	st := c.b.pool.Stat()
	ch <- prometheus.MustNewConstMetric(poolDesc, prometheus.GaugeValue, float64(st.AcquiredConns()), "acquired")
	ch <- prometheus.MustNewConstMetric(poolDesc, prometheus.GaugeValue, float64(st.IdleConns()), "idle")
	ch <- prometheus.MustNewConstMetric(poolDesc, prometheus.GaugeValue, float64(st.MaxConns()), "max")
	ch <- prometheus.MustNewConstMetric(acquireWaitDesc, prometheus.CounterValue, st.AcquireDuration().Seconds())
	for op := range numRetryOps {
		for i, code := range retryCodes {
			ch <- prometheus.MustNewConstMetric(retriesDesc, prometheus.CounterValue, float64(c.b.retries[op][i].Load()), op.String(), code)
		}
	}
}
