package zk

import (
	"testing"

	"github.com/lockproxy/lockproxy/test/suite"
)

// TestSharedSuite runs the suite both backends share on the ZooKeeper
// ensemble (test/e2e runs it on RedLock).
func TestSharedSuite(t *testing.T) {
	suite.Run(t, func(t *testing.T) string {
		return startInstance(t, zkServers(), newRoot(t)).addr
	})
}
