package commands

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/conf"
	"github.com/lockproxy/lockproxy/relay"
	"github.com/lockproxy/lockproxy/resp"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestLoopDoesNotDialForCommandTable: before the relay has read the
// upstream's COMMAND table (lockproxy started while the upstream hangs: it
// accepts connections and answers nothing), a relayed command needs the
// table (key positions, MayWrite) and dials for it. On the event loop that
// dial, whose handshake may take seconds, stalled every connection the loop
// serves: another client's PING (or a LOCK, which a new connection sends
// through the loop first) waited for it. The loop must not wait for the
// upstream.
func TestLoopDoesNotDialForCommandTable(t *testing.T) {
	up := harness.StartRedis(t, harness.RedisOptions{})
	up.Pause()
	t.Cleanup(up.Resume)
	rl := relay.New(relay.Config{Addr: up.Addr, PoolSize: 2, DialTimeout: time.Second, ReadTimeout: 10 * time.Second,
		Deny: conf.DefaultDenyCommands, KeyPrefix: "lockproxy:"})
	h := NewHandler(Options{Limits: testLimits, Backend: &fakeBackend{}, Relay: rl})
	srv := &resp.Server{Handler: h, EventLoop: true}
	addr := serveRelayed(t, srv, h, rl)

	a := dialFrames(t, addr)
	a.send("GET x")
	for deadline := time.Now().Add(5 * time.Second); ; {
		if n, _ := rl.DialStats(); n > 0 {
			break // the dial for the table is under way
		}
		if time.Now().After(deadline) {
			t.Fatal("the GET never made the relay dial")
		}
		time.Sleep(5 * time.Millisecond)
	}
	b := dialFrames(t, addr)
	start := time.Now()
	b.send("PING")
	r, err := b.read(10 * time.Second)
	if err != nil || r != "+PONG" {
		t.Fatalf("PING: %q, %v", r, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("another client's PING waited %v for the upstream's handshake; want an answer at once", d.Round(time.Millisecond))
	}
	// Resumed here, not only in the cleanup: serveRelayed's shutdown runs
	// before that cleanup and would wait out its 5 s for the GET that the
	// paused upstream still holds up.
	up.Resume()
}
