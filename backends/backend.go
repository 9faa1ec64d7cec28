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
	// NoReentry refuses the lock even to its current holder's token, as
	// SET NX does (transparent mode).
	NoReentry bool
	// OwnToken says that Token was made by lockproxy for this one request
	// (LOCK or RLOCK without TOKEN) and no other request will use it: it
	// holds nothing on any node but what this request's attempts made, so
	// a refused attempt's roll-back cannot take anything it should not,
	// and the backend may send it without waiting for the nodes still
	// unheard (a silent node would hold the answer up by about two node
	// timeouts). Never set for a token of the client's.
	OwnToken bool
	// Keepalive: the caller will keep the lock alive by renewing it
	// through this backend instance (KEEPALIVE). A backend whose lease this
	// instance cannot keep for a hold it would join (ZooKeeper: a node in
	// another instance's session) answers ErrKeepaliveElsewhere instead of
	// adding the hold.
	Keepalive bool
}

// String is the word LOCKINFO shows for m.
func (m Mode) String() string {
	if m == Read {
		return "read"
	}
	return "write"
}

// MinValidity is the least validity a grant or a renewal answers (see
// Lease.Validity and Renew): replies give whole milliseconds, so less would
// read as 0, which RENEW answers for a lock no longer held. A grant or a
// renewal that would leave less came too late to be of use.
const MinValidity = time.Millisecond

// Lease is a granted lock.
type Lease struct {
	Token string
	// Validity is how long the holder may act as the holder, counted from
	// when the backend's attempt that granted it was sent, less the clock
	// drift allowance. It is at least 1 ms: replies give it in whole
	// milliseconds, so less would read as 0. A grant that would leave
	// less is taken back and answered as not acquired, as one whose
	// validity ran out is.
	Validity time.Duration
	// Fence is strictly greater than the fence of every earlier exclusive
	// grant of the key. A reentrant grant returns the fence of the hold it
	// joins; read grants carry the key's current fence.
	Fence uint64
	// Holds is the token's hold count after this grant (1 for a first
	// grant, more for a reentrant one).
	Holds int64
	// At is when Validity was measured, if the backend says (zero: as
	// Lock returns). The time from then to the reply, a goroutine's
	// hand-off or a process paused in between, is lease gone by, which
	// the reply takes off (commands: toldValidity).
	At time.Time
}

// Holder is one token holding a lock, as LOCKINFO reports it.
type Holder struct {
	Token string
	Holds int64
	// TTL is what is left of this holder's lease as a majority sees it.
	TTL time.Duration
}

// LockInfo is the state of one key, as LOCKINFO reports it.
type LockInfo struct {
	Mode    Mode
	Holders []Holder
	// TTL is the shortest lease left among the holders, as a majority
	// sees it (conservative).
	TTL   time.Duration
	Fence uint64
	// Waiters is the number of clients waiting for the key on this
	// lockproxy instance.
	Waiters int
}

// ErrNotAcquired means the lock is held by someone else (and WAIT, if
// given, ran out).
var ErrNotAcquired = errors.New("backends: lock not acquired")

// ErrUpgrade means a read holder asked for the write lock with its own
// token. Upgrading is refused: two readers upgrading at once would wait
// for each other forever.
var ErrUpgrade = errors.New("backends: read lock held by this token; upgrade to write is not supported")

// ErrKeepaliveElsewhere means a LockRequest with Keepalive would join a
// hold whose lease this instance cannot keep alive: its renewals through
// this instance would promise no validity (ZooKeeper: the token's node
// lives in another lockproxy instance's session). Nothing was added.
var ErrKeepaliveElsewhere = errors.New("backends: the token's hold is kept by another instance; KEEPALIVE cannot renew it here")

// ErrTooLarge means the lock store cannot take a request this big: a key
// or token past what one request to it may carry (ZooKeeper's packet
// limit). Clients are told so, not answered an internal error.
var ErrTooLarge = errors.New("backends: key or token too long for the lock store")

// LossNotifier is implemented by backends that learn of lost locks by
// themselves, sooner than a renewal would (a ZooKeeper session that
// expired). OnLost sets the function called, on a goroutine of the
// backend's, with each lock lost that way; it must not block for long.
type LossNotifier interface {
	OnLost(func(key, token string))
}

