package redis

import (
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
)

// TestSubscriberRedialsStrandedConnection: a subscription connection that
// a partition or a NAT forgot stays open and takes writes, so only the
// missing answer to the subscriber's PING after a silence shows it is
// dead: the subscriber then redials and subscribes again, and releases
// announced after that wake it. Before, the PING's missing answer went
// unnoticed and the subscription stayed deaf until TCP gave up (minutes).
func TestSubscriberRedialsStrandedConnection(t *testing.T) {
	r := harness.StartRedis(t, harness.RedisOptions{})
	link := harness.StartLink(t, r.Addr)
	n := NewNode(NodeConfig{Addr: link.Addr(), KeyPrefix: "lp:", Timeout: 200 * time.Millisecond, Metrics: NewMetrics(nil)})
	t.Cleanup(func() { n.Close() })
	n.subscribePing = 300 * time.Millisecond
	woken := make(chan string, 16)
	s := newSubscriber(n, func(string) bool { return true }, func(key string) { woken <- key })
	t.Cleanup(s.close)
	s.update("k")

	direct := r.Client(t)
	ctx := ctxTimeout(t, 30*time.Second)
	publishUntilWoken := func(what string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if err := direct.Publish(ctx, "lp:released:k", "").Err(); err != nil {
				t.Fatal(err)
			}
			select {
			case <-woken:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
		t.Fatalf("no wake-up %s within 10 s", what)
	}
	publishUntilWoken("before the connection was stranded")
	link.Strand()
	// Silence (300 ms), a PING that gets no answer (1 s), a redial.
	time.Sleep(2 * time.Second)
	publishUntilWoken("after the connection was stranded")
}
