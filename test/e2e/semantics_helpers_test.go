package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// Helpers of the lock-semantics tests (reentrancy, RLOCK, LOCKINFO,
// writer preference, commands per grant).

// lockInfo is a parsed LOCKINFO reply.
type lockInfo struct {
	Mode    string
	Holders []holderInfo
	TTLMS   int64
	Fence   int64
	Waiters int64
}

type holderInfo struct {
	Token string
	Holds int64
	TTLMS int64
}

// holder returns the holder shown as token, or false.
func (li lockInfo) holder(token string) (holderInfo, bool) {
	for _, h := range li.Holders {
		if h.Token == token {
			return h, true
		}
	}
	return holderInfo{}, false
}

// replyFields reads a map reply as go-redis returns it (a flat array
// under RESP2, a map under RESP3) and checks that it has exactly the keys
// want.
func replyFields(v any, want ...string) (map[string]any, error) {
	fields := map[string]any{}
	switch r := v.(type) {
	case []any:
		if len(r)%2 != 0 {
			return nil, fmt.Errorf("odd-length array %v", r)
		}
		for i := 0; i < len(r); i += 2 {
			k, ok := r[i].(string)
			if !ok {
				return nil, fmt.Errorf("array key %v is %T, not a string", r[i], r[i])
			}
			fields[k] = r[i+1]
		}
	case map[any]any:
		for k, val := range r {
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("map key %v is %T, not a string", k, k)
			}
			fields[ks] = val
		}
	default:
		return nil, fmt.Errorf("%v is %T, want an array or a map", v, v)
	}
	if len(fields) != len(want) {
		return nil, fmt.Errorf("%v has %d fields, want %v", v, len(fields), want)
	}
	for _, k := range want {
		if _, ok := fields[k]; !ok {
			return nil, fmt.Errorf("%v has no field %q", v, k)
		}
	}
	return fields, nil
}

// parseLockInfo reads a LOCKINFO reply as go-redis returns it.
func parseLockInfo(v any) (lockInfo, error) {
	f, err := replyFields(v, "mode", "holders", "ttl_ms", "fence", "waiters")
	if err != nil {
		return lockInfo{}, err
	}
	var li lockInfo
	var ok bool
	if li.Mode, ok = f["mode"].(string); !ok {
		return li, fmt.Errorf("mode = %#v, want a string", f["mode"])
	}
	for name, dst := range map[string]*int64{"ttl_ms": &li.TTLMS, "fence": &li.Fence, "waiters": &li.Waiters} {
		if *dst, ok = f[name].(int64); !ok {
			return li, fmt.Errorf("%s = %#v, want an integer", name, f[name])
		}
	}
	hs, ok := f["holders"].([]any)
	if !ok {
		return li, fmt.Errorf("holders = %#v, want an array", f["holders"])
	}
	for _, h := range hs {
		hf, err := replyFields(h, "token", "holds", "ttl_ms")
		if err != nil {
			return li, fmt.Errorf("holder: %w", err)
		}
		var hi holderInfo
		if hi.Token, ok = hf["token"].(string); !ok {
			return li, fmt.Errorf("holder token = %#v, want a string", hf["token"])
		}
		if hi.Holds, ok = hf["holds"].(int64); !ok {
			return li, fmt.Errorf("holder holds = %#v, want an integer", hf["holds"])
		}
		if hi.TTLMS, ok = hf["ttl_ms"].(int64); !ok {
			return li, fmt.Errorf("holder ttl_ms = %#v, want an integer", hf["ttl_ms"])
		}
		li.Holders = append(li.Holders, hi)
	}
	return li, nil
}

