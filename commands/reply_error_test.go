package commands

import (
	"context"
	"fmt"
	"testing"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/resp"
)

// errLockBackend is a fakeBackend whose Lock fails with err.
type errLockBackend struct {
	fakeBackend
	err error
}

func (b *errLockBackend) Lock(ctx context.Context, req backends.LockRequest) (backends.Lease, error) {
	return backends.Lease{}, b.err
}

// TestLockErrorReplies: a backend's error reaches the client as the one
// error reply that names its cause, wrapped or not; only an unforeseen
// one is an internal error.
func TestLockErrorReplies(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"too large", fmt.Errorf("zookeeper: too long: %w", backends.ErrTooLarge), "ERR key or token too long for the lock store"},
		{"deadline", fmt.Errorf("node: %w", context.DeadlineExceeded), "ERR timed out waiting for the lock nodes"},
		{"unforeseen", fmt.Errorf("something broke"), "ERR internal error in 'lock'; see the server log"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHandler(Options{Limits: testLimits, Backend: &errLockBackend{err: tc.err}})
			defer h.Close()
			s := &resp.Session{W: resp.NewWriter()}
			h.ServeRESP(s, words("LOCK k PX 1000"))
			if got := string(s.W.Bytes()); got != "-"+tc.want+"\r\n" {
				t.Errorf("LOCK answered %q; want -%s", got, tc.want)
			}
		})
	}
}
