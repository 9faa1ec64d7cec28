package fault

import (
	"testing"
	"time"
)

const ms = time.Millisecond

// g is a grant of key with fence, entered at enter, valid for validity,
// left at exit (all in ms).
func g(key string, fence int64, enter, validity, exit int) Grant {
	return Grant{
		Key: key, Fence: fence, Client: "c",
		Enter:    time.Duration(enter) * ms,
		Deadline: time.Duration(enter+validity) * ms,
		Exit:     time.Duration(exit) * ms,
	}
}

// rg is g for a read grant.
func rg(key string, fence int64, enter, validity, exit int) Grant {
	r := g(key, fence, enter, validity, exit)
	r.Shared = true
	return r
}

func TestCheck(t *testing.T) {
	tests := []struct {
		name                               string
		grants                             []Grant
		overlaps, regressions, late, rejLv int
		withRead                           int // overlaps a read takes part in
	}{
		{name: "empty"},
		{name: "one", grants: []Grant{g("k", 1, 0, 100, 10)}},
		{name: "sequential", grants: []Grant{g("k", 1, 0, 100, 10), g("k", 2, 20, 100, 30), g("k", 3, 40, 100, 50)}},
		{name: "touching", grants: []Grant{g("k", 1, 0, 100, 10), g("k", 2, 10, 100, 30)}},
		{name: "order of recording does not matter", grants: []Grant{g("k", 2, 20, 100, 30), g("k", 1, 0, 100, 10)}},
		{name: "overlap", grants: []Grant{g("k", 1, 0, 100, 50), g("k", 2, 20, 100, 30)}, overlaps: 1},
		{name: "overlap with an earlier, not the previous, grant",
			grants:   []Grant{g("k", 1, 0, 100, 90), g("k", 2, 10, 100, 20), g("k", 3, 30, 100, 40)},
			overlaps: 2},
		{name: "other keys do not overlap", grants: []Grant{g("a", 1, 0, 100, 50), g("b", 1, 20, 100, 30)}},
		{name: "equal fence", grants: []Grant{g("k", 5, 0, 100, 10), g("k", 5, 20, 100, 30)}, regressions: 1},
		{name: "smaller fence", grants: []Grant{g("k", 5, 0, 100, 10), g("k", 3, 20, 100, 30), g("k", 6, 40, 100, 50)}, regressions: 1},
		{name: "fences per key", grants: []Grant{g("a", 5, 0, 100, 10), g("b", 1, 20, 100, 30)}},
		{name: "past validity, then another enters: late use, not overlap",
			grants: []Grant{g("k", 1, 0, 100, 300), g("k", 2, 150, 100, 200)}, late: 1},
		{name: "past validity, nobody else entered", grants: []Grant{g("k", 1, 0, 100, 300), g("k", 2, 300, 100, 310)}},
		{name: "unknown exit ends at the deadline",
			grants: []Grant{{Key: "k", Fence: 1, Enter: 0, Deadline: 100 * ms, Exit: -1}, g("k", 2, 100, 100, 110)}},
		{name: "unknown exit overlaps before the deadline",
			grants:   []Grant{{Key: "k", Fence: 1, Enter: 0, Deadline: 100 * ms, Exit: -1}, g("k", 2, 99, 100, 110)},
			overlaps: 1},
		{name: "write rejected within validity",
			grants: []Grant{{Key: "k", Fence: 1, Enter: 1, Deadline: 100 * ms, Exit: 50 * ms, Use: 40 * ms, Rejected: true}},
			rejLv:  1},
		{name: "readers overlap each other", grants: []Grant{rg("k", 3, 0, 100, 50), rg("k", 3, 10, 100, 60), rg("k", 2, 20, 100, 30)}},
		{name: "read inside a write", grants: []Grant{g("k", 1, 0, 100, 50), rg("k", 1, 20, 100, 30)}, overlaps: 1, withRead: 1},
		{name: "write inside a read", grants: []Grant{rg("k", 1, 0, 100, 50), g("k", 2, 20, 100, 30)}, overlaps: 1, withRead: 1},
		{name: "write inside the earlier of two reads",
			grants: []Grant{rg("k", 1, 0, 100, 80), rg("k", 1, 10, 100, 20), g("k", 2, 40, 100, 50)}, overlaps: 1, withRead: 1},
		{name: "write inside a write and a read",
			grants: []Grant{g("k", 1, 0, 100, 90), rg("k", 1, 10, 100, 80), g("k", 2, 20, 100, 30)}, overlaps: 2, withRead: 2},
		{name: "write inside a write, after a read",
			grants: []Grant{rg("k", 1, 0, 100, 5), g("k", 2, 10, 100, 90), g("k", 3, 20, 100, 30)}, overlaps: 1},
		{name: "read, write, read in turn", grants: []Grant{rg("k", 1, 0, 100, 10), g("k", 2, 20, 100, 30), rg("k", 2, 40, 100, 50)}},
		{name: "read below the write before it", grants: []Grant{g("k", 4, 0, 100, 10), rg("k", 3, 20, 100, 30)}, regressions: 1},
		{name: "write not above the read before it", grants: []Grant{rg("k", 4, 0, 100, 10), g("k", 4, 20, 100, 30)}, regressions: 1},
		{name: "write not above the highest earlier read",
			grants: []Grant{rg("k", 6, 0, 100, 10), rg("k", 4, 5, 100, 15), g("k", 5, 20, 100, 30)}, regressions: 1},
		// Each grant out of order is counted against the highest earlier
		// fence, not only the first one after it (which lowered the last
		// write's fence the next was held to).
		{name: "every write below an earlier higher fence",
			grants: []Grant{g("k", 10, 0, 100, 10), g("k", 3, 20, 100, 30), g("k", 4, 40, 100, 50)}, regressions: 2},
		{name: "read below an earlier write that is not the last",
			grants: []Grant{g("k", 10, 0, 100, 10), g("k", 3, 20, 100, 30), rg("k", 5, 40, 100, 50)}, regressions: 2},
		{name: "write equal to an earlier write that is not the last",
			grants: []Grant{g("k", 5, 0, 100, 10), g("k", 3, 20, 100, 30), g("k", 5, 40, 100, 50)}, regressions: 2},
		{name: "writes and a read below fence 10",
			grants: []Grant{g("k", 10, 0, 100, 10), g("k", 3, 20, 100, 30), g("k", 4, 40, 100, 50), rg("k", 5, 60, 100, 70)}, regressions: 3},
		{name: "write rejected past validity",
			grants: []Grant{{Key: "k", Fence: 1, Enter: 1, Deadline: 100 * ms, Exit: 250 * ms, Use: 200 * ms, Rejected: true}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := Check(tc.grants)
			if r.Grants != len(tc.grants) || r.OverlapCount != tc.overlaps || r.FenceRegressionCount != tc.regressions ||
				r.LateUseCount != tc.late || r.RejectedLiveCount != tc.rejLv || r.ReadOverlapCount != tc.withRead {
				t.Errorf("Check = %v; want %d overlaps (%d with a read), %d fence regressions, %d late uses, %d live writes rejected",
					r, tc.overlaps, tc.withRead, tc.regressions, tc.late, tc.rejLv)
			}
			if len(r.Overlaps) != min(r.OverlapCount, maxExamples) || len(r.LateUses) != min(r.LateUseCount, maxExamples) {
				t.Errorf("examples do not match the counts: %v", r)
			}
			if want := tc.overlaps + tc.regressions + tc.rejLv; r.Violations() != want {
				t.Errorf("Violations() = %d; want %d", r.Violations(), want)
			}
		})
	}
}

