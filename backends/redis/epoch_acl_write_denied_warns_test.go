package redis

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestEpochWriteDeniedStaysUsableAndWarns: a node whose ACL lets lockproxy
// read but not write its epoch key refuses the set-up's SET NX, so no
// epoch exists and the connection checks none. The node must stay usable
// (no quarantine, acquires granted), and, as when the GET is refused, the
// operator must be told once that a FLUSHALL or a full sync there goes
// unseen until a check: nothing else says the epoch check is off.
func TestEpochWriteDeniedStaysUsableAndWarns(t *testing.T) {
	harness.RequireBinary(t, "redis-server", "redis-server")
	r := harness.StartRedis(t, harness.RedisOptions{})
	ctx := ctxTimeout(t, 10*time.Second)
	if err := r.Client(t).Do(ctx, "ACL", "SETUSER", "lp", "on", ">pw", "&*", "+@all",
		"resetkeys", "~lp:[^e]*", "%R~lp:epoch").Err(); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	n := NewNode(NodeConfig{Addr: r.Addr, KeyPrefix: "lp:", Timeout: time.Second, Metrics: NewMetrics(nil),
		Username: "lp", Password: "pw", Logger: zap.New(core)})
	t.Cleanup(func() { n.Close() })
	for i := 0; i < 3; i++ {
		g, err := n.Acquire(ctx, quorum.Request{Key: "k" + string(rune('a'+i)), Token: "A", TTL: time.Second})
		if err != nil || !g.Acquired {
			t.Fatalf("acquire %d with the epoch's write denied: %+v, %v", i, g, err)
		}
	}
	if st, _, _ := n.State(); st != stateOK {
		t.Errorf("node is %s; want %s", st, stateOK)
	}
	if v, err := r.Client(t).Exists(ctx, "lp:epoch").Result(); err != nil || v != 0 {
		t.Fatalf("epoch key exists = %d, %v; want it refused (absent)", v, err)
	}
	warned := false
	for _, e := range logs.All() {
		if strings.Contains(e.Message, "epoch") {
			warned = true
		}
	}
	if !warned {
		t.Errorf("no warning that the node's data epoch cannot be kept (SET NX refused): FLUSHALL detection is silently off")
	}
}