// HoldKeeper is implemented by backends that can release and renew one
// kind of a token's holds. A token may hold a key both for writing and for
// reading (a downgrade), and the two holds may have different keepers: a
// KEEPALIVE watchdog that keeps only the read hold must release and renew
// that one, where Unlock would release the write hold first and Renew
// would reset the write lease to the read TTL, ending early a write hold
// its holder was told it has for its whole validity.
type HoldKeeper interface {
	// UnlockHold releases one hold of key by token of the kind mode says;
	// false when token holds no hold of that kind.
	UnlockHold(ctx context.Context, key, token string, mode Mode) (bool, error)
	// RenewHold raises the lease of token's holds of key of the kind mode
	// says to ttl, never shortening it (unlike Renew, which sets it), and
	// returns the validity ttl gives, or 0 when token holds no hold of
	// that kind: a KEEPALIVE watchdog renews every hold of the token of
	// that kind, also those taken without KEEPALIVE, whose holders were
	// told a lease of their own. It never shortens the token's hold of
	// the other kind either: renewing a read hold leaves the write lease
	// at least as long as it was, and renewing a write hold may extend
	// the read lease with it (as Renew does) but never shortens it. As
	// Renew, it answers 0 for a validity under 1 ms.
	RenewHold(ctx context.Context, key, token string, mode Mode, ttl time.Duration) (time.Duration, error)
}

// HoldRenewerFrom is a HoldKeeper that also says from when the validity a
// renewal answers counts. A validity counts from the answer, and a caller
// that counts it from when it sent the renewal (to stay on the safe side
// of a reply it cannot time) counts the nodes' wait twice: on a busy host,
// where renewals wait long in the nodes' queues, that cut the lease a
// KEEPALIVE watchdog believed it had by as much as the wait, and the next
// renewal had that much less time to get through.
type HoldRenewerFrom interface {
	// RenewHoldFrom is RenewHold; validity counts from from, which is no
	// later than when the lock store measured it. from is zero when
	// validity is 0.
	RenewHoldFrom(ctx context.Context, key, token string, mode Mode, ttl time.Duration) (validity time.Duration, from time.Time, err error)
}

// RenewHoldFrom is RenewHold with the time its validity counts from: b's
// HoldRenewerFrom's, or otherwise when the renewal was sent, which counts
// the wait twice but never past the validity the lock store measured.
func RenewHoldFrom(ctx context.Context, b Backend, key, token string, mode Mode, ttl time.Duration) (time.Duration, time.Time, error) {
	if hr, ok := b.(HoldRenewerFrom); ok {
		return hr.RenewHoldFrom(ctx, key, token, mode, ttl)
	}
	sent := time.Now()
	validity, err := RenewHold(ctx, b, key, token, mode, ttl)
	if err != nil || validity <= 0 {
		return validity, time.Time{}, err
	}
	return validity, sent, nil
}

// UnlockHold releases one hold of key by token of the kind mode says,
// through b's HoldKeeper. A backend without one releases with Unlock,
// write holds first, which is right unless token also holds the other kind.
func UnlockHold(ctx context.Context, b Backend, key, token string, mode Mode) (bool, error) {
	if hk, ok := b.(HoldKeeper); ok {
		return hk.UnlockHold(ctx, key, token, mode)
	}
	return b.Unlock(ctx, key, token)
}

// RenewHold renews token's hold of key of the kind mode says, through b's
// HoldKeeper. A backend without one renews with Renew, in whichever mode,
// which is right unless token also holds the other kind.
func RenewHold(ctx context.Context, b Backend, key, token string, mode Mode, ttl time.Duration) (time.Duration, error) {
	if hk, ok := b.(HoldKeeper); ok {
		return hk.RenewHold(ctx, key, token, mode, ttl)
	}
	return b.Renew(ctx, key, token, ttl)
}

// Backend serves lock commands. Every method returns by the time ctx is
// done.
type Backend interface {
	// Lock acquires req, waiting up to req.Wait. It returns ErrNotAcquired
	// when the lock stayed held, or an error that says why the lock store
	// could not decide.
	//
	// Write: exclusive. When req.Token already holds the write lock the
	// grant is reentrant: one more hold, the lease reset to req.TTL, the
	// same fence. When req.Token holds a read lock, ErrUpgrade.
	//
	// Read: shared with other readers, exclusive with writers; each
	// reader's lease is its own. When req.Token holds the write lock the
	// read grant is a downgrade: the token then holds both, and the write
	// hold is released with UNLOCK as usual. Once a writer waits, new
	// readers wait behind it (writer preference).
	Lock(ctx context.Context, req LockRequest) (Lease, error)
	// Unlock releases one hold of key by token (write holds before read
	// holds when a downgraded token has both); false when token does not
	// hold key.
	Unlock(ctx context.Context, key, token string) (bool, error)
	// Renew resets the lease of key held by token (in whichever mode) to
	// ttl and returns the new validity, or 0 when token no longer holds
	// key. A renewal that would leave a validity under 1 ms answers 0 too
	// (the caller must no longer count on the key, which may stay held
	// until the lease set ends): a positive answer is at least 1 ms, as
	// Lease.Validity is.
	Renew(ctx context.Context, key, token string, ttl time.Duration) (time.Duration, error)
	// Info reports the state of key; ok is false when nobody holds it.
	Info(ctx context.Context, key string) (info LockInfo, ok bool, err error)
	// Ready reports whether enough of the lock store answers to grant locks.
	Ready(ctx context.Context) error
	// Close releases the backend's resources.
	Close() error
}
