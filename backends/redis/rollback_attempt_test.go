package redis

import (
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
)

// TestLateRollbackOfLostAttemptKeepsHold: T holds the key (a LOCK without
// TOKEN) and its later reentrant attempt A was lost on a dropped
// connection without running (a doubt). A's roll-back waits in the queue
// past its deadline (the writer busy with that dropped connection); exec
// still sends it, as a new op. That op must stay A's roll-back: it
// settles A's doubt and goes out as lateGrantReleaseScript with A's mark,
// which finds no hold of A's and keeps T's. Before, the new op lost its
// roll-back flag and went out as a plain release, which took T's hold.
func TestLateRollbackOfLostAttemptKeepsHold(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 10*time.Second)
	const key, token, attempt = "late-rollback", "T", "attempt-A"
	if g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: token, TTL: 10 * time.Second, NoReentry: true}); err != nil || !g.Acquired {
		t.Fatalf("T's grant = %+v, %v", g, err)
	}
	now := time.Now()
	w := &writer{owed: &owed{doubts: []owedAcquire{{base: key, token: token, attempt: attempt, owedTime: owedTime{now, 10 * time.Second}}}}}
	defer w.drop()
	rb := &op{kind: opRelease, base: key, token: token, hold: quorum.WriteHold, rollback: true, attempt: attempt,
		start: now.Add(-2 * time.Second), deadline: now.Add(-time.Millisecond), res: make(chan opResult, 1)}
	n.exec(w, []*op{rb})
	<-rb.res
	if v := direct.Get(ctx, "lp:lock:"+key).Val(); v != token {
		t.Errorf("lock key %q after the late roll-back of an attempt that never ran; want T's hold kept", v)
	}
	if len(w.owed.doubts) != 0 {
		t.Errorf("doubts left %+v; want A's settled by its roll-back", w.owed.doubts)
	}
}

// TestRollbackOfUnsentAttemptKeepsHold: T holds the key and its reentrant
// attempt A is given up by the writer before it was sent (past its
// deadline); the quorum, which decided without this node's answer, rolls
// A back here. Nothing of A's is on the node, so the roll-back must not
// release anything: a release would take T's hold.
func TestRollbackOfUnsentAttemptKeepsHold(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 10*time.Second)
	const key, token = "unsent-attempt", "T"
	if g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: token, TTL: 10 * time.Second, NoReentry: true}); err != nil || !g.Acquired {
		t.Fatalf("T's grant = %+v, %v", g, err)
	}
	now := time.Now()
	a := n.acquireOp(quorum.Request{Key: key, Token: token, TTL: 10 * time.Second, Attempt: "attempt-A"})
	a.start, a.deadline, a.res = now.Add(-time.Second), now.Add(-time.Millisecond), make(chan opResult, 1)
	rb := &op{kind: opRelease, base: key, token: token, hold: quorum.WriteHold, rollback: true, attempt: "attempt-A",
		start: now, deadline: now.Add(5 * time.Second), res: make(chan opResult, 1)}
	w := &writer{}
	defer w.drop()
	n.exec(w, []*op{a})
	if ra := <-a.res; ra.err == nil || !quorum.Unsent(ra.err) {
		t.Fatalf("A past its deadline = %+v; want given up unsent", ra)
	}
	n.exec(w, []*op{rb})
	if rr := <-rb.res; rr.err != nil || rr.n != 0 {
		t.Errorf("roll-back of the unsent attempt = %+v; want answered 0", rr)
	}
	if v := direct.Get(ctx, "lp:lock:"+key).Val(); v != token {
		t.Errorf("lock key %q after the roll-back of an attempt never sent; want T's hold kept", v)
	}
}

// TestRollbackSettlesOnlyItsAttempt: a token's doubts are settled by the
// roll-back of the same attempt only. Attempt A won its majority though
// this node's answer was lost, so nothing rolls it back; a roll-back of
// the token's later attempt B that took A's doubt would carry A's mark
// and remove A's hold, which the token holds.
func TestRollbackSettlesOnlyItsAttempt(t *testing.T) {
	now := time.Now()
	o := &owed{doubts: []owedAcquire{{base: "k", token: "T", attempt: "A", owedTime: owedTime{now, time.Minute}}}}
	if _, ok := o.settle("k", "T", "B"); ok {
		t.Fatal("B's roll-back settled A's doubt")
	}
	if d, ok := o.settle("k", "T", "A"); !ok || d.attempt != "A" {
		t.Fatalf("A's roll-back: %+v, %v; want A's doubt", d, ok)
	}
	o.doubts = append(o.doubts, owedAcquire{base: "k", token: "G", owedTime: owedTime{now, time.Minute}})
	if _, ok := o.settle("k", "G", ""); !ok {
		t.Fatal("an unmarked attempt's roll-back did not settle its doubt")
	}
}

