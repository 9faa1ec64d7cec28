package zookeeper

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// TestOversizedKeyRefusedWithoutDroppingSession: a key (or token) whose
// requests would be longer than a ZooKeeper server accepts (jute.maxbuffer,
// 1 MiB by default) is refused before anything is sent. The server closes
// the connection of a client that sends such a packet, which fails every
// request in flight on the instance's one session, other clients' too:
// before, one LOCK of a 420 KiB key (limits.max_key_bytes raised; a write
// lock's create names the key's directory twice, base64 makes it a third
// longer) answered NOQUORUM connection lost, and every command after it
// NOQUORUM disconnected until the instance reconnected; an UNLOCK, RENEW or
// LOCKINFO of a 900 KiB key did the same with its one path.
func TestOversizedKeyRefusedWithoutDroppingSession(t *testing.T) {
	root := testRoot(t)
	a := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	mustLock(t, a, "other", "O", 30*time.Second, backends.Write)
	waiter := make(chan error, 1)
	go func() {
		_, err := a.Lock(context.Background(), backends.LockRequest{Key: "other", Token: "W", TTL: time.Second, Wait: 4 * time.Second})
		waiter <- err
	}()
	waitFor(t, "the other key's waiter queued", func() bool { return a.Waiting() == 1 })

	big := strings.Repeat("x", 420<<10)
	huge := strings.Repeat("y", 900<<10)
	for _, tc := range []struct {
		name string
		op   func(ctx context.Context) error
		ok   func(err error) bool // the answer wanted
	}{
		{"LOCK 420 KiB key", func(ctx context.Context) error {
			_, err := a.Lock(ctx, backends.LockRequest{Key: big, Token: "A", TTL: 5 * time.Second})
			return err
		}, func(err error) bool { return errors.Is(err, errTooLarge) }},
		{"RLOCK 420 KiB key", func(ctx context.Context) error {
			_, err := a.Lock(ctx, backends.LockRequest{Key: big, Token: "A", TTL: 5 * time.Second, Mode: backends.Read})
			return err
		}, func(err error) bool { return errors.Is(err, errTooLarge) }},
		{"LOCK 1 MiB token", func(ctx context.Context) error {
			_, err := a.Lock(ctx, backends.LockRequest{Key: "k", Token: strings.Repeat("t", 1<<20), TTL: 5 * time.Second})
			return err
		}, func(err error) bool { return errors.Is(err, errTooLarge) }},
		{"UNLOCK 900 KiB key", func(ctx context.Context) error {
			ok, err := a.Unlock(ctx, huge, "A")
			if ok {
				return errors.New("released")
			}
			return err
		}, func(err error) bool { return err == nil }},
		{"RENEW 900 KiB key", func(ctx context.Context) error {
			v, err := a.Renew(ctx, huge, "A", time.Second)
			if v != 0 {
				return errors.New("renewed")
			}
			return err
		}, func(err error) bool { return err == nil }},
		{"LOCKINFO 900 KiB key", func(ctx context.Context) error {
			_, held, err := a.Info(ctx, huge)
			if held {
				return errors.New("held")
			}
			return err
		}, func(err error) bool { return err == nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.op(ctxT(t, 10*time.Second)); !tc.ok(err) {
				t.Errorf("%s = %v", tc.name, err)
			}
			if !a.connected.Load() {
				t.Errorf("%s dropped the session's connection", tc.name)
			}
		})
	}
	select {
	case err := <-waiter:
		if !errors.Is(err, backends.ErrNotAcquired) {
			t.Errorf("another client's LOCK … WAIT = %v; want ErrNotAcquired (its WAIT ran out), not %v", err, quorum.ErrNoQuorum)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("another client's LOCK … WAIT still waiting")
	}
	// The instance still grants the usual keys.
	mustLock(t, a, "after", "A", time.Second, backends.Write)
}
