package commands

import (
	"strings"
	"testing"

	"github.com/lockproxy/lockproxy/resp"
)

// nodeStatesBackend is a fakeBackend that describes its nodes.
type nodeStatesBackend struct {
	fakeBackend
	states []string
}

func (b *nodeStatesBackend) NodeStates() []string { return b.states }

// TestInfoNodeStates: INFO lockproxy has one line per node when the
// backend describes its nodes, and none when it does not.
func TestInfoNodeStates(t *testing.T) {
	states := []string{
		"addr=127.0.0.1:7001,state=ok,quarantine_left_ms=0,restarts=0,rate_error_ppm=12",
		"addr=127.0.0.1:7002,state=quarantined,quarantine_left_ms=2500,restarts=1,rate_error_ppm=-1",
		"addr=127.0.0.1:7003,state=clock,quarantine_left_ms=0,restarts=0,rate_error_ppm=81000",
	}
	for _, tc := range []struct {
		name string
		opts Options
		want []string
		not  []string
	}{
		{"with states", Options{Limits: testLimits, Backend: &nodeStatesBackend{states: states}},
			[]string{"lockproxy_node0:" + states[0] + "\r\n", "lockproxy_node1:" + states[1] + "\r\n", "lockproxy_node2:" + states[2] + "\r\n"}, []string{"lockproxy_node3:"}},
		{"without", Options{Limits: testLimits, Backend: &fakeBackend{}}, nil, []string{"lockproxy_node0:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHandler(tc.opts)
			defer h.Close()
			s := &resp.Session{W: resp.NewWriter()}
			h.ServeRESP(s, words("INFO lockproxy"))
			got := parseOne(t, s.W.Bytes(), 2).str
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("INFO lockproxy = %q; want it to contain %q", got, w)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(got, n) {
					t.Errorf("INFO lockproxy = %q; want no %q", got, n)
				}
			}
		})
	}
}
