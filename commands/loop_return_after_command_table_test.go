package commands

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/conf"
	"github.com/lockproxy/lockproxy/relay"
	"github.com/lockproxy/lockproxy/resp"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestLoopTakesRelayBackOnceCommandTableKnown: a client whose first
// relayed command reached lockproxy before the upstream's COMMAND table
// was read is moved off the event loop; once the table is read (its own
// command read it), its plain relayed commands must bring it back to the
// loop, not keep it on a goroutine for good.
func TestLoopTakesRelayBackOnceCommandTableKnown(t *testing.T) {
	up := harness.StartRedis(t, harness.RedisOptions{})
	rl := relay.New(relay.Config{Addr: up.Addr, PoolSize: 2, DialTimeout: time.Second, ReadTimeout: 10 * time.Second,
		Deny: conf.DefaultDenyCommands, KeyPrefix: "lockproxy:"})
	h := NewHandler(Options{Limits: testLimits, Backend: &fakeBackend{}, Relay: rl})
	srv := &resp.Server{Handler: h, EventLoop: true}
	addr := serveRelayed(t, srv, h, rl)
	c := dialFrames(t, addr)
	for i := range 64 {
		if r := c.do("GET x"); r != "_" {
			t.Fatalf("GET %d: %s", i, r)
		}
		if _, _, back := srv.LoopStats(); back > 0 {
			if !rl.KnowsCommands() {
				t.Fatal("back on the loop before the command table was read")
			}
			return
		}
	}
	_, handoffs, back := srv.LoopStats()
	t.Errorf("after 64 GETs: %d hand-offs, %d returns to the loop; want the connection back on the loop", handoffs, back)
}
