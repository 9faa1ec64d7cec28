package redis

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends/backendtest"
)

// TestLeaseTellsWhenMeasured runs backendtest.RunLeaseTellsWhenMeasured on
// three real nodes.
func TestLeaseTellsWhenMeasured(t *testing.T) {
	b, _ := newRealBackend(t, 3)
	backendtest.RunLeaseTellsWhenMeasured(t, ctxTimeout(t, 30*time.Second), b)
}
