package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockproxy/lockproxy/backends"
)

// readyBackend answers Ready with err; the admin endpoints call nothing
// else.
type readyBackend struct {
	backends.Backend
	err error
}

func (b readyBackend) Ready(context.Context) error { return b.err }

// TestAdminPprofPeers: /debug/pprof/ answers loopback peers, and others
// only with admin_pprof; the other endpoints answer every peer.
func TestAdminPprofPeers(t *testing.T) {
	tests := []struct {
		name     string
		peer     string // the request's RemoteAddr
		anywhere bool   // admin_pprof
		path     string
		want     int
	}{
		{"IPv4 loopback", "127.0.0.1:50000", false, "/debug/pprof/", http.StatusOK},
		{"other loopback address", "127.0.0.2:50000", false, "/debug/pprof/", http.StatusOK},
		{"IPv6 loopback", "[::1]:50000", false, "/debug/pprof/", http.StatusOK},
		{"IPv4-mapped loopback", "[::ffff:127.0.0.1]:50000", false, "/debug/pprof/", http.StatusOK},
		{"remote IPv4", "10.0.0.7:50000", false, "/debug/pprof/", http.StatusForbidden},
		{"remote IPv6", "[2001:db8::7]:50000", false, "/debug/pprof/", http.StatusForbidden},
		{"remote, a profile", "10.0.0.7:50000", false, "/debug/pprof/heap", http.StatusForbidden},
		{"remote, symbol", "10.0.0.7:50000", false, "/debug/pprof/symbol", http.StatusForbidden},
		{"remote, cpu profile", "10.0.0.7:50000", false, "/debug/pprof/profile?seconds=1", http.StatusForbidden},
		{"remote, trace", "10.0.0.7:50000", false, "/debug/pprof/trace?seconds=1", http.StatusForbidden},
		{"unparsable peer", "somewhere", false, "/debug/pprof/", http.StatusForbidden},
		{"remote with admin_pprof", "10.0.0.7:50000", true, "/debug/pprof/", http.StatusOK},
		{"remote, metrics", "10.0.0.7:50000", false, "/metrics", http.StatusOK},
		{"remote, healthz", "10.0.0.7:50000", false, "/healthz", http.StatusOK},
		{"remote, readyz", "10.0.0.7:50000", false, "/readyz", http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mux := adminMux(prometheus.NewRegistry(), readyBackend{}, tt.anywhere, new(atomic.Bool))
			req := httptest.NewRequest(http.MethodGet, tt.path, nil)
			req.RemoteAddr = tt.peer
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, req)
			if rec.Code != tt.want {
				t.Errorf("GET %s from %s (admin_pprof %v) = %d %q; want %d", tt.path, tt.peer, tt.anywhere, rec.Code, rec.Body.String(), tt.want)
			}
		})
	}
}

// TestReadyzDraining: /readyz is 503 "draining" once the drain started,
// whatever the backend says.
func TestReadyzDraining(t *testing.T) {
	tests := []struct {
		name     string
		backend  error
		draining bool
		want     int
		body     string
	}{
		{"ready", nil, false, http.StatusOK, "ready\n"},
		{"no quorum", errors.New("1/3 nodes"), false, http.StatusServiceUnavailable, "not ready: 1/3 nodes\n"},
		{"draining", nil, true, http.StatusServiceUnavailable, "draining\n"},
		{"draining, no quorum", errors.New("1/3 nodes"), true, http.StatusServiceUnavailable, "draining\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var draining atomic.Bool
			draining.Store(tt.draining)
			mux := adminMux(prometheus.NewRegistry(), readyBackend{err: tt.backend}, false, &draining)
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			if rec.Code != tt.want || rec.Body.String() != tt.body {
				t.Errorf("GET /readyz = %d %q; want %d %q", rec.Code, rec.Body.String(), tt.want, tt.body)
			}
		})
	}
}
