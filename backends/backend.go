// Package backends defines the Backend interface that lock commands are
// served from. Implementations live in subpackages: backends/redis runs
// RedLock over independent Redis nodes.
package backends

import (
	"context"
	"errors"
	"time"
)

// Mode says whether a lock is exclusive (write) or shared (read).
type Mode uint8

const (
	// Write is an exclusive lock.
	Write Mode = iota
	// Read is a shared lock.
	Read
)

// LockRequest is one LOCK or RLOCK.
type LockRequest struct {
	Key   string
	Token string
	TTL   time.Duration
	// Wait is how long to keep trying; 0 means try once.
	Wait time.Duration
	Mode Mode
}

// Lease is a granted lock.
type Lease struct {
	Token    string
	Validity time.Duration
	Fence    uint64
}

// ErrNotAcquired means the lock is held by someone else (and WAIT, if
// given, ran out).
var ErrNotAcquired = errors.New("backends: lock not acquired")

// Backend serves lock commands. Every method returns by the time ctx is
// done.
type Backend interface {
	// Lock acquires req, waiting up to req.Wait. It returns ErrNotAcquired
	// when the lock stayed held, or an error that says why the lock store
	// could not decide.
	Lock(ctx context.Context, req LockRequest) (Lease, error)
	// Unlock releases one hold of key by token; false when token does not
	// hold key.
	Unlock(ctx context.Context, key, token string) (bool, error)
	// Renew resets the lease of key held by token to ttl and returns the
	// new validity, or 0 when token no longer holds key.
	Renew(ctx context.Context, key, token string, ttl time.Duration) (time.Duration, error)
	// Ready reports whether enough of the lock store answers to grant locks.
	Ready(ctx context.Context) error
	// Close releases the backend's resources.
	Close() error
}