// TestHeldAcquireNotOvertakenInItsBatch: T holds the key, and one batch
// carries T's reentrant attempt, that attempt's roll-back (the quorum
// decided before this node answered) and U's SET NX. An acquire whose
// first step finds the key held used to finish in a second round trip,
// after the rest of its batch: the roll-back ran first and released T's
// hold, and U was granted the key while T held it. Now such an acquire is
// sent whole (acquireScript) when a later operation of the batch touches
// its key: it adds T's second hold, the roll-back removes it, and U is
// refused.
func TestHeldAcquireNotOvertakenInItsBatch(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 10*time.Second)
	const key = "reorder"
	if g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: "T", TTL: 10 * time.Second}); err != nil || !g.Acquired {
		t.Fatalf("T's grant = %+v, %v", g, err)
	}
	now := time.Now()
	a := n.acquireOp(quorum.Request{Key: key, Token: "T", TTL: 10 * time.Second, Attempt: "attempt-A"})
	a.start, a.deadline, a.res = now, now.Add(5*time.Second), make(chan opResult, 1)
	rb := &op{kind: opRelease, base: key, token: "T", hold: quorum.WriteHold, rollback: true, attempt: "attempt-A",
		start: now, deadline: now.Add(5 * time.Second), res: make(chan opResult, 1)}
	u := n.acquireOp(quorum.Request{Key: key, Token: "U", TTL: 10 * time.Second, NoReentry: true})
	u.start, u.deadline, u.res = now, now.Add(5*time.Second), make(chan opResult, 1)
	w := &writer{}
	defer w.drop()
	n.exec(w, []*op{a, rb, u})
	ra, rr, ru := <-a.res, <-rb.res, <-u.res
	if ra.err != nil || ra.holds != 2 || rr.err != nil || rr.n != 1 {
		t.Errorf("T's attempt %+v, its roll-back %+v; want a second hold, then it released", ra, rr)
	}
	if ru.err == nil && ru.n > 0 {
		t.Errorf("U granted (%+v) in the batch that carried T's reentrant attempt and its roll-back; T holds the key", ru)
	}
	st, err := n.LockState(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if got := describeState(st); got != "w:T:1" {
		t.Errorf("state after the batch %q; want T's one hold (w:T:1), lock key %q", got, direct.Get(ctx, "lp:lock:"+key).Val())
	}
}

