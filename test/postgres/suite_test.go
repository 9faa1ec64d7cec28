package postgres

import (
	"testing"

	"github.com/lockproxy/lockproxy/test/suite"
)

// TestSharedSuite runs the suite every backend shares on PostgreSQL
// (test/e2e runs it on RedLock, test/zk on ZooKeeper).
func TestSharedSuite(t *testing.T) {
	suite.Run(t, func(t *testing.T) string {
		return startInstance(t, shared.DSN(), newPrefix()).addr
	})
}
