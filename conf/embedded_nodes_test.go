package conf

import (
	"slices"
	"strings"
	"testing"
)

// TestEmbeddedNodes: --dev starts its three in-process nodes only on the
// RedLock backend with no redlock.nodes given; with nodes, or on another
// backend, the locks are real ones. Every consequence of dev follows that
// one answer: the TLS refusal (only the embedded nodes speak no TLS), the
// warnings (the throwaway-locks one only for embedded nodes, the node
// count one for every real node list, --dev or not), so that none of them
// speaks of embedded nodes while real ones serve the locks.
func TestEmbeddedNodes(t *testing.T) {
	one := []string{"127.0.0.1:7001"}
	three := []string{"127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"}
	tests := []struct {
		name         string
		dev          bool
		backend      string
		nodes        []string
		embedded     bool
		tlsRefused   bool     // redlock.tls.enabled is a problem
		warn, noWarn []string // substrings of some warning / of none
	}{
		{"dev alone", true, BackendRedlock, nil, true, true,
			[]string{"dev: embedded in-process nodes are for trying out only"}, []string{"redlock.nodes:"}},
		{"dev with three nodes", true, BackendRedlock, three, false, false,
			[]string{"dev: redlock.nodes are given, so no embedded nodes start"}, []string{"embedded in-process nodes are for trying out", "redlock.nodes:"}},
		{"dev with one node", true, BackendRedlock, one, false, false,
			[]string{"redlock.nodes: 1 node(s) tolerate no node failure"}, []string{"embedded in-process nodes are for trying out"}},
		{"one node without dev", false, BackendRedlock, one, false, false,
			[]string{"redlock.nodes: 1 node(s) tolerate no node failure"}, []string{"dev:"}},
		{"dev on zookeeper", true, BackendZookeeper, nil, false, false,
			[]string{"dev: the zookeeper backend starts no embedded nodes"}, []string{"embedded in-process nodes are for trying out"}},
		{"dev on postgres", true, BackendPostgres, nil, false, false,
			[]string{"dev: the postgres backend starts no embedded nodes"}, []string{"embedded in-process nodes are for trying out"}},
		{"no dev", false, BackendRedlock, three, false, false, nil, []string{"dev:", "redlock.nodes:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.Dev, c.Backend, c.Redlock.Nodes = tt.dev, tt.backend, tt.nodes
			c.Zookeeper.Servers = []string{"127.0.0.1:2181"}
			c.Postgres.DSN = "postgres://127.0.0.1/locks"
			if got := c.EmbeddedNodes(); got != tt.embedded {
				t.Errorf("EmbeddedNodes() = %v; want %v", got, tt.embedded)
			}

			c.Redlock.TLS.Enabled = true
			const refusal = "redlock.tls.enabled: the --dev nodes speak no TLS"
			if got := slices.Contains(problems(t, c.Validate()), refusal); got != tt.tlsRefused {
				t.Errorf("Validate() refuses redlock.tls.enabled: %v; want %v", got, tt.tlsRefused)
			}
			c.Redlock.TLS.Enabled = false

			warnings := strings.Join(c.Warnings(), "\n")
			for _, s := range tt.warn {
				if !strings.Contains(warnings, s) {
					t.Errorf("Warnings() lack %q:\n%s", s, warnings)
				}
			}
			for _, s := range tt.noWarn {
				if strings.Contains(warnings, s) {
					t.Errorf("Warnings() have %q:\n%s", s, warnings)
				}
			}
		})
	}
}
