package fault

import (
	"fmt"
	"sort"
	"sync"
	"time"
)

// Grant is one grant as its client saw it: exclusive (LOCK), or shared
// (RLOCK) when Shared. All times are offsets on one monotonic clock
// (History.Now) of the test process.
type Grant struct {
	Key    string
	Token  string
	Fence  int64
	Shared bool
	// Client names who held it, for reports.
	Client string
	// Enter is stamped right after the LOCK reply arrived.
	Enter time.Duration
	// Deadline is Enter + validity_ms. lockproxy counts validity from the
	// start of its acquisition, which is earlier than Enter, so this
	// deadline is a little late: it makes the overlap check stricter, never
	// laxer.
	Deadline time.Duration
	// Exit is stamped right before UNLOCK is sent (or the connection is
	// dropped). A negative Exit means unknown; it is then taken to be the
	// Deadline.
	Exit time.Duration
	// Use is when the client wrote to the ledger inside the critical
	// section (0: it did not write), and Rejected whether the ledger
	// refused that write.
	Use      time.Duration
	Rejected bool
	// Read is the ledger value the client read in its critical section
	// (for the linearizability check).
	Read int64
	// A reader reads the ledger again at the end of its critical section:
	// Reread is the value it read then, and RereadOK whether the ledger
	// still took its fence (no write with a higher fence had been
	// accepted since). While the read lock holds, no write may
	// land between the two reads (the linearizability check).
	Reread   int64
	RereadOK bool
	// TTL is the lease the grant asked for (PX) and Validity the
	// validity_ms its reply told, for the rows' validity check
	// (checkValidity in row_test.go). Check goes by Deadline, which a
	// RENEW or a lock-lost signal may move; these stay as granted.
	TTL, Validity time.Duration
}

// exit is Exit, or Deadline when the exit is unknown.
func (g Grant) exit() time.Duration {
	if g.Exit < 0 {
		return g.Deadline
	}
	return g.Exit
}

// end is when the grant stopped protecting its holder: its exit, but never
// later than its validity deadline.
func (g Grant) end() time.Duration {
	return min(g.exit(), g.Deadline)
}

func (g Grant) String() string {
	kind := ""
	if g.Shared {
		kind = " (read)"
	}
	return fmt.Sprintf("%s fence %d%s by %s [%v, exit %v, deadline %v]", g.Key, g.Fence, kind, g.Client, g.Enter, g.exit(), g.Deadline)
}

// History records grants from many goroutines on one monotonic clock.
type History struct {
	start time.Time

	mu     sync.Mutex
	grants []Grant
}

// NewHistory starts an empty history whose clock reads 0 now.
func NewHistory() *History { return &History{start: time.Now()} }

// Now is the history's clock: the monotonic time since NewHistory. It is
// never 0 after the first nanosecond, so 0 can mean "not set".
func (h *History) Now() time.Duration { return time.Since(h.start) }

// Add records g.
func (h *History) Add(g Grant) {
	h.mu.Lock()
	h.grants = append(h.grants, g)
	h.mu.Unlock()
}

// Grants returns a copy of the recorded grants.
func (h *History) Grants() []Grant {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Grant(nil), h.grants...)
}

// Pair is two grants of one key, First entered before Second.
type Pair struct {
	First, Second Grant
}

func (p Pair) String() string { return p.First.String() + " / " + p.Second.String() }

// Report is what Check found. Every slice holds at most maxExamples
// entries; the counts are complete.
type Report struct {
	Grants int
	// Overlaps: Second entered before First's end (its exit, capped at its
	// validity deadline): two holders at once while both leases were valid,
	// not both readers.
	Overlaps     []Pair
	OverlapCount int
	// ReadOverlapCount counts the overlaps a read takes part in: a read
	// entered within a write's validity, or a write within a read's
	// (also when it is within a write's too, and Overlaps shows that pair).
	ReadOverlapCount int
	// FenceRegressions: Second entered after First but its fence is not
	// larger (a write after a write or a read), or smaller (a read after a
	// write: a read's fence is at least that of every earlier write, and
	// readers share theirs). First is the earlier write with the highest
	// fence (or the earlier read with the highest fence, for a write that
	// is above every earlier write's but not above that read's), so every
	// grant out of order is counted, not only the first after a high one.
	FenceRegressions     []Pair
	FenceRegressionCount int
	// LateUses: First was still in its critical section (before its exit)
	// after its validity deadline, when Second entered: the holder acted
	// past its lease while another held the lock. Only a fenced resource is
	// safe against this.
	LateUses     []Pair
	LateUseCount int
	// RejectedLive: grants whose ledger write was refused although it was
	// made before their validity deadline.
	RejectedLive      []Grant
	RejectedLiveCount int
}

