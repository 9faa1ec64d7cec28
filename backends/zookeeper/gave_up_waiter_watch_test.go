package zookeeper

import (
	"errors"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/lockproxy/lockproxy/backends"
)

// clientWatches is how many watch channels go-zookeeper keeps for b's
// session (its unexported Conn.watchers, read under its lock): one per
// GetW whose watch has not fired yet. They live until their node changes.
func clientWatches(t *testing.T, b *Backend) int {
	t.Helper()
	v := reflect.ValueOf(b.conn).Elem()
	mu := (*sync.Mutex)(unsafe.Pointer(v.FieldByName("watchersLock").UnsafeAddr()))
	mu.Lock()
	defer mu.Unlock()
	n := 0
	for it := v.FieldByName("watchers").MapRange(); it.Next(); {
		n += it.Value().Len()
	}
	return n
}

// TestGaveUpWaitersLeaveNoWatch: clients that poll a held key with a short
// WAIT (each LOCK queues, watches its blocker, gives up and deletes its
// node) must not leave a watch each behind in the instance. The blocker
// they watch may not change for as long as it is held: a writer's gate
// never changes, nor does a waiting writer's node. go-zookeeper keeps one
// channel per GetW until the node changes, so every poll that gave up
// stays in the instance's memory (and is handed the event when it finally
// comes) for the whole hold: with a KEEPALIVE holder and clients polling
// every 100 ms, hundreds of thousands a day.
func TestGaveUpWaitersLeaveNoWatch(t *testing.T) {
	root := testRoot(t)
	a := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	b := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	const polls = 40
	for _, tc := range []struct {
		name string
		mode backends.Mode // of the polling LOCKs
		// setup makes the key held, and waited for through b, so that the
		// polls wait for a node that does not change.
		setup func(t *testing.T, key string) (cleanup func())
	}{
		{"readers behind a write holder's gate", backends.Read, func(t *testing.T, key string) func() {
			mustLock(t, b, key, "H", 60*time.Second, backends.Write)
			return func() { unlock(t, b, key, "H") }
		}},
		{"writers behind a waiting writer", backends.Write, func(t *testing.T, key string) func() {
			mustLock(t, b, key, "H", 60*time.Second, backends.Write)
			done := make(chan struct{})
			go func() {
				defer close(done)
				if _, err := lock(t, b, key, "W", 60*time.Second, 50*time.Second, backends.Write); err == nil {
					b.Unlock(ctxT(t, 10*time.Second), key, "W")
				}
			}()
			waitFor(t, "W queued", func() bool { return b.Waiting() == 1 })
			return func() { unlock(t, b, key, "H"); <-done }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "poll-" + strings.ReplaceAll(tc.name, " ", "-")
			cleanup := tc.setup(t, key)
			defer cleanup()
			before := clientWatches(t, a)
			for i := range polls {
				_, err := lock(t, a, key, "P"+strconv.Itoa(i), 10*time.Second, 30*time.Millisecond, tc.mode)
				if !errors.Is(err, backends.ErrNotAcquired) {
					t.Fatalf("poll %d = %v; want ErrNotAcquired", i, err)
				}
			}
			if a.Waiting() != 0 {
				t.Fatalf("%d LOCKs still waiting through a", a.Waiting())
			}
			if after := clientWatches(t, a); after-before > 1 {
				t.Errorf("%d polls that gave up, none waiting: %d watches kept by the instance (%d before); want none per poll",
					polls, after, before)
			}
		})
	}
}
