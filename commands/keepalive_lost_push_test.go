package commands

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/relay"
)

// slowKeyBackend answers every renewal "not held" (the locks are lost) and
// grants key "slow" only after a delay (a LOCK on a node outage waits the
// node timeout before its NOQUORUM).
type slowKeyBackend struct {
	fakeBackend
	delay time.Duration
}

func (b *slowKeyBackend) Lock(ctx context.Context, req backends.LockRequest) (backends.Lease, error) {
	if req.Key == "slow" {
		time.Sleep(b.delay)
	}
	return backends.Lease{Token: req.Token, Validity: req.TTL, Fence: 1}, nil
}

// TestEveryLostLockIsPushed proves that a RESP3 connection gets one
// lock-lost push for each of its KEEPALIVE locks lost, however many are
// lost while it runs a command: the pushes wait for the batch's reply
// (resp.Session's queue has room for 16), and those past the room wait
// too (Session.PushHeld) instead of being dropped. A client holds 40
// KEEPALIVE locks, which are all lost while a slow LOCK runs. Before, every
// push past the 16th was dropped, and those holders were never told.
func TestEveryLostLockIsPushed(t *testing.T) {
	const n = 40
	b := &slowKeyBackend{delay: 1500 * time.Millisecond}
	b.renewZero = true
	conn := dialHandler(t, b)
	defer conn.Close()
	write := func(args ...string) {
		var cmd [][]byte
		for _, a := range args {
			cmd = append(cmd, []byte(a))
		}
		if _, err := conn.Write(relay.AppendCommand(nil, cmd)); err != nil {
			t.Fatal(err)
		}
	}
	write("HELLO", "3")
	readFrames(t, conn, 1)
	for i := 0; i < n; i++ {
		write("LOCK", fmt.Sprintf("k%d", i), "PX", "3000", "KEEPALIVE")
	}
	readFrames(t, conn, n)
	// The renewals (at +1 s) find every lock gone while LOCK slow runs.
	time.Sleep(300 * time.Millisecond)
	write("LOCK", "slow", "PX", "3000")
	frames := readFrames(t, conn, 1+n) // the reply and a push for each lock
	pushes := map[string]int{}
	for _, f := range frames {
		if s := string(f); strings.HasPrefix(s, ">3\r\n$9\r\nlock-lost") {
			pushes[strings.Split(s, "\r\n")[4]]++
		}
	}
	for i := 0; i < n; i++ {
		if k := fmt.Sprintf("k%d", i); pushes[k] != 1 {
			t.Errorf("%d lock-lost pushes for %s; want 1 (all: %d pushes for %d locks)", pushes[k], k, len(pushes), n)
		}
	}
}
