package redis

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
)

// TestBatchOfRoundsLeavesNoFence: a node that lags gets several LOCK,
// UNLOCK cycles of one key in one batch (each holder heard of its grant
// from the other nodes). Every grant the batch released must have its
// fence write left out: written after the batch, that of the first
// holder stored a lockf naming a token that no longer held the key, for
// its whole lease (TestUnlockRightAfterLockLeavesNoKey, under load: the
// lockf of the second-to-last round left on a node). A hold the batch
// keeps still gets its fence.
func TestBatchOfRoundsLeavesNoFence(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 10*time.Second)
	for _, tc := range []struct {
		name   string
		tokens []string // each acquires in turn, and releases but for the last when keep
		keep   bool
	}{
		{"every round released", []string{"t1", "t2", "t3"}, false},
		{"the last hold kept", []string{"t1", "t2", "t3"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "rounds-" + tc.name
			now := time.Now()
			mk := func(kind opKind, tok string) *op {
				return &op{kind: kind, base: key, token: tok, mode: quorum.Exclusive, hold: quorum.AnyHold, ms: 10000, slot: slot(key),
					start: now, deadline: now.Add(5 * time.Second), res: make(chan opResult, 1)}
			}
			var batch []*op
			for i, tok := range tc.tokens {
				batch = append(batch, mk(opAcquire, tok))
				if !tc.keep || i < len(tc.tokens)-1 {
					batch = append(batch, mk(opRelease, tok))
				}
			}
			ops := append([]*op(nil), batch...)
			w := &writer{}
			defer w.drop()
			n.exec(w, batch)
			// The fence writes sent are answered: they ran.
			n.readPending(w)
			var last opResult
			for i, o := range ops {
				res := <-o.res
				if res.err != nil || res.n < 1 {
					t.Fatalf("op %d (%s of %s) = %+v; want granted or released", i, opNames[o.kind], o.token, res)
				}
				if o.kind == opAcquire {
					last = res
				}
			}
			lockf, err := direct.Get(ctx, "lp:lockf:"+key).Result()
			switch {
			case !tc.keep && err == nil:
				t.Errorf("lockf %q after every hold was released in its batch; want none", lockf)
			case tc.keep && lockf != formatFence(last.n, "t3"):
				t.Errorf("lockf %q (%v) with t3's hold kept; want its fence %d", lockf, err, last.n)
			}
		})
	}
}