// TestRollbackOfAttemptOutOfTheVoteKeepsHold: a node taken out of the vote
// (here: restarting) answers an acquire unsent without sending it, and
// lets releases out; the roll-back of that attempt, which the quorum sends
// when it decided without this node's answer, used to go out and release
// the hold T had before it. It is answered 0 unsent now, whether it comes
// in a later batch, in the attempt's own batch, or after the node refused
// the attempt before queuing it.
func TestRollbackOfAttemptOutOfTheVoteKeepsHold(t *testing.T) {
	n, _ := nodeOnRedis(t)
	ctx := ctxTimeout(t, 10*time.Second)
	for _, tc := range []string{"later batch", "same batch", "refused before queued"} {
		t.Run(tc, func(t *testing.T) {
			key := "out-of-the-vote-" + strings.ReplaceAll(tc, " ", "-")
			if g, err := n.Acquire(ctx, quorum.Request{Key: key, Token: "T", TTL: 10 * time.Second, NoReentry: true}); err != nil || !g.Acquired {
				t.Fatalf("T's grant = %+v, %v", g, err)
			}
			w := &writer{}
			defer w.drop()
			now := time.Now()
			attempt := "V-" + key
			req := quorum.Request{Key: key, Token: "T", TTL: 10 * time.Second, Attempt: attempt}
			a := n.acquireOp(req)
			a.start, a.deadline, a.res = now, now.Add(5*time.Second), make(chan opResult, 1)
			rb := &op{kind: opRelease, base: key, token: "T", hold: quorum.WriteHold, rollback: true, attempt: attempt,
				start: now, deadline: time.Now().Add(5 * time.Second), res: make(chan opResult, 1)}
			n.health.blocked.Store(blockRestart)
			switch tc {
			case "later batch":
				n.exec(w, []*op{a})
				n.exec(w, []*op{rb})
			case "same batch":
				n.exec(w, []*op{a, rb})
			case "refused before queued":
				got := make(chan error, 1)
				n.StartAcquire(ctx, req, func(_ quorum.NodeGrant, err error) { got <- err })
				if err := <-got; !quorum.Unsent(err) {
					t.Fatalf("attempt on a node out of the vote: %v; want unsent", err)
				}
				n.exec(w, []*op{rb})
			}
			if tc != "refused before queued" {
				if ra := <-a.res; !quorum.Unsent(ra.err) {
					t.Fatalf("attempt on a node out of the vote = %+v; want unsent", ra)
				}
			}
			rr := <-rb.res
			n.health.blocked.Store(0)
			st, err := n.LockState(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if s := describeState(st); rr.err != nil || rr.n != 0 || s != "w:T:1" {
				t.Errorf("roll-back of attempt V, never sent = %+v, state %q; want 0 and T's hold kept (w:T:1)", rr, s)
			}
		})
	}
}

// TestWholeUnnamedAcquireRolledBackByItsMark: a LOCK … WAIT without TOKEN
// (no attempt name) sharing a batch with another operation on its key is
// sent whole, as acquireScript, which stores the hold's fence in the same
// step. Its answer lost, the roll-back used the unnamed rule (no stored
// fence) and kept the hold until its TTL. The node now marks such a hold
// with a name of its own, which the doubt carries, and the roll-back
// removes the hold with that mark.
func TestWholeUnnamedAcquireRolledBackByItsMark(t *testing.T) {
	n, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 10*time.Second)
	const key = "whole-unnamed"
	now := time.Now()
	a := n.acquireOp(quorum.Request{Key: key, Token: "G", TTL: 10 * time.Second, NoReentry: true, WriterWait: time.Second})
	a.start, a.deadline, a.res = now, now.Add(5*time.Second), make(chan opResult, 1)
	u := n.acquireOp(quorum.Request{Key: key, Token: "U", TTL: 10 * time.Second, NoReentry: true})
	u.start, u.deadline, u.res = now, now.Add(5*time.Second), make(chan opResult, 1)
	w := &writer{}
	defer w.drop()
	n.exec(w, []*op{a, u})
	if ra, ru := <-a.res, <-u.res; ra.err != nil || ra.n <= 0 || ru.err != nil || ru.n > 0 {
		t.Fatalf("G's acquire %+v, U's %+v; want G granted, U refused", ra, ru)
	}
	if a.attempt != "" || a.mark == "" {
		t.Fatalf("G's acquire: attempt %q, mark %q; want no attempt and a mark", a.attempt, a.mark)
	}
	if m := direct.Get(ctx, "lp:lockm:"+key).Val(); m != "0,,G,"+a.mark {
		t.Fatalf("lockm %q; want G's hold marked with %q", m, a.mark)
	}
	// The answer lost: the dropped connection leaves G's acquire in doubt
	// with its mark.
	o := &owed{}
	o.lost([]*op{a}, nil, 0, "", time.Now())
	if len(o.doubts) != 1 || o.doubts[0].mark != a.mark || o.doubts[0].attempt != "" {
		t.Fatalf("doubts %+v; want G's, unnamed, with its mark", o.doubts)
	}
	w.owed = o
	rb := &op{kind: opRelease, base: key, token: "G", hold: quorum.WriteHold, rollback: true,
		start: time.Now(), deadline: time.Now().Add(5 * time.Second), res: make(chan opResult, 1)}
	n.exec(w, []*op{rb})
	if rr := <-rb.res; rr.err != nil || rr.n != 1 {
		t.Errorf("roll-back of G's lost acquire = %+v; want its hold removed (1)", rr)
	}
	if k := direct.Exists(ctx, "lp:lock:"+key, "lp:lockf:"+key, "lp:lockm:"+key).Val(); k != 0 {
		t.Errorf("%d of the hold's keys left after the roll-back; want none", k)
	}
}
