package redis

import (
	"reflect"
	"sync"
	"testing"
	"time"
)

// fakeClock is a settable clock for health.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestParseServerInfo(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want serverInfo
	}{
		{"redis", "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\nuptime_in_seconds:42\r\n", serverInfo{"abc123", 42 * time.Second, true}},
		{"no run_id", "# Server\r\nuptime_in_seconds:7\r\n", serverInfo{"", 7 * time.Second, true}},
		{"bad uptime", "run_id:x\r\nuptime_in_seconds:-1\r\n", serverInfo{"x", 0, false}},
		{"empty", "", serverInfo{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseServerInfo(tc.in); got != tc.want {
				t.Errorf("parseServerInfo(%q) = %+v; want %+v", tc.in, got, tc.want)
			}
		})
	}
}

// TestHealth drives the quarantine state machine through a script of
// events and checks the state after each.
func TestHealth(t *testing.T) {
	const period = 3 * time.Second
	type step struct {
		advance time.Duration
		info    *serverInfo // observe this answer
		down    bool        // setDown(true)
		seed    bool        // seedDue, then seeded if due
		// want after the step
		restart  bool // observe reported a restart
		state    string
		left     time.Duration
		restarts uint64
		seedDue  bool
	}
	info := func(id string, up time.Duration) *serverInfo {
		return &serverInfo{runID: id, uptime: up, hasUptime: true}
	}
	tests := []struct {
		name   string
		period time.Duration
		steps  []step
	}{
		{"first run_id is not a restart", period, []step{
			{info: info("a", time.Hour), state: stateOK},
			{advance: time.Second, info: info("a", time.Hour+time.Second), state: stateOK},
		}},
		{"new run_id quarantines for the period", period, []step{
			{info: info("a", time.Hour), state: stateOK},
			{advance: time.Second, info: info("b", 0), restart: true, state: stateQuarantined, left: period, restarts: 1},
			{advance: time.Second, info: info("b", time.Second), state: stateQuarantined, left: period - time.Second, restarts: 1},
			{advance: period - time.Second, state: stateQuarantined, restarts: 1, seedDue: true},
			{seed: true, state: stateOK, restarts: 1},
		}},
		{"not seeded before the period ends", period, []step{
			{info: info("a", time.Hour), state: stateOK},
			{info: info("b", 0), restart: true, state: stateQuarantined, left: period, restarts: 1},
			{advance: period - time.Millisecond, seed: true, state: stateQuarantined, left: time.Millisecond, restarts: 1},
			{advance: time.Millisecond, seed: true, state: stateOK, restarts: 1},
		}},
		{"a second restart starts the period again", period, []step{
			{info: info("a", time.Hour), state: stateOK},
			{info: info("b", 0), restart: true, state: stateQuarantined, left: period, restarts: 1},
			{advance: 2 * time.Second, info: info("c", 0), restart: true, state: stateQuarantined, left: period, restarts: 2},
			{advance: 2 * time.Second, seed: true, state: stateQuarantined, left: period - 2*time.Second, restarts: 2},
		}},
		{"younger uptime without run_id is a restart", period, []step{
			{info: info("", time.Hour), state: stateOK},
			{advance: 10 * time.Second, info: info("", time.Hour+10*time.Second), state: stateOK},
			{advance: 10 * time.Second, info: info("", time.Second), restart: true, state: stateQuarantined, left: period, restarts: 1},
		}},
		{"uptime jitter is not a restart", period, []step{
			{info: info("", time.Hour), state: stateOK},
			{advance: 1500 * time.Millisecond, info: info("", time.Hour), state: stateOK},
		}},
		{"never reached is down", period, []step{
			{down: true, state: stateDown},
		}},
		{"down and back", period, []step{
			{info: info("a", time.Hour), state: stateOK},
			{down: true, state: stateDown},
			{info: info("a", time.Hour), state: stateOK},
		}},
		{"quarantined beats down", period, []step{
			{info: info("a", time.Hour), state: stateOK},
			{info: info("b", 0), restart: true, state: stateQuarantined, left: period, restarts: 1},
			{down: true, state: stateQuarantined, left: period, restarts: 1},
		}},
		{"quarantine off counts restarts only", 0, []step{
			{info: info("a", time.Hour), state: stateOK},
			{info: info("b", 0), restart: true, state: stateOK, restarts: 1},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := &fakeClock{t: time.Unix(1_000_000, 0)}
			h := newHealth(tt.period, clk.now)
			for i, s := range tt.steps {
				clk.advance(s.advance)
				restart := false
				if s.info != nil {
					restart = h.observe(*s.info)
				}
				if s.down {
					h.setDown(true)
				}
				if s.seed && h.seedDue() {
					h.seeded()
				}
				if restart != s.restart {
					t.Errorf("step %d: observe = %v; want %v", i, restart, s.restart)
				}
				state, left, restarts := h.status()
				if state != s.state || left != s.left || restarts != s.restarts {
					t.Errorf("step %d: status = %s, %v, %d; want %s, %v, %d", i, state, left, restarts, s.state, s.left, s.restarts)
				}
				if got := h.quarantined(); got != (s.state == stateQuarantined) {
					t.Errorf("step %d: quarantined = %v; want %v", i, got, s.state == stateQuarantined)
				}
				if !s.seed {
					if got := h.seedDue(); got != s.seedDue {
						t.Errorf("step %d: seedDue = %v; want %v", i, got, s.seedDue)
					}
				}
			}
		})
	}
}

// TestHealthRace runs the detector from several goroutines, as onConnect
// and the periodic check do (meaningful under -race).
func TestHealthRace(t *testing.T) {
	h := newHealth(time.Millisecond, nil)
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				h.observe(serverInfo{runID: string(rune('a' + (i/50+g)%3))})
				_ = h.quarantined()
				if h.seedDue() {
					h.seeded()
				}
				h.status()
			}
		}(g)
	}
	wg.Wait()
}

func TestMergeFences(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []map[string]string
		want map[string]uint64
	}{
		{"none", nil, map[string]uint64{}},
		{"max per field", []map[string]string{
			{"1": "5", "2": "9"},
			{"1": "7", "3": "1"},
			{"2": "3"},
		}, map[string]uint64{"1": 7, "2": 9, "3": 1}},
		{"junk skipped", []map[string]string{{"1": "x", "2": "-3", "3": "4"}}, map[string]uint64{"3": 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := mergeFences(tc.in); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("mergeFences(%v) = %v; want %v", tc.in, got, tc.want)
			}
		})
	}
}
