package main

import (
	"strings"
	"testing"

	"github.com/lockproxy/lockproxy/conf"
)

// TestDevBannerCommandConnects: the --dev banner's "Try:" lines are the
// first thing a new user runs, so they must reach the listener as
// configured. redis-cli without -h dials 127.0.0.1, so a listener on
// another address needs -h; a TLS listener needs --tls (and its CA); a
// password needs AUTH (--askpass, which keeps it off the screen and out
// of the shell's history). Before, the banner always said
// "redis-cli -p PORT", which was refused or answered NOAUTH.
func TestDevBannerCommandConnects(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(*conf.Config)
		addr    string
		want    string
		notWant []string
	}{
		{"loopback", func(*conf.Config) {}, "127.0.0.1:7380", "redis-cli -p 7380 LOCK demo PX 10000", []string{"-h ", "--tls", "--askpass"}},
		{"wildcard", func(*conf.Config) {}, "[::]:7380", "redis-cli -p 7380 LOCK demo PX 10000", []string{"-h "}},
		{"other loopback address", func(*conf.Config) {}, "127.0.0.2:27415", "redis-cli -p 27415 -h 127.0.0.2 LOCK demo", nil},
		{"IPv6 loopback", func(*conf.Config) {}, "[::1]:7380", "redis-cli -p 7380 -h ::1 LOCK demo", nil},
		{"password", func(c *conf.Config) { c.Auth.Password = "s3cret" }, "127.0.0.1:7380",
			"redis-cli -p 7380 --askpass LOCK demo", []string{"s3cret"}},
		{"named users", func(c *conf.Config) { c.Auth.Users = []string{"app:s3cret"} }, "127.0.0.1:7380",
			"redis-cli -p 7380 --user <user> --askpass LOCK demo", []string{"s3cret"}},
		{"tls", func(c *conf.Config) { c.TLS.Enabled = true }, "127.0.0.1:7380",
			"redis-cli -p 7380 --tls --cacert <CA file> LOCK demo", nil},
		{"mutual tls", func(c *conf.Config) { c.TLS.Enabled, c.TLS.ClientCAFile = true, "ca.pem" }, "127.0.0.1:7380",
			"redis-cli -p 7380 --tls --cacert <CA file> --cert <client cert> --key <client key> LOCK demo", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := conf.Default()
			c.Dev = true
			tt.edit(&c)
			got := devBanner(c, nil, tt.addr)
			if !strings.Contains(got, tt.want) {
				t.Errorf("banner lacks %q:\n%s", tt.want, got)
			}
			for _, bad := range tt.notWant {
				if strings.Contains(got, bad) {
					t.Errorf("banner has %q:\n%s", bad, got)
				}
			}
		})
	}
}
