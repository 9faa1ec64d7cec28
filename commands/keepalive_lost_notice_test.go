package commands

import (
	"testing"
	"time"
)

// TestLostNoticeIsByKeyAndToken proves that a lost-lock notice is kept by
// key and token: a command with a token (UNLOCK, RENEW, LOCK … TOKEN)
// takes only its own token's notice, never another token's of the same
// key; a LOCK without TOKEN still takes every notice of its key, once.
// Before, the notice was kept by key, and UNLOCK key t2 answered
// -LOCKLOST for t1's loss and was not run: t2's KEEPALIVE lock stayed,
// kept alive by another connection, although its holder sent UNLOCK.
func TestLostNoticeIsByKeyAndToken(t *testing.T) {
	ka := newConnKeepalive(time.Now, func([]byte) bool { return true }, func() {}, 2)
	ka.tellLost("k", "t1", "why", 1)
	for _, other := range [][2]string{{"k", "t2"}, {"k2", "t1"}} {
		if _, lost := ka.takeLostToken([]byte(other[0]), []byte(other[1])); lost {
			t.Errorf("notice taken for key %s token %s; want only for k t1", other[0], other[1])
		}
	}
	if why, lost := ka.takeLostToken([]byte("k"), []byte("t1")); !lost || why != "why" {
		t.Errorf("takeLostToken(k, t1) = %q, %v; want the notice", why, lost)
	}
	if _, lost := ka.takeLostToken([]byte("k"), []byte("t1")); lost {
		t.Error("notice given twice")
	}
	ka.tellLost("k", "t1", "why1", 1)
	ka.tellLost("k", "t2", "why2", 1)
	if _, lost := ka.takeLost([]byte("k")); !lost {
		t.Error("takeLost(k) (LOCK without TOKEN) found no notice; want one")
	}
	if _, lost := ka.takeLostToken([]byte("k"), []byte("t2")); lost || ka.nLost != 0 {
		t.Errorf("notices left after takeLost(k): %d; want none (each given once)", ka.nLost)
	}
}
