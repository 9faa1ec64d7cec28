package redis

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

// countCommands counts the commands (top-level arrays) in a RESP write.
func countCommands(t *testing.T, n *Node, w []byte) int {
	t.Helper()
	c := &nodeConn{n: n, rd: bufio.NewReader(bytes.NewReader(w))}
	k := 0
	var r reply
	for {
		if _, err := c.rd.Peek(1); err != nil {
			return k
		}
		if err := c.read(&r); err != nil {
			t.Fatalf("parsing the write: %v", err)
		}
		k++
	}
}

// Whatever mix of debts a write carries, readDebts reads exactly
// as many answers as writeDebts wrote commands (the next answer on the
// connection is the batch's own).
func TestOwedDebtsReadInStep(t *testing.T) {
	n := &Node{log: zap.NewNop(), prefix: "lp:", fenceKey: "lp:fences"}
	for _, answer := range []string{"$0\r\n\r\n", "$9\r\nid=9 a=b\n\r\n", "-NOPERM no\r\n", ":1\r\n"} {
		for _, run := range []string{"run", "other", ""} {
			t.Run(fmt.Sprintf("%q/%s", answer, run), func(t *testing.T) {
				now := time.Now()
				o := &owed{}
				fw := unansweredFences{
					{base: "f", token: "t", fence: 12, start: now, ms: 5000},
					{base: "g", token: "u", fence: 13, start: now, ms: 5000},
				}
				// Killed connection 7 (fences owed, sweeps watched), then a
				// connection 9 not killed (a release on it), then one
				// without id (blind).
				o.lost([]*op{{kind: opAcquire, base: "a", token: "t", ms: 5000}}, fw, 7, "run", now)
				o.lost([]*op{{kind: opRelease, base: "y", token: "v"}}, fw, 9, "run", now)
				o.lost(nil, fw, 0, "", now)
				o.releases = append(o.releases, owedRelease{base: "r", token: "t", owedTime: owedTime{now, time.Second}})
				for round := 0; round < 6; round++ {
					at := now.Add(time.Duration(round) * 300 * time.Millisecond)
					c := sweepConn(n, run, "")
					n.writeDebts(c, o, at)
					k := countCommands(t, n, c.wbuf)
					// Answer every command: the CLIENT LIST one with answer
					// (the last command, when one was sent), the others :1.
					if round == 2 && k > 1 {
						// The connection fails after half the answers.
						var half strings.Builder
						for i := 0; i < k/2; i++ {
							half.WriteString(":1\r\n")
						}
						c.rd = bufio.NewReader(strings.NewReader(half.String()))
						if err := n.readDebts(c, o, &reply{}); err == nil {
							t.Fatalf("round %d: no error reading half the answers", round)
						}
						o.lost(nil, nil, 11, run, at)
						continue
					}
					var in strings.Builder
					for i := 0; i < k; i++ {
						if i == k-1 && len(o.inCheck) > 0 {
							in.WriteString(answer)
						} else {
							in.WriteString(":1\r\n")
						}
					}
					in.WriteString("+SENTINEL\r\n")
					c.rd = bufio.NewReader(strings.NewReader(in.String()))
					var r reply
					if err := n.readDebts(c, o, &r); err != nil {
						t.Fatalf("round %d: %v", round, err)
					}
					if err := c.read(&r); err != nil || string(r.s) != "SENTINEL" {
						t.Fatalf("round %d: after the debts read %q %v (wrote %d commands); want the sentinel", round, r.s, err, k)
					}
					if o.reading() {
						t.Fatalf("round %d: still reading after readDebts", round)
					}
				}
			})
		}
	}
}

// A node busy running another client's long script answers every
// command with -BUSY (Redis 7.0: CLIENT LIST and EVAL alike). That answer
// says nothing ran: a sweep whose connection is gone must stay owed (sent
// again once the node serves commands), and a check answered so must not
// turn the sweep blind for good (swept only until the write's lease ends,
// after which a write still held on the link lands and stays a lease).
func TestOwedSweepsBusyIsNotAnAnswer(t *testing.T) {
	n := &Node{log: zap.NewNop(), prefix: "lp:"}
	now := time.Now()
	busy := "-BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.\r\n"
	fw := unansweredFences{{base: "f", token: "t", fence: 12, start: now, ms: 5000}}
	rel := []*op{{kind: opRelease, base: "y", token: "v"}}

	// The check answered -BUSY: still watched, asked again.
	o := &owed{}
	o.lost(rel, fw, 9, "run", now)
	c := sweepConn(n, "run", busy)
	n.writeDebts(c, o, now)
	if err := n.readDebts(c, o, &reply{}); err != nil {
		t.Fatal(err)
	}
	if s := o.sweeps[0]; s.state != sweepWatched {
		t.Errorf("sweep state %d after a -BUSY check; want watched (%d)", s.state, sweepWatched)
	}

	// The sweep of a connection gone answered -BUSY: still owed.
	o = &owed{}
	o.lost(rel, fw, 9, "run", now)
	c = sweepConn(n, "other-run", busy) // a restart: gone
	n.writeDebts(c, o, now)
	if err := n.readDebts(c, o, &reply{}); err != nil {
		t.Fatal(err)
	}
	if len(o.sweeps) != 1 || !o.due() {
		t.Errorf("sweeps %+v after a -BUSY answer to the sweep; want it owed still", o.sweeps)
	}
}
