package fault

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// A second opinion on the ledger, from github.com/anishathalye/porcupine:
// each grant's critical section is one operation on its key's counter,
// from Enter to Exit. A write grant's returns the value it read and
// whether its write was accepted; a read grant's, the values of its two
// reads (at the start and at the end of its section) and whether the
// ledger still took its fence at the second. The history must be
// linearizable against a counter that an accepted write advances by one
// from the value read, that a rejected (stale) write leaves alone, and
// that a reader observes: both its reads see the value at one point of
// its section, so a reader must see every write that completed before it
// entered, none that began after it left, and no write land between its
// reads. A second read the fence refused (a write with a higher fence
// was accepted since: a writer came after the reader, legitimately once
// the reader's lease ran out) is held only to be no lower than the first;
// the first is still held to the value. So the writes that show between
// a reader's reads are those with a fence not above the reader's (a read
// fence is at least the last write's, and usually equal to it): a write
// granted before the reader and still in its section, within its
// validity (an overlap) or past it (a late use, which the fence cannot
// refuse either, and which porcupine then fails as well).
//
// It knows nothing of validity, so it checks the ledger's outcome
// independently of Check: two sections that really overlapped and both
// wrote show up as two increments from the same value, and a write
// inside a reader's section as two reads that differ. A write before or
// after both of a reader's reads is ordered after or before the reader:
// only Check sees that overlap.

// counterOut is an operation's output: for a write, the value read and
// whether the write was accepted; for a read (reader), the two values
// read and whether the second counts.
type counterOut struct {
	read     int64
	accepted bool

	reader   bool
	reread   int64
	rereadOK bool
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
		switch {
		case o.reader:
			if !o.rereadOK {
				// Refused, it read a later state, which is no
				// lower.
				return o.read == n && o.reread >= n, n
			}
			return o.read == n && o.reread == n, n
		case o.accepted:
			return o.read == n, n + 1
		}
		// The stale read was of some earlier state; the counter only
		// grows.
		return o.read <= n, n
	},
	DescribeOperation: func(input, output any) string {
		o := output.(counterOut)
		if o.reader {
			return fmt.Sprintf("%s: reader read %d, then %d (fence taken %v)", input, o.read, o.reread, o.rereadOK)
		}
		return fmt.Sprintf("%s: read %d, write accepted %v", input, o.read, o.accepted)
	},
}

// linearizable runs porcupine over the grants that wrote to the ledger or
// read it under a read lock, whose exit is known; it returns the result
// and how many operations it checked.
func linearizable(gs []Grant, timeout time.Duration) (porcupine.CheckResult, int) {
	ops := make([]porcupine.Operation, 0, len(gs))
	for _, g := range gs {
		if g.Exit < 0 {
			continue
		}
		switch {
		case g.Shared:
			ops = append(ops, porcupine.Operation{
				Input:  g.Key,
				Call:   int64(g.Enter),
				Output: counterOut{reader: true, read: g.Read, reread: g.Reread, rereadOK: g.RereadOK},
				Return: int64(g.Exit),
			})
		case g.Use > 0:
			ops = append(ops, porcupine.Operation{
				Input:  g.Key,
				Call:   int64(g.Enter),
				Output: counterOut{read: g.Read, accepted: !g.Rejected},
				Return: int64(max(g.Exit, g.Use)),
			})
		}
	}
	return porcupine.CheckOperationsTimeout(counterModel, ops, timeout), len(ops)
}

// op is a grant of key k entered at enter ms, left at exit ms, that read
// read and whose write was accepted or not.
func op(enter, exit int, read int64, accepted bool) Grant {
	return Grant{Key: "k", Enter: time.Duration(enter) * ms, Use: time.Duration(exit) * ms,
		Exit: time.Duration(exit) * ms, Read: read, Rejected: !accepted}
}

