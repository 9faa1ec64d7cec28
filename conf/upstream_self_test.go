package conf

import (
	"slices"
	"strings"
	"testing"
)

// TestUpstreamIsNotTheListener: an upstream.address that is lockproxy's
// own listener sends every relayed command back into lockproxy, which
// relays it again: each failed as "upstream unavailable" after the
// handshake timed out, while check-config passed the file. Validate
// names it; another host or port passes.
func TestUpstreamIsNotTheListener(t *testing.T) {
	tests := []struct {
		name, listen, upstream string
		self                   bool
	}{
		{"same address", "127.0.0.1:7380", "127.0.0.1:7380", true},
		{"wildcard listener, loopback upstream", ":7380", "127.0.0.1:7380", true},
		{"wildcard listener, localhost upstream", "0.0.0.0:7380", "LOCALHOST:7380", true},
		{"IPv6 wildcard, ::1 upstream", "[::]:7380", "[::1]:7380", true},
		{"leading zero", "127.0.0.1:7380", "127.0.0.1:07380", true},
		{"another port", "127.0.0.1:7380", "127.0.0.1:6379", false},
		{"another host", "127.0.0.1:7380", "10.0.0.5:7380", false},
		{"wildcard listener, another host", ":7380", "10.0.0.5:7380", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.Dev = true
			c.Listen, c.Upstream.Address = tt.listen, tt.upstream
			got := problems(t, c.Validate())
			has := slices.ContainsFunc(got, func(p string) bool { return strings.HasPrefix(p, "upstream.address: ") })
			if has != tt.self || len(got) > 1 {
				t.Errorf("Validate(listen %q, upstream %q) = %q; want an upstream.address problem: %v (and nothing else)", tt.listen, tt.upstream, got, tt.self)
			}
		})
	}
}

// TestNodeIsNotTheListener: a lock node that is lockproxy's own listener
// is refused under its redlock.nodes entry, as an upstream is: before,
// check-config passed it and that node never answered a lock command.
func TestNodeIsNotTheListener(t *testing.T) {
	tests := []struct {
		name, listen string
		nodes        []string
		want         string // the problem's key, "" for none
	}{
		{"second node is the listener", "127.0.0.1:7380", []string{"127.0.0.1:7001", "127.0.0.1:7380", "127.0.0.1:7003"}, "redlock.nodes[1]: "},
		{"wildcard listener, localhost node", ":7380", []string{"localhost:7380", "10.0.0.2:7380", "10.0.0.3:7380"}, "redlock.nodes[0]: "},
		{"other ports", "127.0.0.1:7380", []string{"127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.Listen, c.Redlock.Nodes = tt.listen, tt.nodes
			got := problems(t, c.Validate())
			has := slices.ContainsFunc(got, func(p string) bool { return tt.want != "" && strings.HasPrefix(p, tt.want) })
			if (tt.want != "") != has || len(got) > 1 || (tt.want == "" && len(got) > 0) {
				t.Errorf("Validate(listen %q, nodes %q) = %q; want only a problem starting %q", tt.listen, tt.nodes, got, tt.want)
			}
		})
	}
}
