package transparent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// held is a lock a Go library obtained.
type held interface {
	value() string // what the library stored in the key
	extend(ctx context.Context, ttl time.Duration) error
	release(ctx context.Context) error
}

// goLib drives one unmodified Go lock library through its own API.
type goLib struct {
	name string
	// obtain tries once: ok is false, with a nil error, when another
	// holder has the lock.
	obtain func(ctx context.Context, c *redis.Client, key string, ttl time.Duration) (h held, ok bool, err error)
}

// The seed's pattern: SET key token NX PX ttl, and compare-and-delete /
// compare-and-expire scripts run through go-redis's Script (EVALSHA, then
// EVAL on NOSCRIPT).
var (
	seedRelease = redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`)
	seedExtend  = redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("pexpire", KEYS[1], ARGV[2]) else return 0 end`)
)

type seedLock struct {
	c          *redis.Client
	key, token string
}

func (l *seedLock) value() string { return l.token }

func (l *seedLock) extend(ctx context.Context, ttl time.Duration) error {
	n, err := seedExtend.Run(ctx, l.c, []string{l.key}, l.token, ttl.Milliseconds()).Int64()
	if err == nil && n != 1 {
		err = errors.New("seed: extend: not held")
	}
	return err
}

func (l *seedLock) release(ctx context.Context) error {
	n, err := seedRelease.Run(ctx, l.c, []string{l.key}, l.token).Int64()
	if err == nil && n != 1 {
		err = errors.New("seed: release: not held")
	}
	return err
}

type bsmLock struct{ l *redislock.Lock }

func (l bsmLock) value() string { return l.l.Token() }
func (l bsmLock) extend(ctx context.Context, ttl time.Duration) error {
	return l.l.Refresh(ctx, ttl, nil)
}
func (l bsmLock) release(ctx context.Context) error { return l.l.Release(ctx) }

type redsyncLock struct{ m *redsync.Mutex }

func (l redsyncLock) value() string { return l.m.Value() }
func (l redsyncLock) extend(ctx context.Context, ttl time.Duration) error {
	ok, err := l.m.ExtendContext(ctx)
	if err == nil && !ok {
		err = errors.New("redsync: extend failed")
	}
	return err
}
func (l redsyncLock) release(ctx context.Context) error {
	ok, err := l.m.UnlockContext(ctx)
	if err == nil && !ok {
		err = errors.New("redsync: unlock failed")
	}
	return err
}

var goLibs = []goLib{
	{"seed-go-redis", func(ctx context.Context, c *redis.Client, key string, ttl time.Duration) (held, bool, error) {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		token := hex.EncodeToString(b)
		ok, err := c.SetNX(ctx, key, token, ttl).Result()
		if err != nil || !ok {
			return nil, false, err
		}
		return &seedLock{c, key, token}, true, nil
	}},
	{"bsm-redislock", func(ctx context.Context, c *redis.Client, key string, ttl time.Duration) (held, bool, error) {
		l, err := redislock.New(c).Obtain(ctx, key, ttl, nil)
		if errors.Is(err, redislock.ErrNotObtained) {
			return nil, false, nil
		}
		if err != nil {
			return nil, false, err
		}
		return bsmLock{l}, true, nil
	}},
	{"redsync-one-pool", func(ctx context.Context, c *redis.Client, key string, ttl time.Duration) (held, bool, error) {
		rs := redsync.New(redsyncgoredis.NewPool(c))
		m := rs.NewMutex(key, redsync.WithExpiry(ttl), redsync.WithTries(1))
		err := m.LockContext(ctx)
		var taken *redsync.ErrTaken
		if errors.Is(err, redsync.ErrFailed) || errors.As(err, &taken) {
			return nil, false, nil
		}
		if err != nil {
			return nil, false, err
		}
		return redsyncLock{m}, true, nil
	}},
}

