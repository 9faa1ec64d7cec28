package commands

import (
	"testing"
	"time"
)

// TestClientUnblockByClientID: a client reads its id with CLIENT ID and
// blocks in BLPOP; another client ends the wait with CLIENT UNBLOCK <id>.
// On Redis the second client gets :1 and the BLPOP answers nil at once.
// Through lockproxy CLIENT ID answers lockproxy's own id while CLIENT
// UNBLOCK is relayed with it to the upstream, where the blocked command
// runs on a connection with another id: the UNBLOCK answers :0 and the
// BLPOP waits out its whole timeout. Worse, the relayed id may be that of
// an upstream connection pinned to some other client, whose BLPOP it
// would end.
func TestClientUnblockByClientID(t *testing.T) {
	onRedisAndLockproxy(t, func(t *testing.T, _, addr, _ string) {
		blocked, other := dialRaw(t, addr), dialRaw(t, addr)
		id := clientID(t, blocked)
		blockOn(t, blocked, "BLPOP unblock:q 4")
		start := time.Now()
		if got := other.do(t, "CLIENT UNBLOCK "+id); got != ":1" {
			t.Errorf("CLIENT UNBLOCK %s (the blocked client's CLIENT ID) = %q; want :1", id, got)
		}
		got := blocked.reply(t)
		if waited := time.Since(start); got != "*-1" || waited > 2*time.Second {
			t.Errorf("BLPOP after CLIENT UNBLOCK = %q after %v; want *-1 at once", got, waited.Round(time.Millisecond))
		}
	})
}
