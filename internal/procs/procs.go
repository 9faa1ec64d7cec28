// Package procs sizes Go's scheduler (GOMAXPROCS) to the CPU lockproxy
// uses.
//
// lockproxy's hot paths are system calls and hand-offs between goroutines:
// a relayed request is a read, a queued upstream write and a reply write; a
// lock cycle wakes the client's goroutine, the nodes' writers and their
// readers. With more than one P, a goroutine made ready while another runs
// wakes a second thread, and Go's idle threads spin looking for work before
// they sleep again. On this project's 2-core machine one P cost 20-30 %
// less CPU per relayed request and per lock cycle than two (README,
// "Threads"), as twemproxy and Redis, single-threaded by design, avoid that
// cost. One P also caps lockproxy at about one core, so the Controller
// starts with one and gives every P the runtime would (its default, which
// follows the CPU quota) as soon as lockproxy keeps most of a core busy,
// and goes back to one after a quiet spell.
package procs

import (
	"context"
	"runtime"
	"syscall"
	"time"
)

// Policy says when the Controller changes the number of Ps.
type Policy struct {
	// Max is the number of Ps when busy.
	Max int
	// Interval is how often CPU use is sampled.
	Interval time.Duration
	// GrowAt is the CPU use, in cores, that brings Max Ps when one P
	// has used at least that much for GrowAfter intervals in a row: one P
	// is about saturated at one core (its thread runs Go code and the
	// system calls it makes), and below that one P does more with the
	// CPU it gets than several.
	GrowAt    float64
	GrowAfter int
	// ShrinkBelow is the CPU use under which, for ShrinkAfter intervals
	// in a row, one P comes back. Below GrowAt, so that the load that
	// brings one P back (which costs less CPU on one) does not make it
	// grow again at once.
	ShrinkBelow float64
	ShrinkAfter int
}

// DefaultPolicy grows to max Ps after 300 ms of lockproxy keeping 90 % of
// a core busy on one, and shrinks after 10 s under 0.6 cores.
func DefaultPolicy(max int) Policy {
	return Policy{
		Max: max, Interval: 100 * time.Millisecond,
		GrowAt: 0.9, GrowAfter: 3,
		ShrinkBelow: 0.6, ShrinkAfter: 100,
	}
}

// state is what the policy remembers between samples.
type state struct {
	procs int // Ps now
	run   int // intervals in a row past the threshold that would change procs
}

// next returns the number of Ps for the next interval, given the cores used
// during the last one.
func (p Policy) next(s *state, used float64) int {
	switch {
	case s.procs < p.Max && used >= p.GrowAt:
		if s.run++; s.run >= p.GrowAfter {
			s.procs, s.run = p.Max, 0
		}
	case s.procs > 1 && used < p.ShrinkBelow:
		if s.run++; s.run >= p.ShrinkAfter {
			s.procs, s.run = 1, 0
		}
	default:
		s.run = 0
	}
	return s.procs
}

// Controller applies a Policy to the running process.
type Controller struct {
	policy Policy
	// The process's CPU time, the clock and runtime.GOMAXPROCS; tests
	// replace them.
	cpu func() time.Duration
	now func() time.Time
	set func(int) int
	// Changed, when set, is told of every change (for the log).
	Changed func(procs int, used float64)
}

// New returns a controller for the running process.
func New(p Policy) *Controller {
	return &Controller{policy: p, cpu: processCPU, now: time.Now, set: runtime.GOMAXPROCS}
}

// Run sets one P, then samples the process's CPU use every interval and
// changes the number of Ps as the policy says, until ctx ends. It leaves
// the number as it was last set.
func (c *Controller) Run(ctx context.Context) {
	p := c.policy
	if p.Max <= 1 || p.Interval <= 0 {
		return
	}
	s := state{procs: 1}
	c.set(1)
	t := time.NewTicker(p.Interval)
	defer t.Stop()
	lastAt := c.now()
	lastCPU := c.cpu()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		at := c.now()
		cpu := c.cpu()
		wall := at.Sub(lastAt)
		if wall <= 0 {
			continue
		}
		used := float64(cpu-lastCPU) / float64(wall)
		lastCPU, lastAt = cpu, at
		before := s.procs
		if n := p.next(&s, used); n != before {
			c.set(n)
			if c.Changed != nil {
				c.Changed(n, used)
			}
		}
	}
}

// processCPU is the user and system CPU time of the whole process so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