const maxExamples = 10

// Violations counts the findings that break mutual exclusion or fencing
// (late uses are the client's fault, reported separately).
func (r Report) Violations() int {
	return r.OverlapCount + r.FenceRegressionCount + r.RejectedLiveCount
}

func (r Report) String() string {
	return fmt.Sprintf("%d grants: %d overlaps (%d with a read) %v, %d fence regressions %v, %d late uses %v, %d live writes rejected %v",
		r.Grants, r.OverlapCount, r.ReadOverlapCount, r.Overlaps, r.FenceRegressionCount, r.FenceRegressions,
		r.LateUseCount, r.LateUses, r.RejectedLiveCount, r.RejectedLive)
}

// Check looks for overlaps, fence regressions, late uses and live writes
// rejected, key by key, with grants ordered by Enter. A read grant is
// checked against the writes before it only; a write against every grant
// before it.
func Check(grants []Grant) Report {
	r := Report{Grants: len(grants)}
	byKey := map[string][]Grant{}
	for _, g := range grants {
		byKey[g.Key] = append(byKey[g.Key], g)
		if g.Rejected && g.Use > 0 && g.Use < g.Deadline {
			r.RejectedLiveCount++
			if len(r.RejectedLive) < maxExamples {
				r.RejectedLive = append(r.RejectedLive, g)
			}
		}
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		gs := byKey[k]
		sort.SliceStable(gs, func(i, j int) bool { return gs[i].Enter < gs[j].Enter })
		// Sweep: among the grants entered so far, the one that ends last
		// (validity-capped) and the one that exits last (uncapped), of all
		// (against a write), of the writes (against a read) and of the
		// reads (whether a write's overlap involves one); the write and
		// the read with the highest fence.
		var all, writes, reads sweep
		var topWrite, topRead *Grant
		for i := range gs {
			g := gs[i]
			against := &all
			if g.Shared {
				against = &writes
			}
			if against.n > 0 {
				switch {
				case g.Enter < against.lastEnd.end():
					r.OverlapCount++
					if g.Shared || reads.n > 0 && g.Enter < reads.lastEnd.end() {
						r.ReadOverlapCount++
					}
					if len(r.Overlaps) < maxExamples {
						r.Overlaps = append(r.Overlaps, Pair{against.lastEnd, g})
					}
				case g.Enter < against.lastExit.exit():
					r.LateUseCount++
					if len(r.LateUses) < maxExamples {
						r.LateUses = append(r.LateUses, Pair{against.lastExit, g})
					}
				}
			}
			var regressed *Grant
			switch {
			case topWrite != nil && (g.Fence < topWrite.Fence || !g.Shared && g.Fence == topWrite.Fence):
				regressed = topWrite
			case !g.Shared && topRead != nil && g.Fence <= topRead.Fence:
				regressed = topRead
			}
			if regressed != nil {
				r.FenceRegressionCount++
				if len(r.FenceRegressions) < maxExamples {
					r.FenceRegressions = append(r.FenceRegressions, Pair{*regressed, g})
				}
			}
			all.add(g)
			if g.Shared {
				reads.add(g)
				if topRead == nil || g.Fence > topRead.Fence {
					topRead = &gs[i]
				}
			} else {
				writes.add(g)
				if topWrite == nil || g.Fence > topWrite.Fence {
					topWrite = &gs[i]
				}
			}
		}
	}
	return r
}

// sweep is Check's running state over a key's grants in Enter order.
type sweep struct {
	n                 int
	lastEnd, lastExit Grant
}

func (s *sweep) add(g Grant) {
	if s.n == 0 || g.end() > s.lastEnd.end() {
		s.lastEnd = g
	}
	if s.n == 0 || g.exit() > s.lastExit.exit() {
		s.lastExit = g
	}
	s.n++
}

// LedgerEntry is one write the ledger was asked to make.
type LedgerEntry struct {
	Key      string
	Fence    int64
	Value    int64
	Accepted bool
}

