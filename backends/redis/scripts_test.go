package redis

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
)

// TestLockScripts runs sequences of operations on one real redis-server
// node and checks each answer and, at the end, what LockState reports:
// reentrancy, read locks, downgrade, refused upgrade, writer marks, and
// the roll-back releases that take only one kind of hold.
func TestLockScripts(t *testing.T) {
	n, _ := nodeOnRedis(t)
	ctx := ctxTimeout(t, 30*time.Second)

	type step struct {
		op    string // lock, rlock, lockwait (a writer that will wait), unlock, unlockw, unlockr, renew, sleep
		token string
		ttl   time.Duration
		want  string // lock: "grant h=N", "held", "upgrade"; unlock/renew: "1" or "0"
	}
	const long = 10 * time.Second
	for _, tc := range []struct {
		name  string
		steps []step
		// final state: "" free, else "w:<token>:<holds>" or "r:<tok>=<holds>,…" (sorted)
		state string
	}{
		{"reentrant holds count down", []step{
			{"lock", "a", long, "grant h=1"},
			{"lock", "a", long, "grant h=2"},
			{"lock", "b", long, "held"},
			{"unlock", "a", 0, "1"},
			{"lock", "b", long, "held"},
		}, "w:a:1"},
		{"free at zero", []step{
			{"lock", "a", long, "grant h=1"},
			{"lock", "a", long, "grant h=2"},
			{"unlock", "a", 0, "1"},
			{"unlock", "a", 0, "1"},
			{"unlock", "a", 0, "0"},
		}, ""},
		{"readers share, writer refused", []step{
			{"rlock", "r1", long, "grant h=1"},
			{"rlock", "r2", long, "grant h=1"},
			{"rlock", "r1", long, "grant h=2"},
			{"lock", "w", long, "held"},
			{"unlock", "r2", 0, "1"},
			{"unlock", "x", 0, "0"},
		}, "r:r1=2"},
		{"one reader's expiry ends only its own lease", []step{
			{"rlock", "short", 50 * time.Millisecond, "grant h=1"},
			{"rlock", "long", long, "grant h=1"},
			{"sleep", "", 120 * time.Millisecond, ""},
			{"renew", "short", long, "0"},
			{"renew", "long", long, "1"},
			{"lock", "w", long, "held"},
		}, "r:long=1"},
		{"last reader out frees it", []step{
			{"rlock", "r1", long, "grant h=1"},
			{"unlock", "r1", 0, "1"},
			{"lock", "w", long, "grant h=1"},
		}, "w:w:1"},
		{"writer holds: readers refused", []step{
			{"lock", "w", long, "grant h=1"},
			{"rlock", "r", long, "held"},
		}, "w:w:1"},
		{"waiting writer stops new readers, not old ones", []step{
			{"rlock", "r1", long, "grant h=1"},
			{"lockwait", "w", long, "held"},
			{"rlock", "r2", long, "held"},
			{"rlock", "r1", long, "grant h=2"},
			{"unlock", "r1", 0, "1"},
			{"unlock", "r1", 0, "1"},
			{"lockwait", "w", long, "grant h=1"},
			{"unlock", "w", 0, "1"},
			{"rlock", "r2", long, "grant h=1"},
		}, "r:r2=1"},
		{"downgrade, then the write hold goes first", []step{
			{"lock", "a", long, "grant h=1"},
			{"rlock", "a", long, "grant h=1"},
			{"rlock", "b", long, "held"},
			{"unlock", "a", 0, "1"},
			{"rlock", "b", long, "grant h=1"},
			{"lock", "c", long, "held"},
		}, "r:a=1,b=1"},
		{"upgrade refused, roll-back keeps the read hold", []step{
			{"rlock", "a", long, "grant h=1"},
			{"lock", "a", long, "upgrade"},
			{"unlockw", "a", 0, "0"},
		}, "r:a=1"},
		{"roll-back of a downgrade takes the read hold only", []step{
			{"lock", "a", long, "grant h=1"},
			{"rlock", "a", long, "grant h=1"},
			{"unlockr", "a", 0, "1"},
			{"unlockr", "a", 0, "0"},
		}, "w:a:1"},
		{"roll-back of a reentrant attempt takes one hold", []step{
			{"lock", "a", long, "grant h=1"},
			{"lock", "a", long, "grant h=2"},
			{"unlockw", "a", 0, "1"},
		}, "w:a:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := fmt.Sprintf("scripts-%s-%d", t.Name(), time.Now().UnixNano())
			var fence uint64
			for i, s := range tc.steps {
				var got string
				switch s.op {
				case "lock", "rlock", "lockwait":
					req := quorum.Request{Key: key, Token: s.token, TTL: s.ttl}
					if s.op == "rlock" {
						req.Mode = quorum.Shared
					}
					if s.op == "lockwait" {
						req.WriterWait = time.Second
					}
					g, err := n.Acquire(ctx, req)
					switch {
					case err != nil:
						t.Fatalf("step %d %v: %v", i, s, err)
					case g.Acquired:
						got = fmt.Sprintf("grant h=%d", g.Holds)
						if s.op != "rlock" && g.Holds > 1 && g.Fence != fence {
							t.Errorf("step %d %v: reentrant fence %d; want the hold's %d", i, s, g.Fence, fence)
						}
						if s.op != "rlock" && g.Holds == 1 {
							fence = g.Fence
						}
					case g.Upgrade:
						got = "upgrade"
					default:
						got = "held"
					}
				case "unlock", "unlockw", "unlockr":
					hold := map[string]quorum.Hold{"unlock": quorum.AnyHold, "unlockw": quorum.WriteHold, "unlockr": quorum.ReadHold}[s.op]
					ok, err := n.Release(ctx, key, s.token, hold)
					if err != nil {
						t.Fatalf("step %d %v: %v", i, s, err)
					}
					got = map[bool]string{true: "1", false: "0"}[ok]
				case "renew":
					ok, err := n.Extend(ctx, key, s.token, s.ttl)
					if err != nil {
						t.Fatalf("step %d %v: %v", i, s, err)
					}
					got = map[bool]string{true: "1", false: "0"}[ok]
				case "sleep":
					time.Sleep(s.ttl)
					continue
				}
				if got != s.want {
					t.Fatalf("step %d %s %s: %s; want %s", i, s.op, s.token, got, s.want)
				}
			}
			st, err := n.LockState(ctx, key)
			if err != nil {
				t.Fatalf("LockState: %v", err)
			}
			if got := describeState(st); got != tc.state {
				t.Errorf("final state %q; want %q", got, tc.state)
			}
		})
	}
}

