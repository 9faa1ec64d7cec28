package redis

import (
	"slices"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestWaitReentryNotQueuedBehindItsWaiters: the holder's own LOCK (or,
// holding a read lock, RLOCK) … TOKEN … WAIT through the instance where
// writers wait for the key is a reentry, granted at once with the hold's
// fence, as it is without WAIT: it must not queue behind the waiters, who
// wait for that very holder. Before, it joined the queue's tail and ran
// out its whole WAIT unanswered. A waiter with a token of its own that
// holds nothing still waits its turn: the waiters ahead of it are granted
// first.
func TestWaitReentryNotQueuedBehindItsWaiters(t *testing.T) {
	b, _ := newRealBackend(t, 3)
	ctx := ctxTimeout(t, 30*time.Second)
	for _, tc := range []struct {
		name  string
		mode  backends.Mode // the holder's, its reentry's and X's
		ahead int           // writers queued before the holder's reentry
	}{
		{"write, behind one waiter", backends.Write, 1},
		{"write, behind three waiters", backends.Write, 3},
		{"read, behind one waiter", backends.Read, 1},
		{"read, behind three waiters", backends.Read, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "reentry-" + tc.name
			first, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "T", TTL: 10 * time.Second, Mode: tc.mode})
			if err != nil {
				t.Fatal(err)
			}
			type grant struct {
				who string
				err error
			}
			granted := make(chan grant, tc.ahead+1)
			wait := func(who string, mode backends.Mode) {
				_, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: who, TTL: 10 * time.Second, Wait: 10 * time.Second, Mode: mode})
				granted <- grant{who, err}
			}
			for i := range tc.ahead {
				go wait("W"+string(rune('0'+i)), backends.Write)
				waitFor(t, "waiter queued", func() bool { return b.waiters.count(key) == i+1 })
			}
			// A token of its own that holds nothing: it queues.
			go wait("X", tc.mode)
			waitFor(t, "X queued", func() bool { return b.waiters.count(key) == tc.ahead+1 })

			start := time.Now()
			l, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: "T", TTL: 10 * time.Second, Wait: 3 * time.Second, Mode: tc.mode})
			took := time.Since(start)
			if err != nil {
				t.Fatalf("holder's LOCK … TOKEN … WAIT behind %d waiters = %v after %v; want a reentrant grant", tc.ahead, err, took)
			}
			if l.Holds != 2 || l.Fence != first.Fence {
				t.Errorf("reentry = holds %d fence %d; want holds 2 and the hold's fence %d", l.Holds, l.Fence, first.Fence)
			}
			if took > time.Second {
				t.Errorf("reentry granted after %v; want at once", took)
			}
			select {
			case g := <-granted:
				t.Fatalf("%s answered (%v) while T holds the key", g.who, g.err)
			default:
			}
			for range 2 {
				if ok, err := b.Unlock(ctx, key, "T"); !ok || err != nil {
					t.Fatalf("UNLOCK T = %v, %v", ok, err)
				}
			}
			// Granted in arrival order, X last: each releases at once.
			for i := range tc.ahead + 1 {
				var g grant
				select {
				case g = <-granted:
				case <-time.After(5 * time.Second):
					t.Fatalf("grant %d not within 5 s", i)
				}
				want := "X"
				if i < tc.ahead {
					want = "W" + string(rune('0'+i))
				}
				if g.err != nil || g.who != want {
					t.Fatalf("grant %d went to %s (%v); want %s", i, g.who, g.err, want)
				}
				if ok, err := b.Unlock(ctx, key, g.who); !ok || err != nil {
					t.Fatalf("UNLOCK %s = %v, %v", g.who, ok, err)
				}
			}
		})
	}
}

// TestWaitQueuesHolderLetsItsTokenIn: a waiter that names its token is
// signaled out of turn when the head was refused by that token's hold
// (heldBy), also when it joins after the refusal; one of another token,
// a reader, and one that joins after a release was announced (the hold
// may be gone: its attempt would be granted afresh) are not. A head
// granted with a token of its own is the holder its token's waiters join.
func TestWaitQueuesHolderLetsItsTokenIn(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(qs *waitQueues, join func(name string, read bool, token string))
		want []string // signaled, beyond the head
	}{
		{"joined before the refusal", func(qs *waitQueues, join func(string, bool, string)) {
			join("T", false, "T")
			join("X", false, "X")
			join("R", true, "")
			join("TR", true, "T") // a downgrade
			qs.heldBy("k", "T")
		}, []string{"T", "TR"}},
		{"readers hold: every reader that names its token", func(qs *waitQueues, join func(string, bool, string)) {
			join("R", true, "R")
			join("r", true, "")
			join("W", false, "W")
			qs.heldBy("k", readMarker)
		}, []string{"R"}},
		{"readers hold: a reader refused out of turn is not let in again", func(qs *waitQueues, join func(string, bool, string)) {
			join("R", true, "R")
			join("S", true, "S")
			qs.heldBy("k", readMarker)
			<-qs.keys["k"].head.next.turn // R tries
			qs.refusedOutOfTurn(qs.keys["k"].head.next)
			qs.heldBy("k", readMarker)
		}, []string{"S"}},
		{"joined after the refusal", func(qs *waitQueues, join func(string, bool, string)) {
			qs.heldBy("k", "T")
			join("T", false, "T")
			join("X", false, "X")
		}, []string{"T"}},
		{"no one holder", func(qs *waitQueues, join func(string, bool, string)) {
			qs.heldBy("k", "")
			join("T", false, "T")
		}, nil},
		{"joined after a release was announced", func(qs *waitQueues, join func(string, bool, string)) {
			qs.heldBy("k", "T")
			qs.wake("k", 0)
			join("T", false, "T")
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			qs := newWaitQueues(2, 0)
			head, _ := qs.join("k", false)
			<-head.turn
			ws := map[string]*waiter{}
			tc.run(qs, func(name string, read bool, token string) {
				ws[name], _ = qs.joinToken("k", read, token)
			})
			if got := drained(ws, turnOf); !slices.Equal(got, tc.want) {
				t.Errorf("signaled %v; want %v", got, tc.want)
			}
		})
	}

	t.Run("granted head's token", func(t *testing.T) {
		qs := newWaitQueues(2, 0)
		head, _ := qs.joinToken("k", false, "H")
		<-head.turn
		next, _ := qs.join("k", false)
		qs.leaveHeld(head, true, time.Now().Add(time.Second))
		if !qs.isHead(next) {
			t.Fatal("the waiter behind the granted head is not the head")
		}
		h, _ := qs.joinToken("k", false, "H")
		o, _ := qs.joinToken("k", false, "O")
		if got := drained(map[string]*waiter{"H": h, "O": o}, turnOf); !slices.Equal(got, []string{"H"}) {
			t.Errorf("signaled %v; want [H]", got)
		}
	})
}
