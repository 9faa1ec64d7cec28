package fault

import (
	"fmt"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// A second opinion on the ledger, from github.com/anishathalye/porcupine:
// each grant's critical section is one operation on its key's counter,
// from Enter to Exit, returning the value it read and whether its write
// was accepted. The history must be linearizable against a counter that
// an accepted write advances by one from the value read, and that a
// rejected (stale) write leaves alone. It knows nothing of validity or
// fences, so it checks the ledger's outcome independently of Check: two
// sections that really overlapped and both wrote show up as two
// increments from the same value.

// counterOut is an operation's output.
type counterOut struct {
	read     int64
	accepted bool
}

var counterModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(string)
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return int64(0) },
	Step: func(state, input, output any) (bool, any) {
		n, o := state.(int64), output.(counterOut)
		if o.accepted {
			return o.read == n, n + 1
		}
		// The stale read was of some earlier state; the counter only
		// grows.
		return o.read <= n, n
	},
	DescribeOperation: func(input, output any) string {
		o := output.(counterOut)
		return fmt.Sprintf("%s: read %d, write accepted %v", input, o.read, o.accepted)
	},
}

// linearizable runs porcupine over the grants that wrote to the ledger and
// whose exit is known; it returns the result and how many operations it
// checked.
func linearizable(gs []Grant, timeout time.Duration) (porcupine.CheckResult, int) {
	ops := make([]porcupine.Operation, 0, len(gs))
	for _, g := range gs {
		if g.Use <= 0 || g.Exit < 0 {
			continue
		}
		ops = append(ops, porcupine.Operation{
			Input:  g.Key,
			Call:   int64(g.Enter),
			Output: counterOut{read: g.Read, accepted: !g.Rejected},
			Return: int64(max(g.Exit, g.Use)),
		})
	}
	return porcupine.CheckOperationsTimeout(counterModel, ops, timeout), len(ops)
}

// op is a grant of key k entered at enter ms, left at exit ms, that read
// read and whose write was accepted or not.
func op(enter, exit int, read int64, accepted bool) Grant {
	return Grant{Key: "k", Enter: time.Duration(enter) * ms, Use: time.Duration(exit) * ms,
		Exit: time.Duration(exit) * ms, Read: read, Rejected: !accepted}
}

func TestCounterModel(t *testing.T) {
	tests := []struct {
		name   string
		grants []Grant
		want   porcupine.CheckResult
	}{
		{"sequential", []Grant{op(0, 10, 0, true), op(20, 30, 1, true), op(40, 50, 2, true)}, porcupine.Ok},
		{"recorded out of order", []Grant{op(40, 50, 2, true), op(0, 10, 0, true), op(20, 30, 1, true)}, porcupine.Ok},
		{"overlapping sections, both wrote the same value", []Grant{op(0, 30, 0, true), op(10, 40, 0, true)}, porcupine.Illegal},
		{"disjoint sections, second read a stale value", []Grant{op(0, 10, 0, true), op(20, 30, 0, true)}, porcupine.Illegal},
		{"stale write rejected", []Grant{op(0, 50, 0, false), op(10, 20, 0, true), op(30, 40, 1, true)}, porcupine.Ok},
		{"rejected write read the future", []Grant{op(0, 10, 5, false)}, porcupine.Illegal},
		{"unknown exit skipped", []Grant{op(0, 10, 0, true), {Key: "k", Enter: 20 * ms, Use: 25 * ms, Exit: -1, Read: 7}}, porcupine.Ok},
		{"keys apart", []Grant{op(0, 10, 0, true), {Key: "j", Enter: 5 * ms, Use: 8 * ms, Exit: 8 * ms}}, porcupine.Ok},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got, _ := linearizable(tc.grants, 5*time.Second); got != tc.want {
				t.Errorf("linearizable = %s; want %s", got, tc.want)
			}
		})
	}
}
