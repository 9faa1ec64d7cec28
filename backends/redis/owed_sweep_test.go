package redis

import (
	"bufio"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

// sweepConn is a connection to the server run whose answers are the
// RESP in answers.
func sweepConn(n *Node, run, answers string) *nodeConn {
	return &nodeConn{n: n, run: run, rd: bufio.NewReader(strings.NewReader(answers))}
}

// TestOwedSweeps: a connection dropped without a kill, with a fence write
// that stores a lockf unanswered on it, owes that write a sweep. The next
// write asks whether the connection is gone (CLIENT LIST ID); while the
// node lists it nothing is swept and the next check waits for the pace;
// once it does not, the next write carries the sweep (sweepFenceScript),
// paid when answered.
func TestOwedSweeps(t *testing.T) {
	n := &Node{log: zap.NewNop(), prefix: "lp:"}
	now := time.Now()
	o := &owed{}
	fences := unansweredFences{
		{base: "f", token: "t", fence: 12, start: now, ms: 5000},
		{base: "g", token: "t", fence: 13, start: now, ms: 5000, gone: true},
		{base: "h", token: "t", fence: 14, start: now.Add(-6 * time.Second), ms: 5000},
	}
	o.lost([]*op{{kind: opRelease, base: "y", token: "v"}}, fences, 9, "run", now)
	if len(o.kills) != 0 || len(o.sweeps) != 1 || o.sweeps[0].base != "f" || o.due() || !o.watching() {
		t.Fatalf("kills %d, sweeps %+v; want no kill, f's sweep watched", len(o.kills), o.sweeps)
	}

	// Still listed: nothing swept, asked again no sooner than the pace.
	c := sweepConn(n, "run", "$14\r\nid=9 addr=x:1\n\r\n")
	n.writeDebts(c, o, now)
	if got := string(c.wbuf); !strings.Contains(got, "CLIENT\r\n$4\r\nLIST\r\n$2\r\nID\r\n$1\r\n9\r\n") || strings.Contains(got, scriptSweepFence.src) {
		t.Fatalf("wrote %q; want CLIENT LIST ID 9 alone", got)
	}
	if err := n.readDebts(c, o, &reply{}); err != nil {
		t.Fatal(err)
	}
	if s := o.sweeps[0]; s.state != sweepWatched || s.listed.IsZero() || o.due() {
		t.Fatalf("sweep %+v after the node listed its connection; want watched, listed", s)
	}
	c = sweepConn(n, "run", "")
	n.writeDebts(c, o, now.Add(10*time.Millisecond))
	if len(c.wbuf) != 0 || o.reading() {
		t.Fatalf("wrote %q before the pace; want nothing", c.wbuf)
	}

	// Gone: the next write sweeps, once.
	c = sweepConn(n, "run", "$0\r\n\r\n")
	n.writeDebts(c, o, now.Add(time.Second))
	if err := n.readDebts(c, o, &reply{}); err != nil {
		t.Fatal(err)
	}
	if !o.due() || o.sweeps[0].state != sweepGone {
		t.Fatalf("sweep %+v after the node no longer listed its connection; want it due", o.sweeps[0])
	}
	c = sweepConn(n, "run", ":1\r\n")
	n.writeDebts(c, o, now.Add(time.Second))
	if got := string(c.wbuf); !strings.Contains(got, scriptSweepFence.src) || !strings.Contains(got, "lp:lockf:f") || !strings.Contains(got, "$2\r\n12\r\n") || strings.Contains(got, "LIST") {
		t.Fatalf("wrote %q; want f's sweep alone", got)
	}
	if err := n.readDebts(c, o, &reply{}); err != nil {
		t.Fatal(err)
	}
	if !o.empty() {
		t.Fatalf("owed %+v after the sweep was answered; want nothing", o)
	}
}

// TestOwedSweepsUnanswered: a sweep whose answer was lost with its
// connection is sent again; so is a check.
func TestOwedSweepsUnanswered(t *testing.T) {
	n := &Node{log: zap.NewNop(), prefix: "lp:"}
	now := time.Now()
	o := &owed{}
	o.lost([]*op{{kind: opRelease, base: "y", token: "v"}}, unansweredFences{{base: "f", token: "t", fence: 12, start: now, ms: 5000}}, 9, "run", now)
	c := sweepConn(n, "other-run", "") // a restart: the connection is gone
	n.writeDebts(c, o, now)
	if got := string(c.wbuf); !strings.Contains(got, scriptSweepFence.src) || strings.Contains(got, "LIST") || o.inSweeps != 1 {
		t.Fatalf("wrote %q on a restarted server; want f's sweep, no check", got)
	}
	o.lost(nil, nil, 10, "other-run", now) // failed before any answer
	if len(o.sweeps) != 1 || o.sweeps[0].sent || o.inSweeps != 0 || !o.due() {
		t.Fatalf("sweeps %+v after the failure; want f's owed still", o.sweeps)
	}
	c = sweepConn(n, "other-run", "")
	n.writeDebts(c, o, now)
	if !strings.Contains(string(c.wbuf), scriptSweepFence.src) {
		t.Fatalf("wrote %q; want f's sweep again", c.wbuf)
	}
}

// TestOwedSweepsBlind: where the connection cannot be asked about (its id
// or server not known, CLIENT LIST refused), its writes are swept at the
// pace until their lease ends, and no longer.
func TestOwedSweepsBlind(t *testing.T) {
	n := &Node{log: zap.NewNop(), prefix: "lp:"}
	now := time.Now()
	fw := unansweredFences{{base: "f", token: "t", fence: 12, start: now, ms: 5000}}
	for _, tc := range []struct {
		name string
		lose func(o *owed)
	}{
		{"no client id", func(o *owed) { o.lost(nil, fw, 0, "run", now) }},
		{"no run_id", func(o *owed) { o.lost(nil, fw, 9, "", now) }},
		{"CLIENT LIST refused", func(o *owed) {
			o.lost([]*op{{kind: opRelease, base: "y", token: "v"}}, fw, 9, "run", now)
			c := sweepConn(n, "run", "-NOPERM no permissions\r\n")
			n.writeDebts(c, o, now)
			if err := n.readDebts(c, o, &reply{}); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := &owed{}
			tc.lose(o)
			if len(o.sweeps) != 1 || o.sweeps[0].state != sweepBlind {
				t.Fatalf("sweeps %+v; want f's, blind", o.sweeps)
			}
			swept := 0
			for at := time.Duration(0); at < 7*time.Second; at += 10 * time.Millisecond {
				c := sweepConn(n, "run", strings.Repeat(":0\r\n", 2))
				n.writeDebts(c, o, now.Add(at))
				if strings.Contains(string(c.wbuf), scriptSweepFence.src) {
					swept++
					if at >= 5*time.Second {
						t.Fatalf("swept at %v, past the lease", at)
					}
				}
				if err := n.readDebts(c, o, &reply{}); err != nil {
					t.Fatal(err)
				}
			}
			// Paced from 50 ms, doubled up to a second: 50 ms, 100 ms, …
			if swept < 5 || swept > 12 || !o.empty() {
				t.Errorf("swept %d times within the lease, owed %+v after it; want paced sweeps, then nothing", swept, o)
			}
		})
	}
}

// TestOwedSweepsListed: a connection the node lists keeps its write's
// sweep owed one lease past the last time it was listed (the write may
// land until it is gone, and lasts one lease).
func TestOwedSweepsListed(t *testing.T) {
	n := &Node{log: zap.NewNop(), prefix: "lp:"}
	t0 := time.Now().Add(-900 * time.Millisecond)
	o := &owed{}
	o.lost([]*op{{kind: opRelease, base: "y", token: "v"}}, unansweredFences{{base: "f", token: "t", fence: 12, start: t0, ms: 1000}}, 9, "run", t0)
	c := sweepConn(n, "run", "$9\r\nid=9 a=b\n\r\n")
	n.writeDebts(c, o, time.Now())
	if err := n.readDebts(c, o, &reply{}); err != nil {
		t.Fatal(err)
	}
	o.prune(t0.Add(1500 * time.Millisecond))
	if len(o.sweeps) != 1 {
		t.Fatal("the sweep of a listed connection was dropped at its write's lease end")
	}
	o.prune(o.sweeps[0].listed.Add(time.Second))
	if !o.empty() {
		t.Fatalf("owed %+v a lease after the connection was last listed; want nothing", o)
	}
}

// TestWriterNeverDroppedOwesNothing: a writer owes nothing (owed nil)
// until a connection is dropped with an acquire in doubt or a fence
// write that stores a lockf; one dropped with a mark's clearing alone
// owes nothing either.
func TestWriterNeverDroppedOwesNothing(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name   string
		fences []fenceWrite
		owes   bool
	}{
		{"nothing", nil, false},
		{"a mark's clearing alone", []fenceWrite{{base: "f", token: "t", start: now, ms: 1000, gone: true, mark: true}}, false},
		{"a lockf with a mark's clearing", []fenceWrite{{base: "f", token: "t", start: now, ms: 1000, mark: true}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &writer{fenceWrites: tc.fences}
			w.lost(&nodeConn{id: 9, run: "run"}, []*op{{kind: opRelease, base: "y", token: "v"}})
			if owes := w.owed != nil && len(w.owed.sweeps) > 0; owes != tc.owes {
				t.Errorf("owes a sweep: %v; want %v", owes, tc.owes)
			}
		})
	}
}