// lockInfoOf sends LOCKINFO key (with TOKEN token unless token is empty);
// false when the reply is nil (free).
func lockInfoOf(t *testing.T, c lockclient.Doer, key, token string) (lockInfo, bool) {
	t.Helper()
	args := []any{"LOCKINFO", key}
	if token != "" {
		args = append(args, "TOKEN", token)
	}
	v, err := c.Do(lockclient.CtxFor(t, 10*time.Second), args...).Result()
	if errors.Is(err, redis.Nil) {
		return lockInfo{}, false
	}
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	li, err := parseLockInfo(v)
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return li, true
}

// mustLockInfo is lockInfoOf that fails the test when the key is free.
func mustLockInfo(t *testing.T, c lockclient.Doer, key, token string) lockInfo {
	t.Helper()
	li, ok := lockInfoOf(t, c, key, token)
	if !ok {
		t.Fatalf("LOCKINFO %q = nil; want the lock's state", key)
	}
	return li
}

// hiddenToken is how LOCKINFO shows a token to a caller that did not name
// it: "sha256:" and the first 8 bytes of its SHA-256, in hex.
func hiddenToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// nodePTTLs reads the PTTL of key's lock key on every node, in ms (-2
// when absent).
func (c *cluster) nodePTTLs(t *testing.T, key string) []int64 {
	t.Helper()
	out := make([]int64, len(c.clients))
	for i, nc := range c.clients {
		d, err := nc.PTTL(lockclient.CtxFor(t, 5*time.Second), keyPrefix+"lock:"+key).Result()
		if err != nil {
			t.Fatalf("node %d: PTTL: %v", i, err)
		}
		out[i] = int64(d / time.Millisecond)
		if d < 0 {
			out[i] = int64(d)
		}
	}
	return out
}

// nodeExpiries is when key's lock key expires on each node, counted from
// just before that node's PTTL read: no later than the node's own expiry
// (the zero time for a key missing or without expiry).
func (c *cluster) nodeExpiries(t *testing.T, key string) []time.Time {
	t.Helper()
	out := make([]time.Time, len(c.clients))
	for i, nc := range c.clients {
		before := time.Now()
		d, err := nc.PTTL(lockclient.CtxFor(t, 5*time.Second), keyPrefix+"lock:"+key).Result()
		if err != nil {
			t.Fatalf("node %d: PTTL: %v", i, err)
		}
		if d >= 0 {
			out[i] = before.Add(d)
		}
	}
	return out
}

// majorityAbove reports whether a majority of xs are > min.
func majorityAbove(xs []int64, min int64) bool {
	n := 0
	for _, x := range xs {
		if x > min {
			n++
		}
	}
	return n >= len(xs)/2+1
}

// checkReadGrant checks the shape of a fresh read grant of a lease of
// ttlMS. Unlike a write grant's, its fence may be 0: it is the key's
// current fence, and a key never written has none.
func checkReadGrant(t *testing.T, what string, g lockclient.Grant, ttlMS int64) {
	t.Helper()
	if g.ValidityMS <= 0 || g.ValidityMS > maxValidityMS(ttlMS) {
		t.Errorf("%s: validity_ms = %d; want in (0, %d]", what, g.ValidityMS, maxValidityMS(ttlMS))
	}
	if g.Fence < 0 || g.Token == "" {
		t.Errorf("%s: fence %d, token %q; want a fence ≥ 0 and a token", what, g.Fence, g.Token)
	}
}

// startSemInstance starts lockproxy in front of c's nodes with a node
// timeout of 1 s (the default is TTL × 0.05 within 10–250 ms): these tests
// check lock semantics, often with short leases, on a shared machine so
// loaded (load average 14 on 2 cores) that all three nodes have been seen
// to take over 250 ms to answer, which turns a grant into -NOQUORUM rather
// than show what the test is about.
func startSemInstance(t *testing.T, c *cluster) *instance {
	t.Helper()
	return startInstanceEnv(t, c.addrs(), []string{
		"LOCKPROXY_REDLOCK_NODE_TIMEOUT_MIN=1s",
		"LOCKPROXY_REDLOCK_NODE_TIMEOUT_MAX=1s",
	})
}
