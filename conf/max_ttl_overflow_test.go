package conf

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestMaxTTLQuarantineFits: a restarted node is kept out of quorums for
// locks.max_ttl plus drift on it (backends/redis QuarantinePeriod). A
// max_ttl so long that this overflows time.Duration made the period
// negative, so that a node that forgot its locks voted again at once;
// Validate refuses it, and takes the longest that fits.
func TestMaxTTLQuarantineFits(t *testing.T) {
	const maxDuration = time.Duration(1<<63 - 1)
	tests := []struct {
		name   string
		maxTTL time.Duration
		drift  float64
		bad    bool
	}{
		{"default", 10 * time.Minute, 0.01, false},
		{"a century", 100 * 365 * 24 * time.Hour, 0.01, false},
		{"the longest duration", maxDuration, 0.01, true},
		{"just past the longest that fits", time.Duration(float64(maxDuration) / 1.01), 0.01, true},
		{"2500000h with no drift factor", 2500000 * time.Hour, 0, false},
		{"2562047h", 2562047 * time.Hour, 0.01, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.Dev = true
			c.Locks.MaxTTL = tt.maxTTL
			c.Redlock.DriftFactor = tt.drift
			got := problems(t, c.Validate())
			has := slices.ContainsFunc(got, func(p string) bool { return strings.HasPrefix(p, "locks.max_ttl: ") })
			if has != tt.bad || len(got) > 1 {
				t.Errorf("Validate(max_ttl %v, drift_factor %g) = %q; want a locks.max_ttl problem: %v (and nothing else)", tt.maxTTL, tt.drift, got, tt.bad)
			}
			if !has {
				// What the backend computes must then be positive.
				q := c.Locks.MaxTTL + time.Duration(float64(c.Locks.MaxTTL)*c.Redlock.DriftFactor) + c.Redlock.DriftMin
				if q <= 0 {
					t.Errorf("max_ttl %v passed, but its quarantine period is %v", tt.maxTTL, q)
				}
			}
		})
	}
}
