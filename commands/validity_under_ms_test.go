package commands

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/relay"
)

// leastValidityBackend grants and renews with the least validity a backend
// may answer (backends.Lease.Validity: at least 1 ms; less is refused, or
// a renewal answers 0), as RedLock, PostgreSQL and ZooKeeper do for a
// lease the time spent left just 1 ms of.
type leastValidityBackend struct{ fakeBackend }

const leastValidity = time.Millisecond

func (b *leastValidityBackend) Lock(ctx context.Context, req backends.LockRequest) (backends.Lease, error) {
	return backends.Lease{Token: req.Token, Validity: leastValidity, Fence: 1, Holds: 1}, nil
}

func (b *leastValidityBackend) Renew(ctx context.Context, key, token string, ttl time.Duration) (time.Duration, error) {
	return leastValidity, nil
}

// TestValidityUnderOneMs: replies give validities in whole milliseconds.
// Backends answer no validity under 1 ms (a grant that would leave less is
// refused, such a renewal answers 0), so the least one a client sees is 1:
// LOCK never answers a grant with validity_ms 0, and RENEW answers 0 only
// for a lock no longer held. The least validity a backend answers must so
// reach the client as 1, not be rounded or cut down to 0.
func TestValidityUnderOneMs(t *testing.T) {
	for _, tc := range []struct {
		cmd  []string
		want string // in the reply
	}{
		{[]string{"LOCK", "k", "PX", "10", "TOKEN", "t"}, "validity_ms\r\n:1\r\n"},
		{[]string{"RENEW", "k", "t", "PX", "10"}, ":1\r\n"},
	} {
		t.Run(tc.cmd[0], func(t *testing.T) {
			conn := dialHandler(t, &leastValidityBackend{})
			defer conn.Close()
			var cmd [][]byte
			for _, a := range tc.cmd {
				cmd = append(cmd, []byte(a))
			}
			if _, err := conn.Write(relay.AppendCommand(nil, cmd)); err != nil {
				t.Fatal(err)
			}
			if reply := string(readFrames(t, conn, 1)[0]); !strings.Contains(reply, tc.want) {
				t.Errorf("%s with a validity of %v answered %q; want %q in it", strings.Join(tc.cmd, " "), leastValidity, reply, tc.want)
			}
		})
	}
}
