// Package ops tests what operators load next to lockproxy: the Prometheus
// alerting rules in deploy/prometheus (promtool checks and unit-tests
// them, and every metric they name is one a running lockproxy exports)
// and the README's metrics table (every metric lockproxy exports is in
// it, and nothing else).
package ops
