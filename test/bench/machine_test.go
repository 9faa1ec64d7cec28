package bench

import "testing"

func TestParseCPULine(t *testing.T) {
	tests := []struct {
		name string
		line string
		want machineTicks
	}{
		{"kernel 6 with guest fields", "cpu  100 5 50 800 10 0 20 15 7 0", machineTicks{total: 1000, idle: 810, steal: 15}},
		{"no guest fields", "cpu 1 0 1 6 0 0 0 2", machineTicks{total: 10, idle: 6, steal: 2}},
		{"a single CPU's line", "cpu0 100 5 50 800 10 0 20 15 7 0", machineTicks{}},
		{"too few fields", "cpu 1 2 3 4 5 6 7", machineTicks{}},
		{"not a number", "cpu 1 2 x 4 5 6 7 8", machineTicks{}},
		{"empty", "", machineTicks{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := parseCPULine(tt.line); got != tt.want {
				t.Errorf("parseCPULine(%q) = %+v, want %+v", tt.line, got, tt.want)
			}
		})
	}
}

func TestShareSince(t *testing.T) {
	tests := []struct {
		name          string
		before, after machineTicks
		want          machineShare
	}{
		{"a quarter idle, a tenth stolen", machineTicks{total: 1000, idle: 100, steal: 10}, machineTicks{total: 1200, idle: 150, steal: 30},
			machineShare{idle: 25, steal: 10, ok: true}},
		{"not measured before", machineTicks{}, machineTicks{total: 100}, machineShare{}},
		{"no time passed", machineTicks{total: 100}, machineTicks{total: 100}, machineShare{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := shareSince(tt.before, tt.after); got != tt.want {
				t.Errorf("shareSince = %+v, want %+v", got, tt.want)
			}
		})
	}
}
