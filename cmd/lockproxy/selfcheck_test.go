package main

import (
	"bufio"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// TestSelfCheckTargets: the watchdog's self-check dials a wildcard
// listener at 127.0.0.1 first. Go serves a wildcard with one dual-stack
// socket, which 127.0.0.1 reaches, while [::1] fails on a host with IPv6
// disabled, where a self-check that always failed had systemd restart
// lockproxy every WatchdogSec. A listener on a given address is dialed
// there, an IPv6 one included.
func TestSelfCheckTargets(t *testing.T) {
	tests := []struct {
		name string
		addr net.Addr
		want []string
	}{
		{"IPv6 wildcard ([::]:port, and :port)", &net.TCPAddr{IP: net.IPv6unspecified, Port: 6380},
			[]string{"127.0.0.1:6380", "[::1]:6380"}},
		{"IPv4 wildcard", &net.TCPAddr{IP: net.IPv4zero, Port: 6380},
			[]string{"127.0.0.1:6380", "[::1]:6380"}},
		{"IPv4 wildcard, 4-byte form", &net.TCPAddr{IP: net.IPv4zero.To4(), Port: 6380},
			[]string{"127.0.0.1:6380", "[::1]:6380"}},
		{"no IP", &net.TCPAddr{Port: 6380},
			[]string{"127.0.0.1:6380", "[::1]:6380"}},
		{"IPv4 loopback", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 6380}, []string{"127.0.0.1:6380"}},
		{"IPv4 address", &net.TCPAddr{IP: net.IPv4(10, 0, 0, 5), Port: 6380}, []string{"10.0.0.5:6380"}},
		{"IPv6 loopback only", &net.TCPAddr{IP: net.IPv6loopback, Port: 6380}, []string{"[::1]:6380"}},
		{"IPv6 link-local with zone", &net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 6380, Zone: "eth0"},
			[]string{"[fe80::1%eth0]:6380"}},
		{"not TCP", &net.UnixAddr{Name: "/run/lockproxy.sock", Net: "unix"}, []string{"/run/lockproxy.sock"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := selfCheckTargets(tt.addr); !slices.Equal(got, tt.want) {
				t.Errorf("selfCheckTargets(%v) = %q; want %q", tt.addr, got, tt.want)
			}
		})
	}
}

// TestSelfCheckWildcard: selfCheck passes against a wildcard listener
// that answers PING, as lockproxy's does, through 127.0.0.1.
func TestSelfCheckWildcard(t *testing.T) {
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer c.Close()
				if _, err := bufio.NewReader(c).ReadString('\n'); err == nil {
					_, _ = c.Write([]byte("+PONG\r\n"))
				}
			}()
		}
	}()
	stats := func() (int64, int64) { return accepted.Load(), 0 }
	if err := selfCheck(ln.Addr(), false, stats, 2*time.Second); err != nil {
		t.Errorf("selfCheck(%v) = %v; want nil", ln.Addr(), err)
	}
}
