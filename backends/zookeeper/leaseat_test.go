package zookeeper

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends/backendtest"
)

// TestLeaseTellsWhenMeasured runs backendtest.RunLeaseTellsWhenMeasured on
// real ZooKeeper. Before, its grants left Lease.At zero, and LOCK told the
// validity as measured, whatever time passed before the reply.
func TestLeaseTellsWhenMeasured(t *testing.T) {
	t.Parallel()
	a := newBackend(t, []string{zkAddr}, testRoot(t), 30*time.Second)
	backendtest.RunLeaseTellsWhenMeasured(t, ctxT(t, 30*time.Second), a)
}
