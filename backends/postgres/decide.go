package postgres

import (
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// row is one live holder row of a key.
type row struct {
	token string
	mode  backends.Mode
	holds int64
	fence uint64
	left  time.Duration // lease left, by the database's clock
}

// action is what a lock attempt does after reading the key's live rows.
type action uint8

const (
	actGrant   action = iota // insert a first hold with a new fence
	actReenter               // add a hold to the token's own row
	actBusy                  // someone else holds (or a writer waits)
	actUpgrade               // a reader asked for the write lock: refused
	actKeyBusy               // a retry found the key's advisory lock taken
)

func (a action) String() string {
	return [...]string{"grant", "reenter", "busy", "upgrade", "key busy"}[a]
}

// decide is the lock decision, taken under the key's advisory lock from the
// key's live rows (rows) and whether a writer waits for it. left is the
// shortest lease among the conflicting holders (0 when unknown), so that a
// waiter can retry when it ends.
func decide(req backends.LockRequest, rows []row, writerWaits bool) (act action, left time.Duration) {
	var ownWrite, ownRead bool
	var otherWrite, otherRead bool
	for _, r := range rows {
		own := r.token == req.Token
		switch {
		case own && r.mode == backends.Write:
			ownWrite = true
		case own:
			ownRead = true
		case r.mode == backends.Write:
			otherWrite = true
		default:
			otherRead = true
		}
		if !own && (req.Mode == backends.Write || r.mode == backends.Write) && (left == 0 || r.left < left) {
			left = max(r.left, time.Millisecond)
		}
	}
	if req.Mode == backends.Write {
		switch {
		case ownWrite && req.NoReentry:
			return actBusy, left
		case ownWrite:
			return actReenter, 0
		case ownRead:
			return actUpgrade, 0
		case otherWrite || otherRead:
			return actBusy, left
		}
		return actGrant, 0
	}
	switch {
	case ownRead && req.NoReentry:
		return actBusy, left
	case ownRead:
		// A reader that already holds re-enters even behind a waiting
		// writer: that writer waits for this very hold.
		return actReenter, 0
	case ownWrite:
		// Downgrade: no other holder can exist.
		return actGrant, 0
	case otherWrite:
		return actBusy, left
	case writerWaits:
		return actBusy, 0
	}
	return actGrant, 0
}

// validity is what a lease of ttl is worth to its holder after elapsed
// (lockproxy's monotonic clock, from before the first statement was sent
// to after the commit's reply), less the clock drift allowance.
func validity(ttl, elapsed time.Duration, driftFactor float64, driftMin time.Duration) time.Duration {
	drift := time.Duration(float64(ttl)*driftFactor) + driftMin
	return ttl - elapsed - drift
}
