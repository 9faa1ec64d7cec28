package redis

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
)

// TestCloseWithNodesUnresponsive: Close runs last in lockproxy's
// shutdown; nodes that stopped answering (a frozen host, a partition that
// drops packets) must not hold the process's exit. Each node's release
// subscriber here is connecting through a link that drops every byte, an
// attempt go-redis gives up on its read timeouts, about 5 s after it began,
// holding the PubSub's lock until then. Before, Close waited for those
// attempts, one subscriber after the other while each still open started
// a new one: 10 to 16 s with three nodes; closed side by side, still about
// 5 s. Close now closes the connection an attempt is on.
func TestCloseWithNodesUnresponsive(t *testing.T) {
	b, _ := newRealBackend(t, 3, func(cfg *Config) {
		for i := range cfg.Nodes {
			link := harness.StartLink(t, cfg.Nodes[i].Addr)
			link.Cut()
			cfg.Nodes[i].Addr = link.Addr()
		}
	})
	// The subscribers' first attempts are under way.
	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	closed := make(chan struct{})
	go func() {
		_ = b.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		t.Fatal("Close had not returned after 20 s")
	}
	took := time.Since(start)
	// Margin for a loaded host: an attempt waited for is 4.5 s here.
	if took > 2*time.Second {
		t.Errorf("Close took %v with every node unresponsive; want it prompt, not waiting for a connection attempt's timeouts", took)
	}
	t.Logf("Close took %v", took)
}
