package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// Issue 3's acceptance test: readers and writers over two lockproxy
// instances sharing the nodes, every grant recorded on one monotonic
// clock, and a checker that no writer overlaps anyone and that write
// fences strictly increase.

// holdRecord is one grant as its holder saw it, on the test's monotonic
// clock.
type holdRecord struct {
	who   string // for messages: "reader 3 via A"
	write bool
	// sent is when the LOCK/RLOCK was sent, enter when its grant was read,
	// exit just before the UNLOCK was sent.
	sent, enter, exit time.Duration
	validity          time.Duration
	fence             int64
}

// believedEnd is when the holder stops believing it holds the lock: at
// its UNLOCK, or when validity_ms (counted from before the request was
// sent, so never later than lockproxy's own count) ran out.
func (r holdRecord) believedEnd() time.Duration { return min(r.exit, r.sent+r.validity) }

func (r holdRecord) String() string {
	kind := "read"
	if r.write {
		kind = "write"
	}
	return fmt.Sprintf("%s %s [%v, %v] fence %d", r.who, kind, r.enter, r.believedEnd(), r.fence)
}

// checkRWHistory returns every violation in h: a writer whose believed
// hold overlaps any other holder's, a write fence not strictly above the
// write before it, a read fence below the write before it.
func checkRWHistory(h []holdRecord) []string {
	h = append([]holdRecord(nil), h...)
	sort.Slice(h, func(i, j int) bool { return h[i].enter < h[j].enter })
	var bad []string
	for i := range h {
		for j := i + 1; j < len(h) && h[j].enter < h[i].believedEnd(); j++ {
			if h[i].write || h[j].write {
				bad = append(bad, fmt.Sprintf("overlap: %v and %v", h[i], h[j]))
			}
		}
	}
	var last *holdRecord
	for i := range h {
		r := &h[i]
		switch {
		case last == nil:
		case r.write && r.fence <= last.fence:
			bad = append(bad, fmt.Sprintf("write fence not increasing: %v after %v", r, last))
		case !r.write && r.fence < last.fence:
			bad = append(bad, fmt.Sprintf("read fence below the write before it: %v after %v", r, last))
		}
		if r.write {
			last = r
		}
	}
	return bad
}

// TestReadWriteCheckerNegativeControl: the checker fails on histories
// that break the rules, and passes readers sharing the lock.
func TestReadWriteCheckerNegativeControl(t *testing.T) {
	t.Parallel()
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	rec := func(write bool, enter, exit, fence int) holdRecord {
		return holdRecord{who: "c", write: write, sent: ms(enter - 1), enter: ms(enter), exit: ms(exit), validity: ms(1000), fence: int64(fence)}
	}
	cases := []struct {
		name    string
		history []holdRecord
		wantBad string // "" when the history is fine
	}{
		{"readers share", []holdRecord{rec(false, 0, 10, 1), rec(false, 5, 15, 1), rec(true, 20, 30, 2), rec(false, 31, 40, 2)}, ""},
		{"writer overlaps reader", []holdRecord{rec(false, 0, 10, 1), rec(true, 9, 20, 2)}, "overlap"},
		{"reader overlaps writer", []holdRecord{rec(true, 0, 10, 2), rec(false, 5, 7, 2)}, "overlap"},
		{"writers overlap", []holdRecord{rec(true, 0, 10, 1), rec(true, 5, 20, 2)}, "overlap"},
		{"write fence repeats", []holdRecord{rec(true, 0, 10, 3), rec(true, 11, 20, 3)}, "write fence not increasing"},
		{"write fence goes down", []holdRecord{rec(true, 0, 10, 3), rec(false, 11, 12, 3), rec(true, 13, 20, 2)}, "write fence not increasing"},
		{"read fence below the write", []holdRecord{rec(true, 0, 10, 3), rec(false, 11, 12, 2)}, "read fence below"},
		// A holder that kept going past its validity no longer believes
		// it holds the lock: the next writer does not overlap it.
		{"past validity", []holdRecord{
			{who: "slow", write: true, sent: 0, enter: ms(1), exit: ms(500), validity: ms(50), fence: 1},
			rec(true, 60, 70, 2),
		}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bad := checkRWHistory(tc.history)
			switch {
			case tc.wantBad == "" && len(bad) > 0:
				t.Errorf("checker found %v in a correct history", bad)
			case tc.wantBad != "" && (len(bad) == 0 || !strings.Contains(strings.Join(bad, "\n"), tc.wantBad)):
				t.Errorf("checker found %v; want a violation %q", bad, tc.wantBad)
			}
		})
	}
}

