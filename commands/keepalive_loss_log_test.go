package commands

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// TestKeepaliveLossLogsNodeErrors: the log line of a KEEPALIVE lock lost
// to failed renewals carries why and the last renewal's error, which on
// RedLock names each node's failure. Before, it said only
// reason=renew_failed and the TTL: 9,755 locks lost at once under load
// logged as many lines without a word of which nodes failed, or how.
func TestKeepaliveLossLogsNodeErrors(t *testing.T) {
	nodes := "1/3 nodes: 127.0.0.1:6380 timeout, 127.0.0.1:6381 timeout"
	b := &fakeBackend{renewErr: fmt.Errorf("%w: %s", quorum.ErrNoQuorum, nodes)}
	k, logs := newObservedKeepalives(t, b, time.Minute)
	a := newTestConn(t, 3)
	if !k.startHold(a.ctx, a.ka, "k", "tok", 60*time.Millisecond, 0, backends.Write, true) {
		t.Fatal("startHold = false")
	}
	waitEnded(t, a)
	waitStopped(t, k)
	lost := logs.FilterMessage("keepalive lock lost").All()
	if len(lost) != 1 {
		t.Fatalf("%d \"keepalive lock lost\" lines logged; want 1", len(lost))
	}
	f := lost[0].ContextMap()
	if e, _ := f["error"].(string); !strings.Contains(e, nodes) {
		t.Errorf("loss logged with error %q (fields %v); want the renewal's, naming the nodes: %q", e, f, nodes)
	}
	if why, _ := f["why"].(string); why != "a renewal did not reach a quorum of nodes" {
		t.Errorf("loss logged with why %q; want the reason its holder was told", why)
	}
}