func TestListedClientIDs(t *testing.T) {
	list := "id=5 addr=/tmp/x.sock:0 laddr=/tmp/x.sock:0 fd=7 name= cmd=client|list\nid=123 addr=1.2.3.4:5\r\nnoise\n"
	if got := listedClientIDs([]byte(list)); !slices.Equal(got, []int64{5, 123}) {
		t.Errorf("ids %v; want [5 123]", got)
	}
	if got := listedClientIDs(nil); len(got) != 0 {
		t.Errorf("ids of an empty list %v; want none", got)
	}
}

// TestSweepFenceScript: a sweep deletes lockf only where it is its
// write's value and the token does not hold the key.
func TestSweepFenceScript(t *testing.T) {
	_, r := nodeOnRedis(t)
	direct := r.Client(t)
	ctx := ctxTimeout(t, 10*time.Second)
	for i, tc := range []struct {
		name, lock, lockf string
		swept             bool
	}{
		{"the key free", "", "12,T", true},
		{"another token's hold", "U", "12,T", true},
		{"the token's hold", "T", "12,T", false},
		{"another write's lockf", "", "13,T", false},
		{"another token's lockf", "", "12,U", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := fmt.Sprint("sweep", i)
			if tc.lock != "" {
				if err := direct.Set(ctx, "lp:lock:"+key, tc.lock, time.Minute).Err(); err != nil {
					t.Fatal(err)
				}
			}
			if err := direct.Set(ctx, "lp:lockf:"+key, tc.lockf, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			got, err := direct.Eval(ctx, scriptSweepFence.src, []string{"lp:lock:" + key, "lp:lockf:" + key}, "T", 12).Int64()
			if err != nil {
				t.Fatal(err)
			}
			left := direct.Exists(ctx, "lp:lockf:"+key).Val()
			if swept := got == 1; swept != tc.swept || swept != (left == 0) {
				t.Errorf("answered %d, lockf left %d; want swept %v", got, left, tc.swept)
			}
		})
	}
}
