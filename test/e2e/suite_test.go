package e2e

import (
	"testing"

	"github.com/lockproxy/lockproxy/test/suite"
)

// TestSharedSuite runs the suite both backends share on RedLock over three
// real nodes (test/zk runs it on ZooKeeper).
func TestSharedSuite(t *testing.T) {
	suite.Run(t, func(t *testing.T) string {
		cl := startCluster(t, 3)
		addr, _ := startProxy(t, cl.addrs())
		return addr
	})
}