// Ledger is the protected resource: a counter per key that clients
// read-modify-write inside their critical section. A fenced ledger accepts
// write(key, fence, value) only if fence ≥ the highest fence it has seen for
// key, on a read or a write; an unfenced one accepts every write (the
// negative control).
//
// Reads carry the fence too, as every operation on a fenced storage service
// does: once a holder with a higher fence has read, a lower fence can no
// longer write. Without that, two sections that overlap because the lease
// lied (a fast clock) can both read n and both write n+1, the lower fence
// first, and lose an update with every fence in order. With it, a lost
// update or a non-linearizable ledger means a fence was out of order, so
// rows that break RedLock's timing on purpose can still fail on them.
type Ledger struct {
	fenced bool

	mu       sync.Mutex
	maxFence map[string]int64
	value    map[string]int64
	acked    map[string]int64 // accepted writes per key
	accepted int
	rejected int
	log      []LedgerEntry
	keepLog  bool
	// writeFence is the highest fence of an accepted write per key.
	writeFence map[string]int64
	// readerFence is the highest fence a reader (ReadShared) read with,
	// per key.
	readerFence map[string]int64
}

// NewLedger returns an empty ledger; fenced says whether it checks fences.
// keepLog keeps every write in Log (for small runs).
func NewLedger(fenced, keepLog bool) *Ledger {
	return &Ledger{
		fenced:   fenced,
		keepLog:  keepLog,
		maxFence: map[string]int64{},
		value:    map[string]int64{},
		acked:    map[string]int64{},

		writeFence:  map[string]int64{},
		readerFence: map[string]int64{},
	}
}

// Read returns key's current value to the holder of fence; a fenced
// ledger remembers fence as the highest seen for key if it is.
func (l *Ledger) Read(key string, fence int64) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fenced && fence > l.maxFence[key] {
		l.maxFence[key] = fence
	}
	return l.value[key]
}

// ReadShared is Read for the holder of a read lock. A fenced ledger then
// also refuses every write whose fence is no higher than the reader's:
// every write grant after a read grant gets a higher fence than the
// reader's (a read grant's fence is at least every earlier write grant's,
// and the nodes that granted the read are raised to it), so a write at
// the reader's fence or below comes from a writer granted before the
// reader, whose lease had ended by the reader's grant: a late use, as a
// storage service that takes readers' fences would refuse it. Without
// this, a writer descheduled past its lease (which fails no row: the
// client's fault) writes at the fence the reader was given, the last
// writer's, and the reader's two reads differ.
func (l *Ledger) ReadShared(key string, fence int64) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if rf, read := l.readerFence[key]; l.fenced && (!read || fence > rf) {
		l.readerFence[key] = fence
	}
	if l.fenced && fence > l.maxFence[key] {
		l.maxFence[key] = fence
	}
	return l.value[key]
}

// Reread returns key's current value to a reader of fence that read it
// before, and whether the ledger still takes that fence: false once a
// write with a higher fence was accepted (a fenced ledger refuses the
// stale fence, so the reader knows its view may have changed); an
// unfenced ledger always takes it. A higher fence that only read does
// not count: concurrent readers may hold different fences, and a writer
// that has not written yet changed nothing.
func (l *Ledger) Reread(key string, fence int64) (int64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.value[key], !l.fenced || fence >= l.writeFence[key]
}

// Write sets key to value if the ledger accepts fence, and reports whether
// it did (the acknowledgement).
func (l *Ledger) Write(key string, fence, value int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	rf, read := l.readerFence[key]
	ok := !l.fenced || fence >= l.maxFence[key] && !(read && fence <= rf)
	if ok {
		l.value[key] = value
		l.acked[key]++
		l.accepted++
		if fence > l.maxFence[key] {
			l.maxFence[key] = fence
		}
		if fence > l.writeFence[key] {
			l.writeFence[key] = fence
		}
	} else {
		l.rejected++
	}
	if l.keepLog {
		l.log = append(l.log, LedgerEntry{Key: key, Fence: fence, Value: value, Accepted: ok})
	}
	return ok
}

// Counts returns how many writes were accepted and rejected.
func (l *Ledger) Counts() (accepted, rejected int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.accepted, l.rejected
}

// Log returns the writes (if the ledger keeps them).
func (l *Ledger) Log() []LedgerEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]LedgerEntry(nil), l.log...)
}

// Lost returns, per key, how many acknowledged increments are missing from
// the final value (acknowledged writes − final value), for the keys where
// that is not 0. Every write is an increment of the value read in the same
// critical section, so with mutual exclusion the final value is exactly the
// number of acknowledged writes.
func (l *Ledger) Lost() map[string]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	lost := map[string]int64{}
	for k, n := range l.acked {
		if d := n - l.value[k]; d != 0 {
			lost[k] = d
		}
	}
	return lost
}

// LostTotal sums Lost.
func (l *Ledger) LostTotal() int64 {
	var n int64
	for _, d := range l.Lost() {
		n += d
	}
	return n
}
