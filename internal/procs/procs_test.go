package procs

import (
	"context"
	"sync"
	"testing"
	"time"
)

func TestPolicyNext(t *testing.T) {
	p := Policy{Max: 4, Interval: time.Millisecond, GrowAt: 0.9, GrowAfter: 3, ShrinkBelow: 0.6, ShrinkAfter: 4}
	tests := []struct {
		name  string
		start int
		used  []float64 // cores used in each interval
		want  []int     // procs after each
	}{
		{"idle stays at one", 1, []float64{0, 0.1, 0.5}, []int{1, 1, 1}},
		{"busy below the threshold stays at one", 1, []float64{0.85, 0.89, 0.88, 0.89}, []int{1, 1, 1, 1}},
		{"grows after GrowAfter busy intervals", 1, []float64{0.95, 1.0, 0.92}, []int{1, 1, 4}},
		{"a quiet interval restarts the count", 1, []float64{0.95, 0.95, 0.5, 0.95, 0.95, 0.95}, []int{1, 1, 1, 1, 1, 4}},
		{"busy at max stays", 4, []float64{1.5, 3.2, 0.7, 0.6}, []int{4, 4, 4, 4}},
		{"shrinks after ShrinkAfter quiet intervals", 4, []float64{0.5, 0.1, 0.2, 0.59}, []int{4, 4, 4, 1}},
		{"a busy interval restarts the quiet count", 4, []float64{0.1, 0.1, 0.1, 0.7, 0.1, 0.1, 0.1, 0.1}, []int{4, 4, 4, 4, 4, 4, 4, 1}},
		{"grows again after shrinking", 4, []float64{0, 0, 0, 0, 1, 1, 1}, []int{4, 4, 4, 1, 1, 1, 4}},
		// A negative figure (the clock or the CPU reading went back) is
		// quiet, never a reason to grow.
		{"negative use", 1, []float64{-3, -3, -3}, []int{1, 1, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := state{procs: tt.start}
			for i, u := range tt.used {
				if got := p.next(&s, u); got != tt.want[i] {
					t.Fatalf("interval %d (used %.2f): procs %d, want %d", i, u, got, tt.want[i])
				}
			}
		})
	}
}

func TestDefaultPolicy(t *testing.T) {
	p := DefaultPolicy(8)
	// Whatever the figures, the load that brings one P back must not make
	// it grow again: ShrinkBelow under GrowAt, and one P can use a core.
	if !(p.ShrinkBelow < p.GrowAt && p.GrowAt < 1) || p.GrowAfter < 1 || p.ShrinkAfter < p.GrowAfter || p.Max != 8 {
		t.Fatalf("DefaultPolicy(8) = %+v", p)
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
	sets    []int
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

func (f *fakeProcess) set(n int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sets = append(f.sets, n)
	return 0
}

func TestControllerRun(t *testing.T) {
	p := Policy{Max: 3, Interval: time.Millisecond, GrowAt: 0.9, GrowAfter: 2, ShrinkBelow: 0.6, ShrinkAfter: 3}
	f := &fakeProcess{
		// Two busy intervals (grow), three quiet ones (shrink), then two
		// busy ones again (grow).
		used:    []float64{1, 1, 0.1, 0.1, 0.1, 0.95, 0.95},
		wall:    time.Unix(1000, 0),
		step:    10 * time.Millisecond,
		drained: make(chan struct{}),
	}
	c := &Controller{policy: p, cpu: f.cpuNow, now: f.now, set: f.set}
	var changes []int
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
	want := []int{1, 3, 1, 3} // one at the start, then each change once
	if len(f.sets) < len(want) {
		t.Fatalf("GOMAXPROCS set to %v, want %v", f.sets, want)
	}
	for i, n := range want {
		if f.sets[i] != n {
			t.Fatalf("GOMAXPROCS set to %v, want %v", f.sets, want)
		}
	}
	if len(f.sets) != len(want) {
		t.Fatalf("GOMAXPROCS set to %v, want exactly %v (idle past the script is quiet for only %d intervals at most)", f.sets, want, p.ShrinkAfter)
	}
	if len(changes) < 3 || changes[0] != 3 || changes[1] != 1 || changes[2] != 3 {
		t.Fatalf("Changed saw %v, want [3 1 3]", changes)
	}
}

func TestControllerOneProcIsNoop(t *testing.T) {
	// With one CPU there is nothing to size: Run returns at once and sets
	// nothing.
	var sets []int
	c := &Controller{policy: DefaultPolicy(1), cpu: processCPU, now: time.Now, set: func(n int) int { sets = append(sets, n); return 0 }}
	c.Run(context.Background())
	if len(sets) != 0 {
		t.Fatalf("GOMAXPROCS set to %v with Max 1", sets)
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