// TestReadWriteAcceptance: 10 readers and 5 writers, goroutines of this
// test, on two lockproxy instances sharing three nodes, loop RLOCK/LOCK …
// WAIT, hold briefly, UNLOCK, until a few thousand grants or 15 s (the cap
// keeps the new tests within 60 s on a heavily loaded machine).
func TestReadWriteAcceptance(t *testing.T) {
	t.Parallel()
	const (
		readers     = 10
		writers     = 5
		targetTotal = 3000
		runFor      = 15 * time.Second
		// A lease that a loaded machine's delays do not eat into; the
		// holders unlock long before it ends.
		ttlMS  = 5000
		waitMS = 3000
	)
	cl := startCluster(t, 3)
	ins := []*instance{startSemInstance(t, cl), startSemInstance(t, cl)}
	key := "acceptance-" + lockclient.RandID()

	base := time.Now()
	clock := func() time.Duration { return time.Since(base) } // monotonic
	var (
		mu       sync.Mutex
		history  []holdRecord
		errs     []string
		total    atomic.Int64
		timeouts atomic.Int64
		noQuorum atomic.Int64
		stop     = make(chan struct{})
		stopOnce sync.Once
		wg       sync.WaitGroup
	)
	halt := func() { stopOnce.Do(func() { close(stop) }) }
	fail := func(format string, args ...any) {
		mu.Lock()
		errs = append(errs, fmt.Sprintf(format, args...))
		mu.Unlock()
		halt()
	}
	worker := func(who string, write bool, c lockclient.Doer) {
		defer wg.Done()
		cmd := "RLOCK"
		if write {
			cmd = "LOCK"
		}
		for {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			sent := clock()
			g, ok, err := lockclient.TryAcquire(ctx, c, cmd, key, "PX", ttlMS, "WAIT", waitMS)
			enter := clock()
			if err != nil && lockclient.IsNoQuorum(err) {
				// Nodes slower than the node timeout on a loaded machine:
				// not granted, try again.
				cancel()
				noQuorum.Add(1)
				continue
			}
			if err != nil {
				cancel()
				fail("%s: %s: %v", who, cmd, err)
				return
			}
			if !ok {
				cancel()
				timeouts.Add(1)
				continue
			}
			// Hold it briefly: readers a little longer, so that they
			// overlap each other.
			hold := time.Duration(rand.N(200)) * time.Microsecond
			if !write {
				hold *= 3
			}
			time.Sleep(hold)
			exit := clock()
			n, err := c.Do(ctx, "UNLOCK", key, g.Token).Int64()
			cancel()
			r := holdRecord{who: who, write: write, sent: sent, enter: enter, exit: exit,
				validity: time.Duration(g.ValidityMS) * time.Millisecond, fence: g.Fence}
			switch {
			case err != nil && lockclient.IsNoQuorum(err):
				// Undecided: the lease runs out instead. The holder
				// stopped believing at exit all the same.
				noQuorum.Add(1)
			case err != nil:
				fail("%s: UNLOCK: %v", who, err)
				return
			case n != 1 && exit < r.sent+r.validity:
				fail("%s: UNLOCK within validity = %d; want 1 (%v)", who, n, r)
				return
			}
			mu.Lock()
			history = append(history, r)
			mu.Unlock()
			if total.Add(1) >= targetTotal {
				halt()
			}
		}
	}
	for i := 0; i < readers+writers; i++ {
		write := i >= readers
		in := i % len(ins)
		who := fmt.Sprintf("reader %d via %c", i, 'A'+in)
		if write {
			who = fmt.Sprintf("writer %d via %c", i-readers, 'A'+in)
		}
		c := lc.NewClient(t, ins[in].addr, 2+i%2)
		wg.Add(1)
		go worker(who, write, c)
	}
	timer := time.AfterFunc(runFor, halt)
	defer timer.Stop()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(runFor + 2*waitMS*time.Millisecond + 10*time.Second):
		t.Fatalf("workers did not stop within %v of the end of the run", 2*waitMS*time.Millisecond+10*time.Second)
	}
	elapsed := clock()

	for _, e := range errs {
		t.Error(e)
	}
	var reads, writes int
	for _, r := range history {
		if r.write {
			writes++
		} else {
			reads++
		}
	}
	t.Logf("%d grants (%d read, %d write) in %v, %.0f grants/s; %d WAITs ran out, %d NOQUORUM replies",
		len(history), reads, writes, elapsed.Round(time.Millisecond), float64(len(history))/elapsed.Seconds(),
		timeouts.Load(), noQuorum.Load())
	bad := checkRWHistory(history)
	for i, b := range bad {
		if i == 20 {
			t.Errorf("… and %d more violations", len(bad)-i)
			break
		}
		t.Error(b)
	}
	// Loose floors, so that a loaded machine does not fail the test: both
	// kinds must have been granted many times over.
	if reads < 100 || writes < 50 {
		t.Errorf("%d read and %d write grants; want at least 100 and 50", reads, writes)
	}
}