func TestCheckCapsExamples(t *testing.T) {
	var gs []Grant
	for i := range 50 {
		gs = append(gs, g("k", 1, i, 1000, 1000)) // all overlap, all fence 1
	}
	r := Check(gs)
	if r.OverlapCount != 49 || len(r.Overlaps) != maxExamples || r.FenceRegressionCount != 49 || len(r.FenceRegressions) != maxExamples {
		t.Errorf("Check = %v; want 49 overlaps and 49 regressions, %d examples each", r, maxExamples)
	}
}

func TestLedger(t *testing.T) {
	type write struct {
		key         string
		fence, plus int64 // the write is read + plus
		want        bool
	}
	tests := []struct {
		name               string
		fenced             bool
		writes             []write
		accepted, rejected int
		lost               int64
	}{
		{name: "increasing fences", fenced: true,
			writes:   []write{{"k", 1, 1, true}, {"k", 2, 1, true}, {"k", 3, 1, true}},
			accepted: 3},
		{name: "equal fence accepted", fenced: true,
			writes:   []write{{"k", 4, 1, true}, {"k", 4, 1, true}},
			accepted: 2},
		{name: "stale fence rejected", fenced: true,
			writes:   []write{{"k", 4, 1, true}, {"k", 3, 1, false}, {"k", 5, 1, true}},
			accepted: 2, rejected: 1},
		{name: "fences per key", fenced: true,
			writes:   []write{{"a", 9, 1, true}, {"b", 1, 1, true}},
			accepted: 2},
		{name: "unfenced accepts stale", fenced: false,
			writes:   []write{{"k", 4, 1, true}, {"k", 3, 1, true}},
			accepted: 2},
		// An increment that overwrote another's (it read the old value):
		// two acknowledged, the value went up by one.
		{name: "lost update", fenced: false,
			writes:   []write{{"k", 1, 1, true}, {"k", 2, 0, true}},
			accepted: 2, lost: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLedger(tc.fenced, true)
			for i, w := range tc.writes {
				v := l.Read(w.key, w.fence) + w.plus
				if got := l.Write(w.key, w.fence, v); got != w.want {
					t.Errorf("write %d: Write(%q, %d, %d) = %v; want %v", i, w.key, w.fence, v, got, w.want)
				}
			}
			acc, rej := l.Counts()
			if acc != tc.accepted || rej != tc.rejected {
				t.Errorf("Counts() = %d, %d; want %d, %d", acc, rej, tc.accepted, tc.rejected)
			}
			if got := l.LostTotal(); got != tc.lost {
				t.Errorf("LostTotal() = %d (%v); want %d", got, l.Lost(), tc.lost)
			}
			if n := len(l.Log()); n != len(tc.writes) {
				t.Errorf("Log has %d entries; want %d", n, len(tc.writes))
			}
		})
	}
}

