package procs

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestPolicyNext(t *testing.T) {
	p := Policy{Interval: time.Millisecond, GrowAt: 0.9, GrowAfter: 3, ShrinkBelow: 0.6, ShrinkAfter: 4}
	const S, G, K = stay, grow, shrink
	tests := []struct {
		name  string
		grown bool
		used  []float64 // cores used in each interval
		want  []action  // what to do after each
	}{
		{"idle stays at one", false, []float64{0, 0.1, 0.5}, []action{S, S, S}},
		{"busy below the threshold stays at one", false, []float64{0.85, 0.89, 0.88, 0.89}, []action{S, S, S, S}},
		{"grows after GrowAfter busy intervals", false, []float64{0.95, 1.0, 0.92}, []action{S, S, G}},
		{"a quiet interval restarts the count", false, []float64{0.95, 0.95, 0.5, 0.95, 0.95, 0.95}, []action{S, S, S, S, S, G}},
		{"busy when grown stays", true, []float64{1.5, 3.2, 0.7, 0.6}, []action{S, S, S, S}},
		{"shrinks after ShrinkAfter quiet intervals", true, []float64{0.5, 0.1, 0.2, 0.59}, []action{S, S, S, K}},
		{"a busy interval restarts the quiet count", true, []float64{0.1, 0.1, 0.1, 0.7, 0.1, 0.1, 0.1, 0.1}, []action{S, S, S, S, S, S, S, K}},
		// A negative figure (the clock or the CPU reading went back) is
		// quiet, never a reason to grow.
		{"negative use", false, []float64{-3, -3, -3}, []action{S, S, S}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := state{grown: tt.grown}
			for i, u := range tt.used {
				if got := p.next(&s, u); got != tt.want[i] {
					t.Fatalf("interval %d (used %.2f): %v, want %v", i, u, got, tt.want[i])
				}
			}
		})
	}
}

func TestDefaultPolicy(t *testing.T) {
	p := DefaultPolicy
	// Whatever the figures, the load that brings one P back must not make
	// it grow again: ShrinkBelow under GrowAt, and one P can use a core.
	if !(p.ShrinkBelow < p.GrowAt && p.GrowAt < 1) || p.GrowAfter < 1 || p.ShrinkAfter < p.GrowAfter || p.MinLimit <= 1 {
		t.Fatalf("DefaultPolicy = %+v", p)
	}
}

// fakeProcess is the process a Controller sees in tests: a CPU clock
// the test script advances, a wall clock one interval per sample, and
// the GOMAXPROCS settings made.
type fakeProcess struct {
	mu      sync.Mutex
	used    []float64 // cores used in each successive interval
	cpu     time.Duration
	wall    time.Time
	step    time.Duration
	samples int
	sets    []int   // GOMAXPROCS as set, in order
	def     int     // the runtime's default
	limit   float64 // the CPU limit, in cores
	drained chan struct{}
}

func (f *fakeProcess) cpuNow() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cpu
}

// now advances both clocks by one interval of the script, from the second
// call on (the first is the Controller's starting point).
func (f *fakeProcess) now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.samples > 0 {
		i := f.samples - 1
		if i < len(f.used) {
			f.cpu += time.Duration(f.used[i] * float64(f.step))
			f.wall = f.wall.Add(f.step)
			if i == len(f.used)-1 {
				close(f.drained)
			}
		} else {
			f.wall = f.wall.Add(f.step) // idle past the script
		}
	}
	f.samples++
	return f.wall
}

func (f *fakeProcess) one() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sets = append(f.sets, 1)
}

func (f *fakeProcess) toRun() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sets = append(f.sets, f.def)
	return f.def
}

func (f *fakeProcess) cpuLimit() float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.limit
}

func (f *fakeProcess) controller(p Policy) *Controller {
	return &Controller{policy: p, cpu: f.cpuNow, now: f.now, limit: f.cpuLimit, one: f.one, toRun: f.toRun}
}

// run runs a controller over the whole script and returns the settings
// it made and the changes it reported.
func (f *fakeProcess) run(t *testing.T, p Policy) (sets, changes []int) {
	t.Helper()
	c := f.controller(p)
	c.Changed = func(n int, used float64) { changes = append(changes, n) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx)
	}()
	select {
	case <-f.drained:
	case <-time.After(10 * time.Second):
		t.Fatal("the controller did not sample the whole script within 10 s")
	}
	cancel()
	<-done // Run ends with its context
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sets, changes
}

func newFake(def int, limit float64, used ...float64) *fakeProcess {
	return &fakeProcess{used: used, wall: time.Unix(1000, 0), step: 10 * time.Millisecond, def: def, limit: limit, drained: make(chan struct{})}
}

func TestControllerRun(t *testing.T) {
	p := Policy{Interval: time.Millisecond, GrowAt: 0.9, GrowAfter: 2, MinLimit: 1.5, ShrinkBelow: 0.6, ShrinkAfter: 3}
	// Two busy intervals (grow), three quiet ones (shrink), then two busy
	// ones again (grow).
	script := []float64{1, 1, 0.1, 0.1, 0.1, 0.95, 0.95}
	tests := []struct {
		name        string
		def         int
		limit       float64
		wantSets    []int
		wantChanges []int
	}{
		{"4 CPUs", 4, 4, []int{1, 4, 1, 4}, []int{4, 1, 4}},
		{"a quota of 2 cores", 2, 2, []int{1, 2, 1, 2}, []int{2, 1, 2}},
		// The runtime's default is 2 under a quota of one core; two threads
		// would share it: stay at one.
		{"a quota of 1 core", 2, 1, []int{1}, nil},
		{"one CPU", 1, 1, []int{1}, nil},
		// A default of 1 (one CPU, affinity) past the limit check: nothing
		// grew, nothing to report.
		{"default of one", 1, 8, []int{1, 1, 1}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(tt.def, tt.limit, script...)
			sets, changes := f.run(t, p)
			if !slices.Equal(sets, tt.wantSets) {
				t.Errorf("GOMAXPROCS set to %v, want %v", sets, tt.wantSets)
			}
			if !slices.Equal(changes, tt.wantChanges) {
				t.Errorf("Changed saw %v, want %v", changes, tt.wantChanges)
			}
		})
	}
}

func TestProcessCPU(t *testing.T) {
	// The process's CPU clock moves when it works.
	before := processCPU()
	deadline := time.Now().Add(50 * time.Millisecond)
	x := 0
	for time.Now().Before(deadline) {
		x++
	}
	if after := processCPU(); after <= before {
		t.Fatalf("process CPU time did not move over 50 ms of work: %v then %v (%d)", before, after, x)
	}
}