// TestGoLibraries runs each Go lock library's normal workflow through
// lockproxy in transparent mode, unmodified: acquire, contention, extend,
// release, expiry, a shared counter under the lock, one node killed, then
// a majority down.
func TestGoLibraries(t *testing.T) {
	for _, lib := range goLibs {
		t.Run(lib.name, func(t *testing.T) {
			t.Parallel()
			e := start(t)
			a, b := e.client(t), e.client(t)
			ctx := lockclient.CtxFor(t, 60*time.Second)
			key := "lock:" + lib.name

			h := mustObtain(t, lib, a, key, 5*time.Second)
			e.requireHeld(t, "after acquire", key, h.value())
			if _, ok, err := lib.obtain(ctx, b, key, 5*time.Second); ok || err != nil {
				t.Fatalf("second holder: obtain = %v, %v; want not obtained", ok, err)
			}
			if err := h.extend(ctx, 8*time.Second); err != nil {
				t.Fatalf("extend: %v", err)
			}
			// redsync extends by its own expiry; the others to 8 s.
			if ttl, err := a.PTTL(ctx, key).Result(); err != nil || ttl <= 4*time.Second {
				t.Fatalf("PTTL after extend = %v, %v; want more than 4 s", ttl, err)
			}
			if v, err := a.Get(ctx, key).Result(); err != nil || v != h.value() {
				t.Fatalf("GET while held = %q, %v; want the holder's value", v, err)
			}
			if err := h.release(ctx); err != nil {
				t.Fatalf("release: %v", err)
			}
			e.requireGone(t, "after release", key)
			if n, err := a.Exists(ctx, key).Result(); err != nil || n != 0 {
				t.Fatalf("EXISTS after release = %d, %v; want 0", n, err)
			}

			// Expiry: a holder that never releases loses the lock at its TTL.
			mustObtain(t, lib, a, key, 300*time.Millisecond)
			time.Sleep(600 * time.Millisecond)
			h = mustObtain(t, lib, b, key, 5*time.Second)
			if err := h.release(ctx); err != nil {
				t.Fatalf("release after expiry: %v", err)
			}

			countUnderLock(t, lib, e, key+":counter", 4, 8)

			// One node killed: the library keeps working.
			e.nodes[0].Kill()
			h = mustObtain(t, lib, a, key, 5*time.Second)
			e.requireHeld(t, "one node down", key, h.value())
			if err := h.extend(ctx, 5*time.Second); err != nil {
				t.Fatalf("extend with one node down: %v", err)
			}
			if err := h.release(ctx); err != nil {
				t.Fatalf("release with one node down: %v", err)
			}
			e.requireGone(t, "release with one node down", key)

			// A majority down: an error, never a false success.
			e.nodes[1].Kill()
			if _, ok, err := lib.obtain(ctx, a, key, 5*time.Second); ok || err == nil {
				t.Fatalf("obtain with a majority down = %v, %v; want an error", ok, err)
			}
			e.requireGone(t, "failed obtain with a majority down", key)
		})
	}
}

// mustObtain obtains key, retrying while another holder has it (up to 10 s).
func mustObtain(t *testing.T, lib goLib, c *redis.Client, key string, ttl time.Duration) held {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		h, ok, err := lib.obtain(ctx, c, key, ttl)
		cancel()
		if err != nil {
			t.Fatalf("%s: obtain %q: %v", lib.name, key, err)
		}
		if ok {
			return h
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: obtain %q: still held by another after 10 s", lib.name, key)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// countUnderLock has workers increment a shared counter iters times each,
// every increment a read, a pause and a write under the lock. Any overlap
// of two holders would lose an increment and is also caught directly.
func countUnderLock(t *testing.T, lib goLib, e *env, key string, workers, iters int) {
	t.Helper()
	var counter, inside, overlaps atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		c := e.client(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < iters; i++ {
				h := mustObtainQuiet(lib, c, key)
				if h == nil {
					errs <- errors.New("could not obtain the lock within 20 s")
					return
				}
				if inside.Add(1) > 1 {
					overlaps.Add(1)
				}
				v := counter.Load()
				time.Sleep(time.Millisecond)
				counter.Store(v + 1)
				inside.Add(-1)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				err := h.release(ctx)
				cancel()
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("%s: counter worker: %v", lib.name, err)
	}
	if got, want := counter.Load(), int64(workers*iters); got != want || overlaps.Load() != 0 {
		t.Fatalf("%s: counter = %d with %d overlaps; want %d and none", lib.name, got, overlaps.Load(), want)
	}
}

// mustObtainQuiet is mustObtain for worker goroutines: nil on failure.
func mustObtainQuiet(lib goLib, c *redis.Client, key string) held {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		h, ok, err := lib.obtain(ctx, c, key, 5*time.Second)
		cancel()
		if err == nil && ok {
			return h
		}
		time.Sleep(2 * time.Millisecond)
	}
	return nil
}