// describeState renders a node's lock state for comparison.
func describeState(st nodeLockState) string {
	switch {
	case !st.held:
		return ""
	case st.value != readMarker:
		return fmt.Sprintf("w:%s:%d", st.value, st.extraHolds+1)
	}
	var toks []string
	for tok := range st.readers {
		toks = append(toks, tok)
	}
	slices.Sort(toks)
	s := "r:"
	for i, tok := range toks {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprintf("%s=%d", tok, st.readers[tok].holds)
	}
	return s
}

// TestCombineLockStates: LOCKINFO reports a holder only when a majority
// has it, with the values a majority reaches and the fence the hold was
// granted, and answers NOQUORUM ("undecided") when nodes that did not
// answer could make another token a holder.
func TestCombineLockStates(t *testing.T) {
	w := func(tok string, ttl time.Duration, holds int64, fence uint64) nodeLockState {
		return nodeLockState{held: true, value: tok, ttl: ttl, extraHolds: holds - 1, fence: fence}
	}
	wc := func(tok string, fence, counter uint64) nodeLockState {
		st := w(tok, 900, 1, fence)
		st.counter = counter
		return st
	}
	r := func(counter uint64, readers map[string]readerState) nodeLockState {
		return nodeLockState{held: true, value: readMarker, readers: readers, counter: counter}
	}
	free := nodeLockState{}
	for _, tc := range []struct {
		name   string
		states []nodeLockState
		failed int
		want   string
		need   int // 0: 2, three nodes
	}{
		{"writer on all", []nodeLockState{w("a", 900, 2, 5), w("a", 800, 2, 5), w("a", 700, 1, 5)}, 0, "write a h=2 ttl=800ns fence=5", 0},
		{"writer on a minority", []nodeLockState{w("a", 900, 1, 5), free, free}, 0, "free", 0},
		{"writer on a majority", []nodeLockState{w("a", 900, 1, 5), free, w("a", 500, 1, 5)}, 0, "write a h=1 ttl=500ns fence=5", 0},
		// A node that answered the grant late stores its own fence: the
		// one the majority stored is the one granted, higher or lower.
		{"late node stored a higher fence", []nodeLockState{wc("a", 11, 11), wc("a", 1, 1), wc("a", 1, 1)}, 0, "write a h=1 ttl=900ns fence=1", 0},
		{"late node stored a lower fence", []nodeLockState{wc("a", 3, 3), wc("a", 9, 9), wc("a", 9, 9)}, 0, "write a h=1 ttl=900ns fence=9", 0},
		// A lost fence store leaves the node's counter, which refused
		// rivals raise: it must not outvote the stored fences.
		{"lost store, counter raised", []nodeLockState{wc("a", 0, 7), wc("a", 1, 1), wc("a", 1, 1)}, 0, "write a h=1 ttl=900ns fence=1", 0},
		// No majority stored one fence: a node storing none may hold a
		// grant made after another holder's, up to its counter, which
		// the fence must not fall below (quorum.HoldFence).
		{"no store on a majority", []nodeLockState{wc("a", 0, 7), wc("a", 4, 4), wc("a", 0, 6)}, 0, "write a h=1 ttl=900ns fence=7", 0},
		{"nothing stored", []nodeLockState{wc("a", 0, 7), wc("a", 0, 6), free}, 0, "write a h=1 ttl=900ns fence=7", 0},
		{"readers", []nodeLockState{
			r(3, map[string]readerState{"x": {900, 1}, "y": {300, 1}}),
			r(4, map[string]readerState{"x": {800, 2}}),
			r(4, map[string]readerState{"x": {700, 2}, "y": {200, 1}}),
		}, 0, "read x h=2 ttl=800ns y h=1 ttl=200ns ttl=200ns fence=4", 0},
		{"reader on a minority only", []nodeLockState{
			r(3, map[string]readerState{"x": {900, 1}}), free, free,
		}, 0, "free", 0},
		// One node of three did not answer.
		{"writer on a majority, one failed", []nodeLockState{w("a", 900, 1, 5), w("a", 800, 1, 5)}, 1, "write a h=1 ttl=800ns fence=5", 0},
		// The failed node may have stored either fence: which one the
		// grant told is not known.
		{"fences split, one failed", []nodeLockState{wc("a", 11, 11), wc("a", 1, 1)}, 1, "undecided", 0},
		{"fence and a lost store, one failed", []nodeLockState{wc("a", 0, 7), wc("a", 1, 1)}, 1, "undecided", 0},
		// The failed node may hold as many as the higher count: the
		// majority's count is 1 or 2.
		{"hold counts split, one failed", []nodeLockState{w("a", 900, 2, 5), w("a", 900, 1, 5)}, 1, "undecided", 0},
		{"reader's hold counts split, one failed", []nodeLockState{
			r(3, map[string]readerState{"x": {900, 2}}),
			r(3, map[string]readerState{"x": {900, 1}}),
		}, 1, "undecided", 0},
		{"writer on one of two, one failed", []nodeLockState{w("a", 900, 1, 5), free}, 1, "undecided", 0},
		{"reader on one of two, one failed", []nodeLockState{r(3, map[string]readerState{"x": {900, 1}}), free}, 1, "undecided", 0},
		{"free on both, one failed", []nodeLockState{free, free}, 1, "free", 0},
		{"reader on both, another on one, one failed", []nodeLockState{
			r(3, map[string]readerState{"x": {900, 1}, "y": {900, 1}}),
			r(3, map[string]readerState{"x": {900, 1}}),
		}, 1, "undecided", 0},
		// The failed node may be one of the majority at the reader's
		// fence: the counter of the node that lags is no bound.
		{"reader on both, counters apart, one failed", []nodeLockState{
			r(5, map[string]readerState{"x": {900, 1}}),
			r(2, map[string]readerState{"x": {800, 1}}),
		}, 1, "read x h=1 ttl=800ns ttl=800ns fence=5", 0},
		// x holds the key for reading on the first two, the second for
		// writing too (a downgrade whose write hold is on a minority).
		{"reader on a majority, one of it downgraded", []nodeLockState{
			r(3, map[string]readerState{"x": {900, 1}}),
			{held: true, value: "x", ttl: 900, readers: map[string]readerState{"x": {800, 1}}, counter: 3},
			free,
		}, 0, "read x h=1 ttl=800ns ttl=800ns fence=3", 0},
		// Five nodes, two failed: a token on one of three answers could
		// hold a majority.
		{"writer on one of three, two failed", []nodeLockState{w("a", 900, 1, 5), free, free}, 2, "undecided", 3},
		{"writer on three of three, two failed", []nodeLockState{w("a", 900, 1, 5), w("a", 900, 1, 5), w("a", 900, 1, 5)}, 2, "write a h=1 ttl=900ns fence=5", 3},
		{"writers split, two failed", []nodeLockState{w("a", 900, 1, 5), w("b", 900, 1, 6), free}, 2, "undecided", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			need := tc.need
			if need == 0 {
				need = 2
			}
			info, ok, decided := combineLockStates(tc.states, need, tc.failed, func(d time.Duration) time.Duration { return d })
			got := "free"
			switch {
			case !decided:
				got = "undecided"
			case ok:
				got = info.Mode.String()
				for _, h := range info.Holders {
					got += fmt.Sprintf(" %s h=%d ttl=%v", h.Token, h.Holds, h.TTL)
				}
				if info.Mode.String() == "read" {
					got += fmt.Sprintf(" ttl=%v", info.TTL)
				} else if info.TTL != info.Holders[0].TTL {
					t.Errorf("TTL %v; want the holder's %v", info.TTL, info.Holders[0].TTL)
				}
				got += fmt.Sprintf(" fence=%d", info.Fence)
			}
			if got != tc.want {
				t.Errorf("combine = %q; want %q", got, tc.want)
			}
		})
	}
}