// Two read-modify-writes that overlap, the lower fence writing first: a
// fenced ledger refuses it (the higher fence has read since), so no update
// is lost; an unfenced one loses one.
func TestLedgerFencedReads(t *testing.T) {
	for _, tc := range []struct {
		name             string
		fenced           bool
		acceptA, acceptB bool
		lost             int64
	}{
		{name: "fenced", fenced: true, acceptA: false, acceptB: true, lost: 0},
		{name: "unfenced", fenced: false, acceptA: true, acceptB: true, lost: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLedger(tc.fenced, false)
			a := l.Read("k", 1)
			b := l.Read("k", 2)
			if got := l.Write("k", 1, a+1); got != tc.acceptA {
				t.Errorf("Write(fence 1) after fence 2 read = %v; want %v", got, tc.acceptA)
			}
			if got := l.Write("k", 2, b+1); got != tc.acceptB {
				t.Errorf("Write(fence 2) = %v; want %v", got, tc.acceptB)
			}
			if got := l.LostTotal(); got != tc.lost {
				t.Errorf("LostTotal() = %d; want %d", got, tc.lost)
			}
		})
	}
}

// A reader's second read: a fenced ledger takes its fence until a write
// with a higher fence is accepted; an equal fence's write (a writer
// granted before the reader, whose fence readers share) or a higher
// fence's read (another reader, a writer yet to write) does not stop it.
// An unfenced ledger takes every fence.
func TestLedgerReread(t *testing.T) {
	for _, tc := range []struct {
		name             string
		fenced           bool
		afterHigherWrite bool
	}{
		{name: "fenced", fenced: true, afterHigherWrite: false},
		{name: "unfenced", fenced: false, afterHigherWrite: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLedger(tc.fenced, false)
			l.Read("k", 3)
			if v, ok := l.Reread("k", 3); v != 0 || !ok {
				t.Errorf("Reread(fence 3) at once = %d, %v; want 0, true", v, ok)
			}
			l.Write("k", 3, 1)
			if v, ok := l.Reread("k", 3); v != 1 || !ok {
				t.Errorf("Reread(fence 3) after fence 3 wrote 1 = %d, %v; want 1, true", v, ok)
			}
			l.Read("k", 4)
			if v, ok := l.Reread("k", 3); v != 1 || !ok {
				t.Errorf("Reread(fence 3) after fence 4 read = %d, %v; want 1, true", v, ok)
			}
			l.Write("k", 4, 2)
			if v, ok := l.Reread("k", 3); v != 2 || ok != tc.afterHigherWrite {
				t.Errorf("Reread(fence 3) after fence 4 wrote 2 = %d, %v; want 2, %v", v, ok, tc.afterHigherWrite)
			}
		})
	}
}

