package zookeeper

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestLongTTLGrantedAndRenewed proves that a TTL whose drift allowance
// (ttl × drift_factor + drift_min) exceeds the session's horizon still
// gets a validity: the allowance is counted on the time counted on (the
// horizon), not on the TTL. Counted on the TTL, a LOCK of a free key with
// it was "not acquired" and a RENEW of a held lock answered 0.
func TestLongTTLGrantedAndRenewed(t *testing.T) {
	t.Parallel()
	root := testRoot(t)
	const session = 4 * time.Second
	a := newBackend(t, []string{zkAddr}, root, session)
	const ttl = 500 * time.Second // 5 s of drift at 1 %; under locks.max_ttl's default
	l, err := lock(t, a, "long", "A", ttl, 0, backends.Write)
	if err != nil || l.Validity <= 0 || l.Validity > a.sessionHorizon() {
		t.Errorf("LOCK free key PX %v (session %v) = %+v, %v; want a grant within %v", ttl, session, l, err, a.sessionHorizon())
	}
	mustLock(t, a, "long2", "B", 10*time.Second, backends.Write)
	v, err := a.Renew(ctxT(t, 10*time.Second), "long2", "B", ttl)
	if err != nil || v == 0 {
		t.Errorf("RENEW of a held lock PX %v (session %v) = %v, %v; want a validity", ttl, session, v, err)
	}
	if !unlock(t, a, "long2", "B") {
		t.Errorf("UNLOCK after RENEW = false: the lock was held")
	}
}
