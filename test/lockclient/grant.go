package lockclient

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Doer is what *redis.Client and *redis.Conn have in common for the
// helpers.
type Doer interface {
	Do(ctx context.Context, args ...any) *redis.Cmd
}

// Grant is a parsed LOCK or RLOCK reply.
type Grant struct {
	Token      string
	ValidityMS int64
	Fence      int64
}

// ParseGrant reads a LOCK or RLOCK reply as go-redis returns it: a flat
// array under RESP2, a map under RESP3, with exactly token (a non-empty
// string), validity_ms and fence (integers).
func ParseGrant(v any) (Grant, error) {
	fields := map[string]any{}
	switch r := v.(type) {
	case []any:
		if len(r)%2 != 0 {
			return Grant{}, fmt.Errorf("odd-length array reply %v", r)
		}
		for i := 0; i < len(r); i += 2 {
			k, ok := r[i].(string)
			if !ok {
				return Grant{}, fmt.Errorf("array reply key %v is %T, not a string", r[i], r[i])
			}
			fields[k] = r[i+1]
		}
	case map[any]any:
		for k, val := range r {
			ks, ok := k.(string)
			if !ok {
				return Grant{}, fmt.Errorf("map reply key %v is %T, not a string", k, k)
			}
			fields[ks] = val
		}
	default:
		return Grant{}, fmt.Errorf("reply %v is %T, want an array or a map", v, v)
	}
	if len(fields) != 3 {
		return Grant{}, fmt.Errorf("reply %v has %d fields, want token, validity_ms, fence", v, len(fields))
	}
	var g Grant
	var ok bool
	if g.Token, ok = fields["token"].(string); !ok || g.Token == "" {
		return Grant{}, fmt.Errorf("token = %#v, want a non-empty string", fields["token"])
	}
	if g.ValidityMS, ok = fields["validity_ms"].(int64); !ok {
		return Grant{}, fmt.Errorf("validity_ms = %#v, want an integer", fields["validity_ms"])
	}
	if g.Fence, ok = fields["fence"].(int64); !ok {
		return Grant{}, fmt.Errorf("fence = %#v, want an integer", fields["fence"])
	}
	return g, nil
}

// TryAcquire sends cmd (LOCK or RLOCK) key opts... It returns the grant
// and true, false for a nil reply, or the error reply (or a reply that is
// not a grant).
func TryAcquire(ctx context.Context, c Doer, cmd, key string, opts ...any) (Grant, bool, error) {
	args := append([]any{cmd, key}, opts...)
	v, err := c.Do(ctx, args...).Result()
	if errors.Is(err, redis.Nil) {
		return Grant{}, false, nil
	}
	if err != nil {
		return Grant{}, false, err
	}
	g, err := ParseGrant(v)
	if err != nil {
		return Grant{}, false, fmt.Errorf("%s %q %v: %w", cmd, key, opts, err)
	}
	return g, true, nil
}

// TryLock is TryAcquire of LOCK.
func TryLock(ctx context.Context, c Doer, key string, opts ...any) (Grant, bool, error) {
	return TryAcquire(ctx, c, "LOCK", key, opts...)
}

// Acquire sends cmd (LOCK or RLOCK) key opts..., waiting up to
// cf.AcquireTimeout, and fails the test on an error reply. false is a nil
// reply.
func (cf Config) Acquire(t testing.TB, c Doer, cmd, key string, opts ...any) (Grant, bool) {
	t.Helper()
	g, ok, err := TryAcquire(CtxFor(t, cf.AcquireTimeout), c, cmd, key, opts...)
	if err != nil {
		t.Fatalf("%s %q %v: %v", cmd, key, opts, err)
	}
	return g, ok
}

// MustAcquire is Acquire that also fails the test when the lock is not
// granted.
func (cf Config) MustAcquire(t testing.TB, c Doer, cmd, key string, opts ...any) Grant {
	t.Helper()
	g, ok := cf.Acquire(t, c, cmd, key, opts...)
	if !ok {
		t.Fatalf("%s %q %v = nil; want a grant", cmd, key, opts)
	}
	return g
}

// Lock is Acquire of LOCK.
func (cf Config) Lock(t testing.TB, c Doer, key string, opts ...any) (Grant, bool) {
	t.Helper()
	return cf.Acquire(t, c, "LOCK", key, opts...)
}

// RLock is Acquire of RLOCK.
func (cf Config) RLock(t testing.TB, c Doer, key string, opts ...any) (Grant, bool) {
	t.Helper()
	return cf.Acquire(t, c, "RLOCK", key, opts...)
}

// MustLock is MustAcquire of LOCK.
func (cf Config) MustLock(t testing.TB, c Doer, key string, opts ...any) Grant {
	t.Helper()
	return cf.MustAcquire(t, c, "LOCK", key, opts...)
}

// MustRLock is MustAcquire of RLOCK.
func (cf Config) MustRLock(t testing.TB, c Doer, key string, opts ...any) Grant {
	t.Helper()
	return cf.MustAcquire(t, c, "RLOCK", key, opts...)
}

// Refused checks that cmd key opts... answers nil (held by someone else).
func (cf Config) Refused(t testing.TB, c Doer, cmd, key string, opts ...any) {
	t.Helper()
	g, ok, err := TryAcquire(CtxFor(t, cf.AcquireTimeout), c, cmd, key, opts...)
	if err != nil {
		t.Fatalf("%s %q %v: %v; want nil", cmd, key, opts, err)
	}
	if ok {
		t.Fatalf("%s %q %v = %+v; want nil (held by another)", cmd, key, opts, g)
	}
}

// IntCmd sends a command answered with an integer, waiting up to
// cf.CommandTimeout, and fails the test on anything else.
func (cf Config) IntCmd(t testing.TB, c Doer, args ...any) int64 {
	t.Helper()
	n, err := c.Do(CtxFor(t, cf.CommandTimeout), args...).Int64()
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return n
}

// Unlock sends UNLOCK key token and returns its integer reply.
func (cf Config) Unlock(t testing.TB, c Doer, key, token string) int64 {
	t.Helper()
	return cf.IntCmd(t, c, "UNLOCK", key, token)
}