// TestLedgerRefusesWriteAtReadersFence: once a reader has read with its
// fence, a fenced ledger refuses a write at that fence or below (a writer
// granted before the reader, writing after its lease ended), so the
// reader's second read sees what its first did; a higher fence writes. An
// unfenced ledger takes every write. Before, the late write at the
// reader's fence (the last writer's, which readers carry) was accepted and
// changed the value under the reader, which porcupine's reader check then
// reports as a non-linearizable history the lock service did not cause.
func TestLedgerRefusesWriteAtReadersFence(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fenced bool
		late   bool // the late write at the reader's fence accepted
	}{
		{"fenced", true, false},
		{"unfenced", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLedger(tc.fenced, false)
			w := l.Read("k", 3) // a writer granted fence 3 reads, then stalls past its lease
			r := l.ReadShared("k", 3)
			if ok := l.Write("k", 3, w+1); ok != tc.late {
				t.Errorf("late write at the reader's fence accepted = %v; want %v", ok, tc.late)
			}
			if v, _ := l.Reread("k", 3); (v == r) == tc.late {
				t.Errorf("reader read %d then %d; want the same value: %v", r, v, !tc.late)
			}
			if ok := l.Write("k", 2, 7); ok != !tc.fenced {
				t.Errorf("write at a lower fence accepted = %v; want %v", ok, !tc.fenced)
			}
			if ok := l.Write("k", 4, 9); !ok {
				t.Error("write at a higher fence refused")
			}
			// Fence 0 (a fresh key's read grant) refuses nothing until a
			// reader read with it.
			l = NewLedger(tc.fenced, false)
			if ok := l.Write("j", 0, 1); !ok {
				t.Error("write at fence 0 with no reader refused")
			}
			l.ReadShared("j", 0)
			if ok := l.Write("j", 0, 2); ok != tc.late {
				t.Errorf("late write at the reader's fence 0 accepted = %v; want %v", ok, tc.late)
			}
		})
	}
}

func TestHistoryClock(t *testing.T) {
	h := NewHistory()
	a := h.Now()
	time.Sleep(time.Millisecond)
	b := h.Now()
	if a <= 0 || b <= a {
		t.Errorf("Now() = %v then %v; want positive and increasing", a, b)
	}
	h.Add(g("k", 1, 0, 10, 5))
	if n := len(h.Grants()); n != 1 {
		t.Errorf("Grants() has %d; want 1", n)
	}
}

// The rows' validity check (validityProblem, row_test.go): a validity of
// 0 or in the wrong unit would turn an overlap into a late use (Check
// measures a grant to Enter + validity), so it must not pass.
func TestCheckValidityBounds(t *testing.T) {
	ttl := ttlMS * time.Millisecond
	for _, tc := range []struct {
		name          string
		ttl, validity time.Duration
		ok            bool
	}{
		{"TTL less drift", ttl, (ttlMS - driftMS) * ms, true},
		{"1 ms", ttl, ms, true},
		{"0", ttl, 0, false},
		{"negative", ttl, -ms, false},
		{"1 ms over TTL less drift", ttl, (ttlMS - driftMS + 1) * ms, false},
		{"the TTL", ttl, ttl, false},
		{"seconds taken for ms", ttl, 1980 * time.Second, false},
		{"3 s TTL less its drift", 3 * time.Second, 2968 * ms, true},
		{"3 s TTL less the 2 s TTL's drift", 3 * time.Second, 2978 * ms, false},
		{"no TTL recorded", 0, 1900 * ms, false},
	} {
		gr := Grant{Key: "k", Fence: 1, Enter: 0, Deadline: tc.validity, Exit: ms, TTL: tc.ttl, Validity: tc.validity}
		if p := validityProblem(gr); (p == "") != tc.ok {
			t.Errorf("%s: validityProblem(TTL %v, validity %v) = %q; want ok %v", tc.name, tc.ttl, tc.validity, p, tc.ok)
		}
	}
	// The overlap a validity of 0 hides from Check (a late use for it) is
	// failed by the validity check.
	gs := []Grant{
		{Key: "k", Fence: 1, Enter: 0, Deadline: 0, Exit: 50 * ms, TTL: ttl, Validity: 0},
		{Key: "k", Fence: 2, Enter: 20 * ms, Deadline: 1990 * ms, Exit: 30 * ms, TTL: ttl, Validity: 1970 * ms},
	}
	if r := Check(gs); r.Violations() != 0 || r.LateUseCount != 1 {
		t.Errorf("Check = %v; want the overlap taken for 1 late use (what the validity check is for)", r)
	}
	if validityProblem(gs[0]) == "" {
		t.Errorf("a grant told validity 0 passes the validity check")
	}
}
