package e2e

import (
	"testing"

	"github.com/lockproxy/lockproxy/test/suite"
)

// TestConformance checks PROTOCOL.md's lock commands option by option on
// RedLock over three real nodes (test/zk and test/postgres run the same).
func TestConformance(t *testing.T) {
	suite.RunConformance(t, func(t *testing.T) string {
		cl := startCluster(t, 3)
		addr, _ := startProxy(t, cl.addrs())
		return addr
	})
}
