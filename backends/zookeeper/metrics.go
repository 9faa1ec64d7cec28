package zookeeper

import (
	"github.com/prometheus/client_golang/prometheus"
)

// register adds the backend's metrics to reg. They read the backend's own
// counters, so nothing on the lock path touches Prometheus.
func (b *Backend) register(reg prometheus.Registerer) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "lockproxy_zookeeper_connected",
			Help: "1 while lockproxy's ZooKeeper session is established on a server, 0 while it is disconnected (held locks suspended) or expired.",
		}, func() float64 {
			if b.connected.Load() {
				return 1
			}
			return 0
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "lockproxy_zookeeper_session_expirations_total",
			Help: "ZooKeeper sessions that expired; every lock held through one was lost.",
		}, func() float64 { return float64(b.expirations.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "lockproxy_zookeeper_watch_wakeups_total",
			Help: "Watches fired for waiting LOCK calls: one per release a waiter here was queued behind.",
		}, func() float64 { return float64(b.wakeups.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "lockproxy_zookeeper_watch_rearms_total",
			Help: "Watches a waiting LOCK call set again on the node it waits for after a change that left it blocked (a renewal or reentry of that node): no wakeup, no children read.",
		}, func() float64 { return float64(b.rearms.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "lockproxy_zookeeper_leases_ended_total",
			Help: "Lock nodes lockproxy deleted because their lease ran out without a renewal.",
		}, func() float64 { return float64(b.leasesEnded.Load()) }),
	)
}
