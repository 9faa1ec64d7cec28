// Package procs sizes Go's scheduler (GOMAXPROCS) to the CPU lockproxy
// uses.
//
// lockproxy's hot paths are system calls and hand-offs between goroutines:
// a relayed request is a read, a queued upstream write and a reply write; a
// lock cycle wakes the client's goroutine, the nodes' writers and their
// readers. With more than one P, a goroutine made ready while another runs
// wakes a second thread, and Go's idle threads spin looking for work before
// they sleep again. On this project's 2-core machine one P cost up to a
// fifth less CPU per relayed request and a quarter less per lock cycle
// than two (README, "Threads"); twemproxy and Redis, single-threaded by design, avoid that
// cost too. One P also caps lockproxy at about one core, so the Controller
// starts with one and, once lockproxy keeps most of a core busy, hands
// GOMAXPROCS back to the runtime's default (every CPU the process may use,
// following its cgroup quota and affinity as they change), and goes back
// to one after a quiet spell.
//
// The measure is the CPU the process got, not the CPU it wanted: on a host
// where other processes take the cores, one P gets what one thread gets
// (as Redis does) rather than growing to win a bigger share from them.
package procs

import (
	"context"
	"runtime"
	"time"
)

// Policy says when the Controller changes the number of Ps.
type Policy struct {
	// Interval is how often CPU use is sampled.
	Interval time.Duration
	// GrowAt is the CPU use, in cores, that hands GOMAXPROCS to the
	// runtime when one P has used at least that much for GrowAfter
	// intervals in a row: one P is about saturated at one core (its
	// thread runs Go code and the system calls it makes), and below that
	// one P does more with the CPU it gets than several.
	GrowAt    float64
	GrowAfter int
	// MinLimit is the CPU limit (cgroup quota, CPUs) under which it never
	// grows: two threads sharing one core's quota only add the cost.
	MinLimit float64
	// ShrinkBelow is the CPU use under which, for ShrinkAfter intervals
	// in a row, one P comes back. Below GrowAt, so that the load that
	// brings one P back (which costs less CPU on one) does not make it
	// grow again at once.
	ShrinkBelow float64
	ShrinkAfter int
}

// DefaultPolicy grows after 300 ms of lockproxy keeping 90 % of a core
// busy on one P, when the process may use at least 1.5 cores, and shrinks
// after 10 s under 0.6 cores.
var DefaultPolicy = Policy{
	Interval: 100 * time.Millisecond,
	GrowAt:   0.9, GrowAfter: 3, MinLimit: 1.5,
	ShrinkBelow: 0.6, ShrinkAfter: 100,
}

type action int

const (
	stay action = iota
	grow
	shrink
)

// state is what the policy remembers between samples.
type state struct {
	grown bool // GOMAXPROCS is the runtime's
	run   int  // intervals in a row past the threshold that would change it
}

// next says what to do after an interval in which the process used used
// cores of CPU.
func (p Policy) next(s *state, used float64) action {
	switch {
	case !s.grown && used >= p.GrowAt:
		if s.run++; s.run >= p.GrowAfter {
			s.run = 0
			return grow
		}
	case s.grown && used < p.ShrinkBelow:
		if s.run++; s.run >= p.ShrinkAfter {
			s.run = 0
			return shrink
		}
	default:
		s.run = 0
	}
	return stay
}

// Controller applies a Policy to the running process.
type Controller struct {
	policy Policy
	// The process's CPU time, the clock, its CPU limit in cores, and the
	// scheduler's settings; tests replace them.
	cpu   func() time.Duration
	now   func() time.Time
	limit func() float64
	one   func()     // GOMAXPROCS 1
	toRun func() int // the runtime's default, and its own updates; returns it
	// Changed, when set, is told of every change (for the log).
	Changed func(procs int, used float64)
}

// New returns a controller for the running process.
func New(p Policy) *Controller {
	return &Controller{
		policy: p, cpu: processCPU, now: time.Now,
		limit: func() float64 { return min(float64(runtime.NumCPU()), hostCgroups.cpuQuota()) },
		one:   func() { runtime.GOMAXPROCS(1) },
		toRun: func() int {
			runtime.SetDefaultGOMAXPROCS()
			return runtime.GOMAXPROCS(0)
		},
	}
}

// Run sets one P, then samples the process's CPU use every interval and
// changes the number of Ps as the policy says, until ctx ends. It leaves
// the number as it was last set.
func (c *Controller) Run(ctx context.Context) {
	p := c.policy
	if p.Interval <= 0 {
		return
	}
	c.one()
	s := state{}
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
		switch p.next(&s, used) {
		case grow:
			if c.limit() < p.MinLimit {
				continue // looked at again after GrowAfter more intervals
			}
			n := c.toRun()
			if n <= 1 {
				// One CPU: the runtime's default is what there was.
				continue
			}
			s.grown = true
			c.changed(n, used)
		case shrink:
			c.one()
			s.grown = false
			c.changed(1, used)
		}
	}
}

func (c *Controller) changed(n int, used float64) {
	if c.Changed != nil {
		c.Changed(n, used)
	}
}
