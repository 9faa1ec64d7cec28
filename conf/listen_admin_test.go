package conf

import (
	"slices"
	"strings"
	"testing"
)

// TestListenAdminClash: listen and admin on one port of one host (or one
// of them on every interface) cannot both bind, so lockproxy would fail
// at start with "address already in use" after check-config said ok.
// Validate names the clash under admin; different hosts or ports pass.
func TestListenAdminClash(t *testing.T) {
	const clash = "admin: "
	tests := []struct {
		name          string
		listen, admin string
		clash         bool
	}{
		{"same address", "127.0.0.1:7380", "127.0.0.1:7380", true},
		{"same port, listen on every interface", ":7380", "127.0.0.1:7380", true},
		{"same port, admin on every interface", "127.0.0.1:7380", "0.0.0.0:7380", true},
		{"same port, IPv6 wildcard", "[::]:7380", "[::1]:7380", true},
		{"leading zero", "127.0.0.1:7380", "127.0.0.1:07380", true},
		{"host case", "LocalHost:7380", "localhost:7380", true},
		{"defaults", "127.0.0.1:7380", "127.0.0.1:9380", false},
		{"same port, other hosts", "127.0.0.1:7380", "127.0.0.2:7380", false},
		{"admin disabled", "127.0.0.1:7380", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.Dev = true
			c.Listen, c.Admin = tt.listen, tt.admin
			got := problems(t, c.Validate())
			has := slices.ContainsFunc(got, func(p string) bool { return strings.HasPrefix(p, clash) })
			if has != tt.clash || len(got) > 1 {
				t.Errorf("Validate(listen %q, admin %q) = %q; want a clash under admin: %v (and nothing else)", tt.listen, tt.admin, got, tt.clash)
			}
		})
	}
}