// rop is a read grant of key k entered at enter ms, left at exit ms, that
// read read at the start of its section and reread at its end, the ledger
// still taking its fence then or not (ok).
func rop(enter, exit int, read, reread int64, ok bool) Grant {
	return Grant{Key: "k", Shared: true, Enter: time.Duration(enter) * ms, Exit: time.Duration(exit) * ms,
		Read: read, Reread: reread, RereadOK: ok}
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
		// Readers observe the counter: both their reads must see the
		// value it has at one point of their section.
		{"reader between writes", []Grant{op(0, 10, 0, true), rop(20, 30, 1, 1, true), op(40, 50, 1, true)}, porcupine.Ok},
		{"concurrent readers", []Grant{op(0, 10, 0, true), rop(20, 40, 1, 1, true), rop(25, 35, 1, 1, true),
			rop(30, 50, 1, 1, true), op(60, 70, 1, true), rop(80, 90, 2, 2, true)}, porcupine.Ok},
		{"reader saw a stale value after a write completed", []Grant{op(0, 10, 0, true), rop(20, 30, 0, 0, true)}, porcupine.Illegal},
		{"reader saw a write that began after it left", []Grant{rop(0, 10, 1, 1, true), op(20, 30, 0, true)}, porcupine.Illegal},
		{"one of concurrent readers stale", []Grant{op(0, 10, 0, true), rop(20, 40, 1, 1, true), rop(25, 35, 0, 0, true)}, porcupine.Illegal},
		{"reader saw a value nobody wrote", []Grant{op(0, 10, 0, true), rop(20, 30, 2, 2, true)}, porcupine.Illegal},
		{"reader saw a rejected write", []Grant{op(0, 50, 0, false), op(10, 20, 0, true), rop(30, 40, 2, 2, true)}, porcupine.Illegal},
		{"reader after a rejected write", []Grant{op(0, 50, 0, false), op(10, 20, 0, true), rop(30, 40, 1, 1, true)}, porcupine.Ok},
		// A write inside a reader's section shows only if it landed
		// between the reader's two reads: before or after both, the
		// reader is ordered after or before it (Check finds the
		// overlap by time).
		{"write landed between a reader's reads", []Grant{rop(0, 20, 0, 1, true), op(5, 15, 0, true)}, porcupine.Illegal},
		{"write in a reader's section, after both its reads", []Grant{rop(0, 20, 0, 0, true), op(5, 15, 0, true)}, porcupine.Ok},
		{"write in a reader's section, before both its reads", []Grant{rop(0, 20, 1, 1, true), op(5, 15, 0, true)}, porcupine.Ok},
		{"reader's reads straddle a write between two readers", []Grant{rop(0, 50, 0, 1, true), rop(0, 10, 0, 0, true),
			op(20, 30, 0, true), rop(40, 50, 1, 1, true)}, porcupine.Illegal},
		// A second read the fence refused (a higher fence had written) is
		// only held to be no lower than the first; the first is held to
		// the value.
		{"write between a reader's reads, second refused", []Grant{rop(0, 20, 0, 1, false), op(5, 15, 0, true)}, porcupine.Ok},
		{"stale first read, second refused", []Grant{op(0, 10, 0, true), rop(20, 30, 0, 1, false)}, porcupine.Illegal},
		{"second read refused and lower than the first", []Grant{op(0, 10, 0, true), rop(20, 30, 1, 0, false)}, porcupine.Illegal},
		{"reader with unknown exit skipped", []Grant{op(0, 10, 0, true),
			{Key: "k", Shared: true, Enter: 20 * ms, Exit: -1, Read: 7, Reread: 7, RereadOK: true}}, porcupine.Ok},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got, _ := linearizable(tc.grants, 5*time.Second); got != tc.want {
				t.Errorf("linearizable = %s; want %s", got, tc.want)
			}
		})
	}
}

// Histories as the workload records them, under an in-process lock (a
// sync.RWMutex, fences counted under it: a write's one above the last, a
// read's the last), with every client contending for one key and readers
// overlapping each other throughout. With the lock correct porcupine must
// find the history linearizable, readers included, well within a row's
// timeout; with readers that take no lock (a read lock that does not
// exclude writers) and an unfenced ledger it must not, from the readers
// alone: the writers still exclude each other, and each reader reads the
// value twice, 0-2 ms apart, with writers writing all the time. A fenced
// ledger refuses the writes at a reader's fence (ReadShared), those of the
// writers the broken read lock let in: the history is then linearizable,
// and the refused writes are what shows the lock broken (a row counts them
// as live writes rejected).
func TestCounterModelRWMutexHistory(t *testing.T) {
	const (
		clients = 20
		grants  = 100
	)
	for _, tc := range []struct {
		name        string
		readersLock bool
		fenced      bool
		want        porcupine.CheckResult
		refused     bool // some writes refused
	}{
		{"read lock held", true, true, porcupine.Ok, false},
		{"readers take no lock", false, false, porcupine.Illegal, false},
		{"readers take no lock, fenced ledger", false, true, porcupine.Ok, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &env{hist: NewHistory(), ledger: NewLedger(tc.fenced, false)}
			var (
				rw    sync.RWMutex
				mu    sync.Mutex
				fence int64
			)
			var wg sync.WaitGroup
			for i := range clients {
				reader := i%4 == 3
				wg.Go(func() {
					for range grants {
						g := Grant{Key: "k", Shared: reader}
						switch {
						case !reader:
							rw.Lock()
						case tc.readersLock:
							rw.RLock()
						}
						mu.Lock()
						if !reader {
							fence++
						}
						g.Fence = fence
						mu.Unlock()
						g.Enter = e.hist.Now()
						if reader {
							e.reading("k", &g)
						} else {
							e.critical("k", &g)
						}
						g.Exit = e.hist.Now()
						e.hist.Add(g)
						switch {
						case !reader:
							rw.Unlock()
						case tc.readersLock:
							rw.RUnlock()
						}
					}
				})
			}
			wg.Wait()
			start := time.Now()
			got, ops := linearizable(e.hist.Grants(), linTimeout)
			t.Logf("porcupine: %s over %d operations (%d reads) in %v", got, ops, clients/4*grants, time.Since(start).Round(time.Millisecond))
			if got != tc.want || ops != clients*grants {
				t.Errorf("linearizable = %s over %d operations; want %s over %d", got, ops, tc.want, clients*grants)
			}
			if _, rejected := e.ledger.Counts(); (rejected > 0) != tc.refused {
				t.Errorf("%d writes refused; want some: %v", rejected, tc.refused)
			}
		})
	}
}
